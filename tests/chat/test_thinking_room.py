"""A forced call or a required JSON answer arrives within ``max_tokens`` on a model that
thinks first, even one that would never close its thinking: the thinking gets a budget
that leaves room for the answer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from mlx_integrations.chat.completion import Finished, stream_chat_events
from mlx_integrations.chat.fields import RequestError
from mlx_integrations.chat.reasoning import reasoning_switch
from mlx_integrations.chat.request import ChatRequest
from mlx_integrations.chat.tool_formats import InvalidToolCall, ParsedToolCall
from mlx_integrations.engine import SimpleEngine
from tests.support.chat_templates import FAMILIES, TEMPLATES_DIR
from tests.support.thinking import (
    EFFORT_TEMPLATE,
    FLAGS_TEMPLATE,
    OPENING_TEMPLATE,
    QWEN3_TEMPLATE,
    build_thinking_model,
    endless_thinker,
)
from tests.support.tiny_models import build_tiny_model

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"],
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather.", "parameters": CITY},
}
ANSWER = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}

THINKING = {
    "qwen3": QWEN3_TEMPLATE,  # the model may open <think> itself
    "opening": OPENING_TEMPLATE,  # the prompt opens it
    "effort": EFFORT_TEMPLATE,
    "flags": FLAGS_TEMPLATE,
}
# The family templates that think (GLM 4.6 opens <think> when thinking is on).
FAMILY_THINKING = ["glm4.6"]


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SimpleEngine]]:
    made = {
        name: SimpleEngine(build_thinking_model(tmp_path_factory.mktemp(name), template))
        for name, template in THINKING.items()
    }
    for family in FAMILY_THINKING:
        fam = FAMILIES[family]
        path = build_tiny_model(
            tmp_path_factory.mktemp(family.replace(".", "_")),
            chat_template=(TEMPLATES_DIR / fam.template).read_text(),
            special_tokens=(*fam.special_tokens, "<think>", "</think>"),
        )
        made[family] = SimpleEngine(path)
    yield made
    for engine in made.values():
        asyncio.run(engine.stop())


def _thinker(engine: SimpleEngine) -> Any:
    # Opens the block first where the prompt leaves it to the model, then never closes it.
    return endless_thinker(engine.tokenizer, open_first=True, ban_eos=False)


async def _turn(engine: SimpleEngine, **fields: Any) -> list[Any]:
    request = ChatRequest.build(USER, **fields)
    return [e async for e in stream_chat_events(engine, request)]


@pytest.mark.parametrize("name", [*THINKING, *FAMILY_THINKING])
async def test_a_forced_call_arrives_though_the_thinking_never_ends(engines, name):
    engine = engines[name]
    assert reasoning_switch(engine.tokenizer).thinks
    for choice in ("get_weather", "required"):
        events = await _turn(
            engine,
            tools=[WEATHER],
            tool_choice=choice,
            max_tokens=96,
            temperature=1.0,
            seed=0,
            logits_processors=[_thinker(engine)],
        )
        calls = [e for e in events if isinstance(e, (ParsedToolCall, InvalidToolCall))]
        finished = events[-1]
        assert isinstance(finished, Finished)
        assert [type(c) for c in calls] == [ParsedToolCall], finished.text
        assert calls[0].name == "get_weather" and calls[0].arguments["city"] in ("Paris", "Rome")
        assert finished.finish_reason == "tool_calls"
        assert finished.completion_tokens <= 96
        assert finished.reasoning_tokens > 0  # it did think, within its budget


@pytest.mark.parametrize("name", [*THINKING, *FAMILY_THINKING])
async def test_a_required_json_answer_arrives_though_the_thinking_never_ends(engines, name):
    engine = engines[name]
    events = await _turn(
        engine,
        response_format=ANSWER,
        max_tokens=64,
        temperature=1.0,
        seed=1,
        logits_processors=[_thinker(engine)],
    )
    finished = events[-1]
    assert finished.finish_reason == "stop", finished.text
    answer = "".join(e.text for e in events if type(e).__name__ == "TextDelta")
    jsonschema.validate(json.loads(answer), CITY)


async def test_a_thinking_budget_larger_than_the_room_is_refused_before_any_work(engines):
    engine = engines["opening"]
    before = engine.get_stats()["num_requests_processed"]
    with pytest.raises(RequestError, match=r"thinking_budget=90 leaves no room") as caught:
        await _turn(
            engine, tools=[WEATHER], tool_choice="required", max_tokens=96, thinking_budget=90
        )
    assert caught.value.path == "thinking_budget"
    assert "lower thinking_budget to" in str(caught.value)
    assert engine.get_stats()["num_requests_processed"] == before
    # A budget within the room is the user's: kept as given.
    events = await _turn(
        engine,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=96,
        thinking_budget=5,
        logits_processors=[_thinker(engine)],
    )
    assert events[-1].reasoning_tokens == 5
    # Free text keeps a budget of any size: nothing is required after the thinking.
    events = await _turn(engine, max_tokens=8, thinking_budget=90)
    assert isinstance(events[-1], Finished)


def test_chatmlx_and_mlxllm_get_their_forced_call(engines):
    from llama_index.core.llms import ChatMessage
    from llama_index.core.tools import FunctionTool

    from mlx_integrations.langchain import ChatMLX
    from mlx_integrations.llama_index import MLXLLM

    engine = engines["qwen3"]
    thinker = [_thinker(engine)]
    llm = ChatMLX(engine=engine, temperature=1.0, seed=3, max_tokens=96)
    message = llm.bind_tools([WEATHER], tool_choice="get_weather").invoke(
        "Weather?", logits_processors=thinker
    )
    assert message.tool_calls[0]["args"]["city"] in ("Paris", "Rome")
    assert message.additional_kwargs.get("reasoning_content")

    def get_weather(city: str) -> str:
        """Weather of a city."""
        return city

    li = MLXLLM(engine=engine, temperature=1.0, seed=3, max_tokens=96)
    response = li.chat_with_tools(
        [FunctionTool.from_defaults(fn=get_weather)],
        chat_history=[ChatMessage(role="user", content="Weather?")],
        tool_required=True,
        logits_processors=[_thinker(engine)],
    )
    assert li.get_tool_calls_from_response(response)[0].tool_name == "get_weather"


async def test_mlxi_serve_gets_its_forced_call_and_schema(engines):
    # Over HTTP no processor keeps the random model thinking: the budget alone bounds it.
    import httpx

    from mlx_integrations.serve import create_app

    app = create_app(engines={"thinker": engines["qwen3"]}, preload=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://serve") as client:
        body = {
            "model": "thinker",
            "messages": USER,
            "max_tokens": 96,
            "temperature": 1.0,
            "seed": 0,
            "chat_template_kwargs": {"enable_thinking": True},
        }
        reply = await client.post(
            "/v1/chat/completions", json={**body, "tools": [WEATHER], "tool_choice": "required"}
        )
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        call = choice["message"]["tool_calls"][0]["function"]
        assert json.loads(call["arguments"])["city"] in ("Paris", "Rome")
        reply = await client.post("/v1/chat/completions", json={**body, "response_format": ANSWER})
        content = reply.json()["choices"][0]["message"]["content"]
        jsonschema.validate(json.loads(content), CITY)
        reply = await client.post(
            "/v1/chat/completions",
            json={**body, "tools": [WEATHER], "tool_choice": "required", "thinking_budget": 95},
        )
        assert reply.status_code == 400
        assert reply.json()["error"]["param"] == "thinking_budget"
