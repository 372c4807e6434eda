"""LangChain's ChatOpenAI and ChatAnthropic, and LlamaIndex's OpenAILike, against the server:
forced tool calls and JSON schemas hold through each of them."""

from __future__ import annotations

from typing import Literal

import jsonschema
import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from llama_index.core.llms import ChatMessage
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai_like import OpenAILike
from pydantic import BaseModel, Field

from tests.serve.conftest import CITY_SCHEMA


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


@tool
def get_time(zone: Literal["UTC", "CET"]) -> str:
    """The time in a time zone."""
    return "12:00"


class City(BaseModel):
    """A city."""

    name: Literal["Paris", "Rome", "Tokyo"]
    population: int = Field(ge=0, le=99)


QUESTION = "What is the weather in Paris?"


def _openai(url: str, **kwargs) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=f"{url}/v1",
        api_key="unused",
        model="tiny",
        temperature=0,
        max_retries=0,  # type: ignore[arg-type]
        **kwargs,
    )


def _anthropic(url: str, **kwargs) -> ChatAnthropic:
    return ChatAnthropic(
        base_url=url,
        api_key="unused",
        model="tiny",
        temperature=0,
        max_retries=0,  # type: ignore[arg-type, call-arg]
        **kwargs,
    )


# ------------------------------------------------------------------ ChatOpenAI


def test_chat_openai_invoke_and_stream_agree(url: str):
    llm = ChatOpenAI(
        base_url=f"{url}/v1",
        api_key="unused",
        model="exact",
        temperature=0,
        max_tokens=12,  # type: ignore[arg-type]
        stream_usage=True,
    )
    whole = llm.invoke(QUESTION)
    chunks = list(llm.stream(QUESTION))
    assert "".join(str(c.content) for c in chunks) == whole.content
    assert whole.usage_metadata is not None and whole.usage_metadata["output_tokens"] > 0
    streamed_usage = [c.usage_metadata for c in chunks if c.usage_metadata]
    assert (
        streamed_usage
        and streamed_usage[-1]["output_tokens"] == whole.usage_metadata["output_tokens"]
    )


@pytest.mark.parametrize("choice", ["any", "get_time"])
def test_chat_openai_forced_tool_calls_hold(url: str, choice: str):
    llm = _openai(url, max_tokens=64).bind_tools([get_weather, get_time], tool_choice=choice)
    for message in (llm.invoke(QUESTION), _joined(llm.stream(QUESTION))):
        assert len(message.tool_calls) == 1, message
        call = message.tool_calls[0]
        if choice == "get_time":
            assert call["name"] == "get_time"
            assert call["args"]["zone"] in ("UTC", "CET")
        assert call["name"] in ("get_weather", "get_time")


def test_chat_openai_tool_loop(url: str):
    llm = _openai(url, max_tokens=64)
    first = llm.bind_tools([get_weather], tool_choice="any").invoke(QUESTION)
    call = first.tool_calls[0]
    reply = llm.bind_tools([get_weather]).invoke(
        [HumanMessage(QUESTION), first, ToolMessage("sunny", tool_call_id=call["id"])]
    )
    assert isinstance(reply, AIMessage)


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_chat_openai_structured_output_holds(url: str, method: str):
    llm = _openai(url, max_tokens=120)
    schema = City if method != "json_mode" else CITY_SCHEMA
    structured = llm.with_structured_output(schema, method=method)  # type: ignore[arg-type]
    if method == "json_mode":  # JSON mode holds any object; the schema is for the model to read
        result = llm.bind(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "city", "schema": CITY_SCHEMA},
            }
        ).invoke("A city as JSON.")
        import json

        jsonschema.validate(json.loads(str(result.content)), CITY_SCHEMA)
        return
    city = structured.invoke("A city.")
    assert isinstance(city, City)


def _joined(chunks) -> AIMessage:
    total = None
    for chunk in chunks:
        total = chunk if total is None else total + chunk
    assert total is not None
    return total  # type: ignore[return-value]


# --------------------------------------------------------------- ChatAnthropic


