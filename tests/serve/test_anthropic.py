"""The ``anthropic`` SDK against ``mlxi serve``'s ``/v1/messages``."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest

from tests.serve.conftest import TIME, WEATHER, no_end_bias, sse_events

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in (WEATHER, TIME)
]
SCHEMAS = {t["name"]: t["input_schema"] for t in TOOLS}
# The SDK takes sampling settings only as extra body fields now; the server reads them.
GREEDY = {"temperature": 0}
USER_BODY = {"model": "exact", "messages": USER, "max_tokens": 4}


@pytest.fixture(scope="module")
def client(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)


def test_a_message_with_system_and_usage(client: anthropic.Anthropic):
    reply = client.messages.create(
        model="tiny", system="Be brief.", messages=USER, max_tokens=8, extra_body=GREEDY
    )
    assert reply.type == "message" and reply.role == "assistant"
    assert reply.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in reply.content] in (["text"], [])
    assert reply.usage.input_tokens > 0
    assert 0 < reply.usage.output_tokens <= 8


def test_the_stream_is_the_event_sequence_strict_clients_check(url: str):
    body = {"model": "exact", "messages": USER, "max_tokens": 10, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/messages", json=body, timeout=60) as response:
        events = list(sse_events(response))
    names = [name for name, _ in events]
    assert all(data["type"] == name for name, data in events)
    assert names[0] == "message_start"
    assert names[-2:] == ["message_delta", "message_stop"]
    blocks = [n for n in names if n.startswith("content_block")]
    # Every block starts, takes deltas and stops, in order, with its own index.
    opened: list[int] = []
    for name, data in events:
        if name == "content_block_start":
            assert data["index"] == len(opened)
            opened.append(data["index"])
        elif name in ("content_block_delta", "content_block_stop"):
            assert data["index"] == opened[-1]
    assert blocks.count("content_block_start") == blocks.count("content_block_stop")
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    assert delta["usage"]["output_tokens"] > 0
    whole = httpx.post(f"{url}/v1/messages", json={**body, "stream": False}, timeout=60).json()
    streamed = "".join(
        d["delta"]["text"]
        for n, d in events
        if n == "content_block_delta" and d["delta"]["type"] == "text_delta"
    )
    assert streamed == "".join(b["text"] for b in whole["content"] if b["type"] == "text")


def test_the_sdk_stream_helper_accumulates_the_message(client: anthropic.Anthropic):
    with client.messages.stream(
        model="exact", messages=USER, max_tokens=10, extra_body=GREEDY
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].text == text  # type: ignore[union-attr]
    assert final.usage.output_tokens > 0
    assert final.stop_reason in ("end_turn", "max_tokens")


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_time"}])
def test_forced_tool_use_holds(client: anthropic.Anthropic, choice):
    reply = client.messages.create(
        model="tiny",
        messages=USER,
        tools=TOOLS,
        tool_choice=choice,
        max_tokens=64,
        extra_body=GREEDY,  # type: ignore[arg-type]
    )
    assert reply.stop_reason == "tool_use"
    uses = [b for b in reply.content if b.type == "tool_use"]
    assert len(uses) == 1
    if choice["type"] == "tool":
        assert uses[0].name == "get_time"
    jsonschema.validate(uses[0].input, SCHEMAS[uses[0].name])


def test_streamed_tool_use_is_the_whole_one(client: anthropic.Anthropic):
    kwargs = dict(
        model="exact",
        messages=USER,
        tools=TOOLS,
        tool_choice={"type": "any"},
        max_tokens=64,
        extra_body=GREEDY,
    )
    whole = client.messages.create(**kwargs)  # type: ignore[call-overload]
    with client.messages.stream(**kwargs) as stream:  # type: ignore[arg-type]
        final = stream.get_final_message()
    got = [(b.name, b.input) for b in final.content if b.type == "tool_use"]
    assert got == [(b.name, b.input) for b in whole.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use"


def test_tool_choice_none_and_tool_results(client: anthropic.Anthropic):
    first = client.messages.create(
        model="tiny",
        messages=USER,
        tools=TOOLS,
        tool_choice={"type": "any"},
        max_tokens=64,
        extra_body=GREEDY,
    )
    use = next(b for b in first.content if b.type == "tool_use")
    reply = client.messages.create(
        model="tiny",
        messages=[
            *USER,
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"},
                    {"type": "text", "text": "Thanks. Summarise."},
                ],
            },
        ],
        tools=TOOLS,
        tool_choice={"type": "none"},
        max_tokens=8,
        extra_body=GREEDY,
    )
    assert all(b.type != "tool_use" for b in reply.content)
    alone = client.messages.count_tokens(
        model="tiny", messages=USER, tools=TOOLS, tool_choice={"type": "none"}
    )  # type: ignore[arg-type]
    # The call and its result are in the prompt (tool_choice none: the tools are not).
    assert (
        reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0)
        > alone.input_tokens + 10
    )


def test_stop_sequences_are_reported(client: anthropic.Anthropic):
    base = dict(
        model="exact", messages=USER, max_tokens=10, extra_body={"temperature": 1.0, "seed": 7}
    )
    whole = client.messages.create(**base)  # type: ignore[call-overload]
    text = whole.content[0].text  # type: ignore[union-attr]
    assert len(text) > 6, text
    stop = text[2:4]
    stopped = client.messages.create(stop_sequences=[stop], **base)  # type: ignore[call-overload]
    assert stopped.stop_reason == "stop_sequence"
    assert stopped.stop_sequence == stop
    got = "".join(b.text for b in stopped.content if b.type == "text")
    assert got == text[: text.index(stop)]


def test_thinking_comes_back_as_thinking_blocks(client: anthropic.Anthropic):
    reply = client.messages.create(
        model="thinker",
        messages=USER,
        max_tokens=10,
        extra_body=GREEDY,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert reply.content[0].type == "thinking"
    thinking = reply.content[0].thinking  # type: ignore[union-attr]
    assert thinking
    with client.messages.stream(
        model="thinker",
        messages=USER,
        max_tokens=10,
        extra_body=GREEDY,
        thinking={"type": "enabled", "budget_tokens": 1024},
    ) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "thinking"
    assert final.content[0].thinking == thinking  # type: ignore[union-attr]
    # A thinking block sent back is the assistant's reasoning in the prompt.
    again = client.messages.create(
        model="thinker",
        max_tokens=4,
        extra_body=GREEDY,
        messages=[
            *USER,
            {"role": "assistant", "content": [b.model_dump() for b in reply.content]},
            {"role": "user", "content": "Go on."},
        ],
    )
    assert (
        again.usage.input_tokens + (again.usage.cache_read_input_tokens or 0)
        > reply.usage.input_tokens
    )


def test_thinking_budget_tokens_caps_the_thinking(client, url, thinking_model):
    """With </think> and the end tokens banned the thinker thinks until max_tokens; a
    budget of 3 tokens makes it close the thinking there, then a text block follows."""
    extra = {**GREEDY, "logit_bias": no_end_bias(thinking_model)}

    def reply(budget: int) -> anthropic.types.Message:
        return client.messages.create(
            model="thinker",
            messages=USER,
            max_tokens=16,
            extra_body=extra,
            thinking={"type": "enabled", "budget_tokens": budget},
        )

    unbounded, capped = reply(1024), reply(3)
    assert [b.type for b in unbounded.content] == ["thinking"]
    assert [b.type for b in capped.content] == ["thinking", "text"]
    long, short = unbounded.content[0].thinking, capped.content[0].thinking  # type: ignore[union-attr]
    assert long.startswith(short) and len(short) < len(long)
    # A model that does not think has nothing to cap: the budget is ignored, as Claude
    # clients send it whatever the model.
    plain = {"model": "exact", "messages": USER, "max_tokens": 6, "extra_body": GREEDY}
    assert (
        client.messages.create(**plain, thinking={"type": "enabled", "budget_tokens": 3}).content
        == client.messages.create(**plain).content
    )
    bad = httpx.post(
        f"{url}/v1/messages",
        json={**USER_BODY, "thinking": {"type": "enabled", "budget_tokens": 0}},
        timeout=60,
    )
    assert bad.status_code == 400, bad.text
    assert "thinking.budget_tokens" in bad.text and ">= 1" in bad.text


def test_count_tokens_is_the_prompt_a_call_reports(client: anthropic.Anthropic):
    counted = client.messages.count_tokens(
        model="exact", messages=USER, tools=TOOLS, system="Be brief."
    )  # type: ignore[arg-type]
    reply = client.messages.create(
        model="exact",
        messages=USER,
        tools=TOOLS,
        system="Be brief.",
        max_tokens=2,
        extra_body=GREEDY,  # type: ignore[arg-type]
    )
    assert counted.input_tokens == reply.usage.input_tokens + (
        reply.usage.cache_read_input_tokens or 0
    )


def test_errors_come_in_anthropic_shape(client: anthropic.Anthropic):
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="nobody/nothing", messages=USER, max_tokens=4)
    assert missing.value.body["type"] == "error"  # type: ignore[index]
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(
            model="tiny",
            messages=USER,
            max_tokens=4,
            tools=TOOLS,
            tool_choice={"type": "tool", "name": "nope"},
        )
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "nope" in bad.value.message
    with pytest.raises(anthropic.BadRequestError) as role:
        client.messages.create(
            model="tiny", messages=[{"role": "robot", "content": "x"}], max_tokens=4
        )  # type: ignore[typeddict-item]
    assert "role" in role.value.message


def test_a_tool_input_streams_as_one_json_delta(url: str):
    body = {
        "model": "exact",
        "messages": USER,
        "tools": TOOLS,
        "tool_choice": {"type": "any"},
        "max_tokens": 64,
        "temperature": 0,
        "stream": True,
    }
    with httpx.stream("POST", f"{url}/v1/messages", json=body, timeout=60) as response:
        events = list(sse_events(response))
    start = next(
        d
        for n, d in events
        if n == "content_block_start" and d["content_block"]["type"] == "tool_use"
    )
    assert start["content_block"]["input"] == {}
    partial = "".join(
        d["delta"]["partial_json"]
        for n, d in events
        if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"
    )
    jsonschema.validate(json.loads(partial), SCHEMAS[start["content_block"]["name"]])
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_output_config_format_holds_the_schema(client: anthropic.Anthropic):
    from tests.serve.conftest import CITY_SCHEMA

    reply = client.messages.create(
        model="tiny",
        messages=[{"role": "user", "content": "A city as JSON."}],
        max_tokens=120,
        output_config={"format": {"type": "json_schema", "schema": CITY_SCHEMA}},
        extra_body=GREEDY,
    )
    assert reply.stop_reason == "end_turn"
    jsonschema.validate(json.loads(reply.content[0].text), CITY_SCHEMA)  # type: ignore[union-attr]


def test_server_tools_are_left_out_and_named(client: anthropic.Anthropic, url: str):
    """Tools only Anthropic's API runs (web search, code execution) are not in the
    prompt: the client tools are, as if alone."""
    server_tools = [
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
        {"type": "code_execution_20250522", "name": "code_execution"},
    ]
    body = {"model": "exact", "messages": USER, "max_tokens": 2, "temperature": 0}
    mixed = {**body, "tools": [server_tools[0], TOOLS[0], server_tools[1]]}
    reply = httpx.post(f"{url}/v1/messages", json=mixed, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-mlxi-ignored-fields"] == "tools[0],tools[2]"
    counted = client.messages.count_tokens(
        model="exact",
        messages=USER,  # type: ignore[arg-type]
        tools=[TOOLS[0]],  # type: ignore[list-item]
    )
    usage = reply.json()["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == counted.input_tokens
    forced = {**mixed, "model": "tiny", "tool_choice": {"type": "any"}, "max_tokens": 64}
    called = httpx.post(f"{url}/v1/messages", json=forced, timeout=60).json()
    assert [b["name"] for b in called["content"] if b["type"] == "tool_use"] == ["get_weather"]
    only = httpx.post(f"{url}/v1/messages", json={**body, "tools": server_tools}, timeout=60)
    assert only.status_code == 200, only.text
    bad_tool = {**TOOLS[0], "input_schema": {"type": "string"}}
    bad = httpx.post(
        f"{url}/v1/messages", json={**body, "tools": [server_tools[0], bad_tool]}, timeout=60
    )
    assert bad.status_code == 400 and "get_weather" in bad.json()["error"]["message"]
