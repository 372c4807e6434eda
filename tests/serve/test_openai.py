"""The ``openai`` SDK against ``mlxi serve``: chat, streaming, tools, schemas, errors."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from mlx_integrations.serve.server import BackgroundServer
from tests.serve.conftest import CITY_SCHEMA, TIME, WEATHER, engine_of, sse_events

USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_chat_answers_with_usage(client: openai.OpenAI):
    reply = client.chat.completions.create(model="tiny", messages=USER, max_tokens=8, temperature=0)
    choice = reply.choices[0]
    assert reply.object == "chat.completion"
    assert reply.model == "tiny"
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage is not None
    assert reply.usage.prompt_tokens > 0
    assert 0 < reply.usage.completion_tokens <= 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_stream_joins_to_the_whole_answer_and_ends_with_usage(client: openai.OpenAI):
    whole = client.chat.completions.create(
        model="exact", messages=USER, max_tokens=12, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model="exact",
            messages=USER,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason
    assert all(f is None for f in finishes[:-1])
    # Usage comes last, in a chunk without choices (stream_options.include_usage).
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]


def test_a_second_turn_reports_its_cached_prompt_tokens(client: openai.OpenAI):
    first = client.chat.completions.create(model="tiny", messages=USER, max_tokens=6, temperature=0)
    history = [*USER, {"role": "assistant", "content": first.choices[0].message.content}]
    second = client.chat.completions.create(
        model="tiny",
        messages=[*history, {"role": "user", "content": "And in Rome?"}],
        max_tokens=6,
        temperature=0,
    )
    details = second.usage.prompt_tokens_details  # type: ignore[union-attr]
    assert details is not None
    assert details.cached_tokens >= first.usage.prompt_tokens - 1  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_time"}}]
)
def test_forced_tool_choice_holds(client: openai.OpenAI, choice):
    reply = client.chat.completions.create(
        model="tiny",
        messages=USER,
        tools=[WEATHER, TIME],
        tool_choice=choice,
        max_tokens=64,
        temperature=0,
    )
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls and len(message.tool_calls) == 1  # forced: one call
    call = message.tool_calls[0]
    assert call.type == "function" and call.id
    if isinstance(choice, dict):
        assert call.function.name == "get_time"
    tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


def test_tool_choice_none_shows_no_tools_and_calls_none(client: openai.OpenAI):
    reply = client.chat.completions.create(
        model="tiny",
        messages=USER,
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=16,
        temperature=0,
    )
    assert not reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason != "tool_calls"


def test_parallel_calls_when_asked(client: openai.OpenAI):
    reply = client.chat.completions.create(
        model="exact",
        messages=USER,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=True,
        max_tokens=200,
        temperature=0,
    )
    calls = reply.choices[0].message.tool_calls or []
    assert len(calls) >= 1
    for call in calls:
        json.loads(call.function.arguments)


def test_streamed_tool_call_deltas_join_to_the_whole_call(client: openai.OpenAI):
    kwargs = dict(
        model="exact",
        messages=USER,
        tools=[WEATHER, TIME],
        tool_choice="required",
        max_tokens=64,
        temperature=0,
    )
    whole = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kwargs):  # type: ignore[call-overload]
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += delta.id or ""
            call["name"] += (delta.function and delta.function.name) or ""
            call["arguments"] += (delta.function and delta.function.arguments) or ""
        finish = chunk.choices[0].finish_reason or finish
    expected = whole.choices[0].message.tool_calls
    assert expected is not None
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in expected
    ]
    assert all(c["id"].startswith("call_") for c in calls.values())
    assert finish == "tool_calls"


def test_tool_results_go_back_to_the_model(client: openai.OpenAI):
    first = client.chat.completions.create(
        model="tiny",
        messages=USER,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=64,
        temperature=0,
    )
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    reply = client.chat.completions.create(
        model="tiny",
        messages=[
            *USER,
            first.choices[0].message.model_dump(exclude_none=True),  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
        ],
        tools=[WEATHER],
        max_tokens=8,
        temperature=0,
    )
    assert reply.usage.prompt_tokens > first.usage.prompt_tokens  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_object"},
        {
            "type": "json_schema",
            "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True},
        },
    ],
)
def test_response_format_is_valid_by_construction(client: openai.OpenAI, response_format):
    reply = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "A city, as JSON."}],
        response_format=response_format,
        max_tokens=120,
        temperature=0.8,
        seed=1,
    )
    assert reply.choices[0].finish_reason == "stop"
    value = json.loads(reply.choices[0].message.content or "")
    if response_format["type"] == "json_schema":
        jsonschema.validate(value, CITY_SCHEMA)
    else:
        assert isinstance(value, dict)


def test_parse_helper_reads_a_schema_reply(client: openai.OpenAI):
    from typing import Literal

    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: Literal["Paris", "Rome", "Tokyo"]
        population: int = Field(ge=0, le=99)

    reply = client.chat.completions.parse(
        model="tiny",
        messages=[{"role": "user", "content": "A city."}],
        response_format=City,
        max_tokens=120,
        temperature=0,
    )
    assert isinstance(reply.choices[0].message.parsed, City)


def test_stop_seed_and_max_completion_tokens(client: openai.OpenAI):
    base = dict(model="exact", messages=USER, temperature=1.0, seed=7, max_completion_tokens=10)
    one = client.chat.completions.create(**base)  # type: ignore[call-overload]
    two = client.chat.completions.create(**base)  # type: ignore[call-overload]
    assert one.choices[0].message.content == two.choices[0].message.content  # seeded
    text = one.choices[0].message.content or ""
    assert one.usage.completion_tokens <= 10  # type: ignore[union-attr]
    assert len(text) > 6, text
    stop = text[2:4]  # early in the reply: it ends there, before the stop string
    stopped = client.chat.completions.create(stop=[stop], **base)  # type: ignore[call-overload]
    assert stopped.choices[0].message.content == text[: text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"


def test_reasoning_comes_in_reasoning_content(client: openai.OpenAI):
    reply = client.chat.completions.create(
        model="thinker", messages=USER, max_tokens=10, temperature=0
    )
    message = reply.choices[0].message
    reasoning = getattr(message, "reasoning_content", None) or (message.model_extra or {}).get(
        "reasoning_content"
    )
    assert reasoning  # the template opened <think>: the reply starts as reasoning
    chunks = list(
        client.chat.completions.create(
            model="thinker", messages=USER, max_tokens=10, temperature=0, stream=True
        )
    )
    streamed = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
        for c in chunks
        if c.choices
    )
    assert streamed == reasoning
    assert "<think>" not in (message.content or "")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 0}, "n"),
        ({"n": 33}, "n"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": [{"type": "function", "function": {"parameters": {}}}]},
            "tools[0].function.name",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"top_p": 0}, "top_p"),
    ],
)
def test_a_bad_field_is_a_400_that_names_it(client: openai.OpenAI, extra, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            **{"model": "tiny", "messages": USER, "max_tokens": 4, **extra}
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"


def test_an_unknown_model_is_a_404_that_says_how_to_get_it(url: str):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="acme/unknown-7b", messages=USER)
    assert caught.value.body["code"] == "model_not_found"  # type: ignore[index]
    assert "acme/unknown-7b" in caught.value.message


def test_unknown_models_load_on_first_use_unless_only_listed(tiny_llama):
    from mlx_integrations.serve.config import ServeConfig

    with BackgroundServer(ServeConfig()) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model=str(tiny_llama), messages=USER, max_tokens=3, temperature=0
        )
        assert reply.model == str(tiny_llama)
        with pytest.raises(openai.NotFoundError) as caught:
            client.chat.completions.create(model="not-pulled", messages=USER)
        assert "mlxi pull" not in caught.value.message  # not a Hub repo id
        assert "mlxi list" in caught.value.message and "mlxi import" in caught.value.message
        with pytest.raises(openai.NotFoundError) as caught:
            client.models.retrieve("acme/not-pulled")
        assert "mlxi pull acme/not-pulled" in caught.value.message


def test_errors_after_the_stream_began_arrive_as_an_event(url: str, server: BackgroundServer):
    engine = engine_of(server, "tiny")
    body = {"model": "tiny", "messages": USER, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [data for _, data in sse_events(response)]
    assert events[-1] == "[DONE]"
    assert engine.get_stats()["num_running"] == 0


def test_completions_continue_raw_text(client: openai.OpenAI):
    whole = client.completions.create(
        model="exact", prompt="The capital of", max_tokens=6, temperature=0
    )
    assert whole.object == "text_completion"
    assert whole.usage is not None and whole.usage.completion_tokens <= 6
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="exact", prompt="The capital of", max_tokens=6, temperature=0, stream=True
        )
    )
    assert streamed == whole.choices[0].text
    echoed = client.completions.create(
        model="exact", prompt="The capital of", max_tokens=6, temperature=0, echo=True
    )
    assert echoed.choices[0].text == "The capital of" + whole.choices[0].text
    several = client.completions.create(
        model="exact", prompt=["one", "two"], max_tokens=3, temperature=0
    )
    assert [c.index for c in several.choices] == [0, 1]


def test_models_lists_what_is_served(client: openai.OpenAI):
    names = [m.id for m in client.models.list()]
    assert names[:3] == ["tiny", "exact", "thinker"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nothing-here")
