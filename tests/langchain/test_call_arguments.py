"""ChatMLX and what LangChain asks of a chat model besides replies: its call arguments
(stop as one string, ``stream``, ``stream_usage``, ``strict``), token counts in the
model's tokenizer (no GPT-2 download), cache keys and the model profile."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, trim_messages
from langchain_core.tools import tool

from mlx_integrations.langchain import ChatMLX
from tests.support.forcing import forcing

TEXT = "Paris is nice. END here"


@tool
def get_weather(city: str) -> str:
    """Get the weather of a city."""
    return f"sunny in {city}"


@pytest.fixture(scope="module")
def llm(tiny_llama) -> ChatMLX:
    return ChatMLX(model=str(tiny_llama), temperature=0, max_tokens=24)


def forced(llm: ChatMLX) -> dict[str, Any]:
    processor, _ = forcing(llm.engine.tokenizer, TEXT)
    return {"logits_processors": [processor]}


def test_a_stop_string_is_one_sequence_not_its_characters(llm):
    # "here" split into characters would stop at the first "e" (after "Paris is nic").
    assert llm.invoke("x", stop=["here"], **forced(llm)).content == "Paris is nice. END "
    assert llm.invoke("x", stop="here", **forced(llm)).content == "Paris is nice. END "
    assert llm.bind(stop="here").invoke("x", **forced(llm)).content == "Paris is nice. END "
    streamed = "".join(c.content for c in llm.stream("x", stop="here", **forced(llm)))
    assert streamed == "Paris is nice. END "


def test_stream_usage_argument_and_field(llm, tiny_llama):
    last = list(llm.stream("Hi", max_tokens=3))[-1]
    assert last.usage_metadata["output_tokens"] == 3
    assert list(llm.stream("Hi", max_tokens=3, stream_usage=True))[-1].usage_metadata
    without = list(llm.stream("Hi", max_tokens=3, stream_usage=False))
    assert all(c.usage_metadata is None for c in without)
    assert without[-1].response_metadata["finish_reason"] == "length"
    quiet = ChatMLX(model=str(tiny_llama), temperature=0, max_tokens=3, stream_usage=False)
    assert all(c.usage_metadata is None for c in quiet.stream("Hi"))
    assert list(quiet.stream("Hi", stream_usage=True))[-1].usage_metadata["output_tokens"] == 3
    with pytest.raises(TypeError, match="stream_usage must be True or False, got 'yes'"):
        list(llm.stream("Hi", stream_usage="yes"))
    # A whole reply reports usage whatever stream_usage says.
    assert llm.invoke("Hi", max_tokens=3, stream_usage=False).usage_metadata["output_tokens"] == 3


def test_langchains_stream_switch_is_accepted(llm):
    for stream in (True, False):
        msg = llm.invoke("Hi", max_tokens=3, stream=stream)
        assert msg.usage_metadata["output_tokens"] == 3


def test_token_ids_come_from_the_models_tokenizer(llm):
    tokenizer = llm.engine.tokenizer
    assert llm.get_token_ids("hello world") == tokenizer.encode(
        "hello world", add_special_tokens=False
    )
    assert llm.get_num_tokens("hello world") == len(llm.get_token_ids("hello world"))


def test_message_token_count_is_the_prompt_the_call_reports(llm):
    messages = [
        SystemMessage("Be brief."),
        HumanMessage("hello there"),
        AIMessage("hi"),
        HumanMessage("what now?"),
    ]
    reported = llm.invoke(messages, max_tokens=1).usage_metadata["input_tokens"]
    assert llm.get_num_tokens_from_messages(messages) == reported
    with_tools = llm.bind_tools([get_weather]).invoke(messages, max_tokens=1)
    counted = llm.get_num_tokens_from_messages(messages, tools=[get_weather])
    assert counted == with_tools.usage_metadata["input_tokens"] > reported
    assert llm.get_num_tokens_from_messages([]) == 0
    as_tuples = [
        ("system", "Be brief."),
        ("human", "hello there"),
        ("ai", "hi"),
        ("human", "what now?"),
    ]
    assert llm.get_num_tokens_from_messages(as_tuples) == reported


def test_trim_messages_counts_with_the_model(llm):
    messages = [
        SystemMessage("Be brief."),
        HumanMessage("first question " * 20),
        AIMessage("first answer " * 20),
        HumanMessage("second question"),
    ]
    # trim_messages adds up the counts of parts; each part is a whole prompt here
    # (generation prompt included), so the sum is an upper bound of the real prompt.
    system, last = messages[0], messages[-1]
    budget = llm.get_num_tokens_from_messages([system]) + llm.get_num_tokens_from_messages([last])
    kept = trim_messages(
        messages, max_tokens=budget, token_counter=llm, strategy="last", include_system=True
    )
    assert kept == [system, last]
    assert llm.get_num_tokens_from_messages(kept) <= budget


def test_bind_tools_takes_strict(llm):
    # ChatOpenAI-style code passes strict=True; it must not fail every call afterwards.
    for strict in (True, False):
        bound = llm.bind_tools([get_weather], tool_choice="get_weather", strict=strict)
        msg = bound.invoke("Weather in Paris?", max_tokens=40)
        assert [c["name"] for c in msg.tool_calls] == ["get_weather"]
        assert set(msg.tool_calls[0]["args"]) == {"city"}


def test_llm_cache_tells_apart_settings_that_change_replies(tiny_llama):
    from langchain_core.caches import InMemoryCache

    cache = InMemoryCache()
    variants = [
        {},
        {"reasoning": True},
        {"chat_template_kwargs": {"flavour": "terse"}},
        {"tool_format": "pythonic"},
    ]
    for extra in variants:
        llm = ChatMLX(model=str(tiny_llama), temperature=0, max_tokens=2, cache=cache, **extra)
        llm.invoke("Hi")
    # One entry per variant: none of them was served another one's reply.
    assert len(cache._cache) == len(variants)


def test_profile_describes_the_served_model(llm):
    profile = llm.profile
    assert profile is not None
    assert profile["max_input_tokens"] == llm.engine.context_length == 4096
    assert profile["tool_calling"] and profile["tool_choice"] and profile["structured_output"]
    assert profile["image_inputs"] is False  # a text model
    mine = ChatMLX(engine=llm.engine, profile={"max_input_tokens": 100})
    assert mine.profile == {"max_input_tokens": 100}  # a given profile is kept