def test_chat_anthropic_invoke_and_stream(url: str):
    llm = ChatAnthropic(base_url=url, api_key="unused", model="exact", temperature=0, max_tokens=12)  # type: ignore[call-arg, arg-type]
    whole = llm.invoke(QUESTION)
    streamed = _joined(llm.stream(QUESTION))
    assert streamed.text == whole.text
    assert whole.usage_metadata is not None and whole.usage_metadata["output_tokens"] > 0
    assert streamed.usage_metadata is not None
    assert streamed.usage_metadata["output_tokens"] == whole.usage_metadata["output_tokens"]


@pytest.mark.parametrize("choice", ["any", "get_time"])
def test_chat_anthropic_forced_tool_calls_hold(url: str, choice: str):
    llm = _anthropic(url, max_tokens=64).bind_tools([get_weather, get_time], tool_choice=choice)
    for message in (llm.invoke(QUESTION), _joined(llm.stream(QUESTION))):
        assert len(message.tool_calls) == 1, message
        if choice == "get_time":
            assert message.tool_calls[0]["name"] == "get_time"
            assert message.tool_calls[0]["args"]["zone"] in ("UTC", "CET")


def test_chat_anthropic_structured_output_holds(url: str):
    city = _anthropic(url, max_tokens=120).with_structured_output(City).invoke("A city.")
    assert isinstance(city, City)


# ------------------------------------------------------------------ OpenAILike


def _llama(url: str, model: str = "tiny") -> OpenAILike:
    return OpenAILike(
        api_base=f"{url}/v1",
        api_key="unused",
        model=model,
        is_chat_model=True,
        is_function_calling_model=True,
        context_window=4096,
        max_tokens=64,
        temperature=0,
        max_retries=0,
    )


def test_openai_like_chat_and_stream(url: str):
    llm = _llama(url, "exact")
    messages = [ChatMessage(role="user", content=QUESTION)]
    whole = llm.chat(messages)
    last = None
    for last in llm.stream_chat(messages):  # noqa: B007
        pass
    assert last is not None
    assert last.message.content == whole.message.content


def weather_in(city: str) -> str:
    """The weather in a city."""
    return "sunny"


def test_openai_like_forced_tool_call_holds(url: str):
    llm = _llama(url)
    tool_ = FunctionTool.from_defaults(weather_in)
    response = llm.chat_with_tools([tool_], user_msg=QUESTION, tool_required=True)
    calls = llm.get_tool_calls_from_response(response, error_on_no_tool_call=True)
    assert [c.tool_name for c in calls] == ["weather_in"]
    assert isinstance(calls[0].tool_kwargs["city"], str) and calls[0].tool_kwargs["city"]


def test_openai_like_structured_predict_holds(url: str):
    from llama_index.core.prompts import PromptTemplate

    city = _llama(url).structured_predict(City, PromptTemplate("Name a city {x}."), x="now")
    assert isinstance(city, City)


# ------------------------------------------------------ the same in-process and over HTTP


def test_in_process_and_over_http_answer_alike(url: str, tiny_llama):
    """ChatMLX and ChatOpenAI pointed at the server make the same chat-core call: the
    same greedy text, the same forced call, the same structured object."""
    from mlx_integrations.langchain import ChatMLX

    local = ChatMLX(
        model=str(tiny_llama), temperature=0, max_tokens=64, engine_options={"cache_memory_mb": 0}
    )
    remote = ChatOpenAI(
        base_url=f"{url}/v1",
        api_key="unused",
        model="exact",
        temperature=0,
        max_tokens=64,  # type: ignore[arg-type]
        max_retries=0,
    )
    assert remote.invoke(QUESTION).content == local.invoke(QUESTION).content
    forced_local = local.bind_tools([get_weather, get_time], tool_choice="get_time").invoke(
        QUESTION
    )
    forced_remote = remote.bind_tools([get_weather, get_time], tool_choice="get_time").invoke(
        QUESTION
    )
    assert [(c["name"], c["args"]) for c in forced_remote.tool_calls] == [
        (c["name"], c["args"]) for c in forced_local.tool_calls
    ]
    # ChatOpenAI sends the schema in OpenAI's strict form, which the model reads in its
    # prompt: a schema of other words, a reply of other words; both hold to it.
    assert isinstance(remote.with_structured_output(City).invoke("A city."), City)
