"""MLXLLM and thinking models: ThinkingBlocks, streamed thinking deltas, reasoning in
the history as the template wants it, a thinking budget, and a FunctionAgent that
thinks before each step."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from llama_index.core.agent.workflow import AgentStream, FunctionAgent, ToolCallResult
from llama_index.core.base.llms.types import (
    ChatMessage,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.tools import FunctionTool
from pydantic import BaseModel, Field

from mlx_integrations.llama_index import MLXLLM
from mlx_integrations.llama_index.messages import to_neutral_messages
from tests.support.thinking import (
    OPENING_TEMPLATE,
    QWEN3_TEMPLATE,
    build_thinking_model,
    endless_thinker,
    prompt_recorder,
)


@pytest.fixture(scope="module")
def opening(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_thinking_model(tmp_path_factory.mktemp("li-opening"), OPENING_TEMPLATE)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_thinking_model(tmp_path_factory.mktemp("li-qwen3"), QWEN3_TEMPLATE)


QUESTION = [ChatMessage(role="user", content="Weather in Paris?")]


def test_a_reply_carries_its_thinking_block_and_token_count(opening):
    llm = MLXLLM(model=str(opening), temperature=0, max_tokens=24, thinking_budget=5)
    thinker = endless_thinker(llm.engine.tokenizer)
    response = llm.chat(QUESTION, logits_processors=[thinker])
    thinking, text = response.message.blocks[0], response.message.blocks[1]
    assert isinstance(thinking, ThinkingBlock) and isinstance(text, TextBlock)
    assert thinking.num_tokens == 5 and thinking.content
    assert text.text and response.message.content == text.text  # the answer alone
    assert response.raw["usage"]["reasoning_tokens"] == 5


def test_thinking_streams_as_thinking_delta(opening):
    llm = MLXLLM(model=str(opening), temperature=0, max_tokens=24, thinking_budget=6)
    thinker = endless_thinker(llm.engine.tokenizer)
    responses = list(llm.stream_chat(QUESTION, logits_processors=[thinker]))
    deltas = [r.additional_kwargs.get("thinking_delta") for r in responses]
    thought = "".join(d for d in deltas if d)
    last = responses[-1].message.blocks[0]
    assert isinstance(last, ThinkingBlock) and thought == last.content
    # The thinking comes first, then the answer's text deltas, never mixed.
    first_text = next(i for i, r in enumerate(responses) if r.delta)
    assert all(not d for d in deltas[first_text:])


def test_reasoning_effort_goes_to_the_templates_own_switch(qwen3):
    llm = MLXLLM(model=str(qwen3), max_tokens=1, reasoning_effort="none")

    def prompt(**kwargs: object) -> str:
        recorder, seen = prompt_recorder()
        llm.chat(QUESTION, logits_processors=[recorder], **kwargs)
        return llm.engine.tokenizer.decode(seen[0])

    assert prompt().endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # off
    assert prompt(reasoning_effort="high").endswith("<|im_start|>assistant\n")  # on
    with pytest.raises(ValueError, match="takes reasoning_effort 'none', 'high', not 'low'"):
        llm.chat(QUESTION, reasoning_effort="low")


def test_reasoning_in_the_history_is_kept_or_dropped_as_the_template_wants(qwen3, tiny_plain):
    earlier = ChatMessage(
        role="assistant", blocks=[ThinkingBlock(content="Check it."), TextBlock(text="Sunny.")]
    )
    neutral = to_neutral_messages([*QUESTION, earlier])
    assert neutral[1]["reasoning_content"] == "Check it."
    # Qwen3's template shows the thinking of the turns since the last question...
    kept = MLXLLM(model=str(qwen3)).engine.render_prompt(neutral)
    assert "<think>\nCheck it.\n</think>\n\nSunny." in kept
    # ...a template that knows no reasoning leaves it out.
    dropped = MLXLLM(model=str(tiny_plain)).engine.render_prompt(neutral)
    assert "Check it." not in dropped and "Sunny." in dropped


def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return f"It is 21 degrees and sunny in {city}."


def test_function_agent_thinks_then_calls_then_answers(opening):
    """Every step opens with thinking (the template opens the block); the budget closes
    it, the first step's call is forced, and the thinking streams as AgentStream events."""
    llm = MLXLLM(model=str(opening), temperature=0, max_tokens=40, thinking_budget=6)
    agent = FunctionAgent(
        tools=[FunctionTool.from_defaults(get_weather)], llm=llm, initial_tool_choice="required"
    )

    async def run() -> tuple[list[str], list[ToolCallResult], object]:
        handler = agent.run(user_msg="What is the weather in Paris?")
        thoughts, results = [], []
        async for event in handler.stream_events():
            if isinstance(event, AgentStream) and event.thinking_delta:
                thoughts.append(event.thinking_delta)
            elif isinstance(event, ToolCallResult):
                results.append(event)
        return thoughts, results, await handler

    thoughts, results, output = asyncio.run(run())
    assert thoughts  # the thinking reached the agent's stream
    assert results and results[0].tool_name == "get_weather"
    assert "21 degrees" in results[0].tool_output.content
    final = output.response  # type: ignore[attr-defined]
    assert not any(isinstance(b, ToolCallBlock) for b in final.blocks)
    assert isinstance(final.blocks[0], ThinkingBlock) and final.blocks[0].num_tokens == 6


class Pick(BaseModel):
    color: str = Field(pattern="^(red|blue)$")
    count: int = Field(ge=0, le=9)


def test_as_structured_llm_streams_partial_objects(tiny_llama):
    llm = MLXLLM(model=str(tiny_llama), temperature=0, max_tokens=40)
    sllm = llm.as_structured_llm(Pick)
    responses = list(sllm.stream_chat([ChatMessage(role="user", content="Pick one.")]))
    assert len(responses) > 2  # partial objects as the JSON grows, not just the last one
    assert isinstance(responses[-1].raw, Pick)
    assert responses[0].raw.model_dump(exclude_none=True) != responses[-1].raw.model_dump()
