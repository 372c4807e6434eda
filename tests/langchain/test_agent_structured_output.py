"""create_agent with a response_format takes the native path (ProviderStrategy): the
answer is constrained to the schema; with tools as well, each step may call a tool
(in the model's own layout) or give the answer."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from langchain.agents import create_agent
from langchain.agents.factory import _supports_provider_strategy
from langchain.agents.middleware import AgentMiddleware, ModelRequest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel, Field

from mlx_integrations.langchain import ChatMLX


class Weather(BaseModel):
    """The weather in a city."""

    city: Literal["Paris", "Lyon"]
    degrees: int = Field(ge=-90, le=60)


@tool
def get_weather(city: Literal["Paris", "Lyon"]) -> str:
    """Get the current weather for a city."""
    return f"It is 21 degrees and sunny in {city}."


QUESTION = {"messages": [("human", "What is the weather in Paris?")]}


def call_marker_bias(llm: ChatMLX, bias: float) -> Any:
    """A processor that moves the first token of the reply towards (or away from) the
    tool-call marker; the grammar decides the rest."""
    import mlx.core as mx

    marker = llm.engine.tokenizer.convert_tokens_to_ids("<tool_call>")
    state: dict[str, int | None] = {"prompt": None}

    def processor(tokens: Any, logits: Any) -> Any:
        if state["prompt"] is None:
            state["prompt"] = tokens.size
        if tokens.size != state["prompt"]:
            return logits
        shift = mx.zeros(logits.shape)
        shift[..., marker] = bias
        return logits + shift

    return processor


class CallFirst(AgentMiddleware):
    """Steers a random model: towards a tool call until a result is there, then away."""

    def __init__(self, llm: ChatMLX) -> None:
        super().__init__()
        self.llm = llm

    def wrap_model_call(self, request: ModelRequest, handler: Any) -> Any:
        answered = any(isinstance(m, ToolMessage) for m in request.messages)
        processor = call_marker_bias(self.llm, -1e9 if answered else 1e9)
        # One call a step: a random model would go on calling to max_tokens.
        settings = {
            **request.model_settings,
            "logits_processors": [processor],
            "parallel_tool_calls": False,
        }
        return handler(request.override(model_settings=settings))


@pytest.fixture(scope="module")
def tiny(tiny_llama) -> ChatMLX:
    return ChatMLX(model=str(tiny_llama), temperature=0, max_tokens=60)


def test_tools_and_a_schema_together_leave_the_model_both(tiny):
    schema = Weather.model_json_schema()
    bound = tiny.bind_tools(
        [get_weather],
        parallel_tool_calls=False,
        response_format={"type": "json_schema", "json_schema": {"schema": schema}},
    )
    call = bound.invoke("Weather in Paris?", logits_processors=[call_marker_bias(tiny, 1e9)])
    assert [c["name"] for c in call.tool_calls] == ["get_weather"]
    assert call.tool_calls[0]["args"]["city"] in ("Paris", "Lyon")  # the tool's schema
    answer = bound.invoke("Weather in Paris?", logits_processors=[call_marker_bias(tiny, -1e9)])
    assert answer.tool_calls == []
    Weather.model_validate_json(answer.content)


def test_an_agent_with_tools_and_a_schema_calls_a_tool_then_answers(tiny):
    assert _supports_provider_strategy(tiny, tools=[get_weather])
    agent = create_agent(
        tiny, tools=[get_weather], response_format=Weather, middleware=[CallFirst(tiny)]
    )
    result = agent.invoke(QUESTION)
    messages = result["messages"]
    assert any(isinstance(m, ToolMessage) and "sunny" in m.content for m in messages)
    assert isinstance(result["structured_response"], Weather)
    final = messages[-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert Weather.model_validate_json(final.content) == result["structured_response"]


@pytest.mark.smollm
def test_smollm2_agent_answers_in_the_schema_natively(smollm2_path):
    llm = ChatMLX(model=str(smollm2_path), temperature=0, max_tokens=64)
    assert llm.profile["structured_output"] and llm.profile["reasoning_output"] is False
    assert _supports_provider_strategy(llm)  # ProviderStrategy, not a tool for the answer
    agent = create_agent(llm, response_format=Weather)
    result = agent.invoke(QUESTION)
    weather = result["structured_response"]
    assert isinstance(weather, Weather)
    final = result["messages"][-1]
    assert final.tool_calls == []  # no "Weather" tool call: the reply itself is the JSON
    assert json.loads(final.content) == weather.model_dump()
