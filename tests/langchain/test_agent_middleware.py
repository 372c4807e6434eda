"""RequireToolCall: LangChain's create_agent on a local model calls a tool before it
answers, however small the model; the answer can be a structured response."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Literal

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import ModelRequest
from langchain.agents.structured_output import ToolStrategy
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel, Field

from mlx_integrations.langchain import ChatMLX, RequireToolCall
from mlx_integrations.langchain.middleware import tool_rounds


@tool
def get_weather(city: Literal["Paris", "Lyon"]) -> str:
    """Get the current weather for a city."""
    return f"It is 21 degrees and sunny in {city}."


@tool
def get_time(city: Literal["Paris", "Lyon"]) -> str:
    """Get the local time in a city."""
    return f"It is noon in {city}."


class Weather(BaseModel):
    """The weather in a city."""

    city: Literal["Paris", "Lyon"]
    degrees: int = Field(ge=-90, le=60)


QUESTION = {"messages": [("human", "What is the weather in Paris?")]}


@pytest.fixture(scope="module")
def tiny(tiny_llama) -> ChatMLX:
    # A random model: it never starts a tool call on its own (its greedy reply is text).
    return ChatMLX(model=str(tiny_llama), temperature=0, max_tokens=24)


def calls(messages: list) -> list[str]:
    return [c["name"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]


def test_the_agent_calls_the_tool_reads_the_result_and_answers(tiny):
    agent = create_agent(tiny, tools=[get_weather], middleware=[RequireToolCall()])
    messages = agent.invoke(QUESTION)["messages"]
    call_msg, tool_msg, answer = messages[1], messages[2], messages[3]
    assert call_msg.tool_calls[0]["name"] == "get_weather"
    assert (
        isinstance(tool_msg, ToolMessage) and tool_msg.tool_call_id == call_msg.tool_calls[0]["id"]
    )
    assert tool_msg.content.startswith("It is 21 degrees")
    # The tools are withdrawn once the result is in: the model answers, the loop ends.
    assert isinstance(answer, AIMessage) and not answer.tool_calls and len(messages) == 4


def test_without_it_a_small_model_answers_without_the_tool(tiny):
    """What the middleware is for (so a change to the tiny model does not hide it)."""
    messages = create_agent(tiny, tools=[get_weather]).invoke(QUESTION)["messages"]
    assert calls(messages) == []


def test_rounds_and_a_named_tool(tiny):
    agent = create_agent(
        tiny, tools=[get_weather, get_time], middleware=[RequireToolCall("get_time", rounds=2)]
    )
    messages = agent.invoke(QUESTION)["messages"]
    assert calls(messages) == ["get_time", "get_time"]
    assert isinstance(messages[-1], AIMessage) and not messages[-1].tool_calls


def test_structured_response_comes_after_the_tool(tiny):
    # ChatMLX's profile says it does structured output: the answer is JSON in the schema.
    agent = create_agent(
        tiny, tools=[get_weather], middleware=[RequireToolCall()], response_format=Weather
    )
    result = agent.invoke(QUESTION)
    assert calls(result["messages"]) == ["get_weather"]
    assert isinstance(result["messages"][2], ToolMessage)
    answer = result["structured_response"]
    assert isinstance(answer, Weather)
    assert Weather.model_validate_json(result["messages"][-1].content) == answer


def test_structured_response_as_a_tool_call_comes_after_the_tool(tiny_llama):
    # With ToolStrategy the answer is a call of a tool named after the schema; the agent
    # forces some call on every step, which need not be a real tool's without the middleware.
    agent = create_agent(
        ChatMLX(model=str(tiny_llama), temperature=0, max_tokens=48),
        tools=[get_weather],
        middleware=[RequireToolCall()],
        response_format=ToolStrategy(Weather),
    )
    result = agent.invoke(QUESTION)
    assert calls(result["messages"]) == ["get_weather", "Weather"]
    assert isinstance(result["structured_response"], Weather)


def test_async_and_streamed(tiny):
    agent = create_agent(tiny, tools=[get_weather], middleware=[RequireToolCall()])

    async def run() -> list:
        return [chunk async for chunk in agent.astream(QUESTION, stream_mode="messages")]

    chunks = asyncio.run(run())
    from_model = [m for m, meta in chunks if meta["langgraph_node"] == "model"]
    assert any(c["name"] == "get_weather" for m in from_model for c in m.tool_call_chunks)
    assert any(isinstance(m, ToolMessage) for m, _ in chunks)


def test_a_new_question_needs_a_new_call(tiny):
    def request(*messages) -> ModelRequest:
        return ModelRequest(model=tiny, messages=list(messages), tools=[get_weather])

    call = AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "1"}])
    result = ToolMessage("sunny", tool_call_id="1")
    first = [HumanMessage("Weather in Paris?"), call, result, AIMessage("Sunny.")]
    middleware = RequireToolCall()
    assert tool_rounds(first) == 1
    answering = middleware.adjust(request(*first[:3]))
    assert answering.tools == [] and answering.tool_choice is None
    again = middleware.adjust(request(*first, HumanMessage("And in Lyon?")))
    assert again.tool_choice == "any" and again.tools == [get_weather]
    kept = RequireToolCall(keep_tools=True).adjust(request(*first[:3]))
    assert kept.tools == [get_weather] and kept.tool_choice is None


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"rounds": 0}, ValueError, "rounds must be 1 or more, got 0"),
        ({"rounds": "2"}, TypeError, "rounds must be an int"),
        ({"rounds": True}, TypeError, "rounds must be an int"),
        ({"tools": []}, ValueError, "tools is empty"),
        ({"tools": ["get_weather", get_weather]}, ValueError, "names a tool twice"),
        ({"tools": [3]}, TypeError, "tools must hold tool names or tools, got int"),
        ({"tools": 3}, TypeError, "got int: 3"),
    ],
)
def test_bad_options_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        RequireToolCall(**kwargs)


def test_a_tool_the_agent_lacks_is_named_and_the_engine_keeps_serving(tiny):
    agent = create_agent(tiny, tools=[get_weather], middleware=[RequireToolCall("get_wether")])
    with pytest.raises(ValueError, match=r"no tool 'get_wether'; its tools are \['get_weather'\]"):
        agent.invoke(QUESTION)
    with pytest.raises(ValueError, match="found no tools to call"):
        create_agent(tiny, middleware=[RequireToolCall()]).invoke(QUESTION)
    agent = create_agent(tiny, tools=[get_weather], middleware=[RequireToolCall()])
    assert calls(agent.invoke(QUESTION)["messages"]) == ["get_weather"]


class RealWeather(BaseModel):
    """The weather in a city."""

    city: str = Field(max_length=40)
    degrees: int = Field(ge=-90, le=60, description="Temperature in degrees Celsius")


@pytest.mark.smollm
def test_smollm2_agent_streams_a_structured_answer_from_the_tool_result(smollm2_path):
    @tool
    def weather(city: str) -> str:
        """Get the current weather for a city."""
        return f"It is 21 degrees and sunny in {city}."

    llm = ChatMLX(model=str(smollm2_path), temperature=0, max_tokens=40, repetition_penalty=1.2)
    agent = create_agent(
        llm, tools=[weather], middleware=[RequireToolCall()], response_format=RealWeather
    )
    tokens: list[str] = []
    updates: list[dict] = []
    for mode, data in agent.stream(
        {"messages": [("human", "What is the weather in Paris?")]},
        stream_mode=["messages", "updates"],
    ):
        if mode == "messages":
            token, meta = data
            if meta["langgraph_node"] == "model" and token.content:
                tokens.append(token.content)
        else:
            updates.append(data)
    model_steps = [u["model"] for u in updates if "model" in u]
    call = model_steps[0]["messages"][0].tool_calls[0]
    assert call["name"] == "weather" and "paris" in call["args"]["city"].lower()
    tool_steps = [u["tools"] for u in updates if "tools" in u]
    assert tool_steps[0]["messages"][0].content == "It is 21 degrees and sunny in Paris."
    answer = model_steps[-1]
    assert len(tokens) > 5 and "".join(tokens) == answer["messages"][0].content
    assert answer["structured_response"] == RealWeather(city="Paris", degrees=21)


def test_without_langchain_the_import_says_what_to_install():
    code = (
        "import sys; sys.modules['langchain.agents.middleware'] = None\n"
        "from mlx_integrations.langchain import RequireToolCall"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "ImportError: RequireToolCall needs LangChain 1.x agents; install them with: "
        'pip install "langchain>=1.0"'
    )
