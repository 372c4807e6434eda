"""Agents end: a model that keeps calling the tool it was answered (small models do,
turn after turn) is held to the answer once it repeats a call, so ``create_agent`` with
tools and a ``response_format`` returns its object within a few steps."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.tools import tool
from pydantic import BaseModel

from mlx_integrations.chat.completion import Finished, repeats_a_call, stream_chat_events
from mlx_integrations.chat.request import ChatRequest
from mlx_integrations.chat.tool_formats import InvalidToolCall, ParsedToolCall
from mlx_integrations.langchain import ChatMLX


class City(BaseModel):
    """A city and its country."""

    city: str
    country: str


@tool
def get_weather(city: str) -> str:
    """Get the weather of a city."""
    return f"It is sunny in {city}."


QUESTION = "Paris is the capital of France. Give the city and its country."
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def _call(name: str, args: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def test_a_repeated_call_is_one_with_the_same_tool_and_arguments():
    first = [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_call("get_weather", {"city": "Paris"}, "a")],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "a"},
    ]
    assert not repeats_a_call(first)
    other = {
        "role": "assistant",
        "content": "",
        "tool_calls": [_call("get_weather", {"city": "Lyon"}, "b")],
    }
    assert not repeats_a_call([*first, other])
    again = {
        "role": "assistant",
        "content": "",
        "tool_calls": [_call("get_weather", {"city": "Paris"}, "c")],
    }
    assert repeats_a_call([*first, again])


async def test_after_a_repeated_call_the_answer_is_required(tiny_llama):
    from mlx_integrations.engine import SimpleEngine

    engine = SimpleEngine(tiny_llama)
    schema = City.model_json_schema()
    answer = {"type": "json_schema", "json_schema": {"name": "City", "schema": schema}}
    looping = [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                _call("get_weather", {"city": "Paris"}, "a"),
                _call("get_weather", {"city": "Paris"}, "b"),
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "a"},
        {"role": "tool", "content": "sunny", "tool_call_id": "b"},
    ]
    try:
        for seed in range(3):  # a random model that would call again, if it could
            request = ChatRequest.build(
                looping,
                tools=[WEATHER],
                response_format=answer,
                max_tokens=96,
                temperature=1.0,
                seed=seed,
            )
            events = [e async for e in stream_chat_events(engine, request)]
            assert not [e for e in events if isinstance(e, (ParsedToolCall, InvalidToolCall))]
            finished = events[-1]
            assert isinstance(finished, Finished)
            if finished.finish_reason == "stop":
                City.model_validate(json.loads(finished.text))
    finally:
        await engine.stop()


@pytest.mark.smollm
def test_the_agent_with_tools_and_a_response_format_ends_on_the_demo_model(smollm2_path):
    from langchain.agents import create_agent

    llm = ChatMLX(model=str(smollm2_path), temperature=0, max_tokens=64)
    agent = create_agent(model=llm, tools=[get_weather], response_format=City)
    # Six steps: model, tools, model, tools, model and one to spare.
    result = agent.invoke({"messages": [("user", QUESTION)]}, {"recursion_limit": 6})
    assert result["structured_response"] == City(city="Paris", country="France")


@pytest.mark.smollm
def test_the_docs_agents_end_within_six_steps(smollm2_path):
    from langchain.agents import create_agent

    from mlx_integrations.langchain import RequireToolCall

    llm = ChatMLX(model=str(smollm2_path), temperature=0, max_tokens=64)
    question = {"messages": [("human", "What is the weather in Paris?")]}
    limit = {"recursion_limit": 6}
    plain = create_agent(llm, tools=[get_weather], middleware=[RequireToolCall()])
    messages = plain.invoke(question, limit)["messages"]
    assert messages[-1].type == "ai" and messages[-1].content and not messages[-1].tool_calls
    shaped = create_agent(
        llm, tools=[get_weather], middleware=[RequireToolCall()], response_format=City
    )
    assert isinstance(shaped.invoke(question, limit)["structured_response"], City)
