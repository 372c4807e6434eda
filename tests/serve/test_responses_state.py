"""Stateful Responses through the ``openai`` SDK: kept responses, ``previous_response_id``,
``GET``/``DELETE /v1/responses/{id}``, the store's bounds; and the answer's
log-probabilities on Responses."""

from __future__ import annotations

import math
from typing import Any

import httpx
import openai
import pytest

from mlx_integrations.serve.config import ServeConfig
from mlx_integrations.serve.openai import response_store
from mlx_integrations.serve.openai.response_store import ResponseStore
from mlx_integrations.serve.protocol import responses as wire
from mlx_integrations.serve.server import BackgroundServer
from tests.serve.conftest import WEATHER

TOOL = {"type": "function", **WEATHER["function"]}
LOGPROBS = ["message.output_text.logprobs"]


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_previous_response_id_continues_the_conversation(client: openai.OpenAI):
    first = client.responses.create(
        model="exact",
        instructions="Be brief.",
        input="My name is Ada.",
        max_output_tokens=6,
        temperature=0,
    )
    assert first.store is True
    follow = client.responses.create(
        model="exact",
        previous_response_id=first.id,
        input="What is my name?",
        max_output_tokens=6,
        temperature=0,
    )
    assert follow.previous_response_id == first.id
    # The same conversation sent whole (the instructions are not carried over).
    whole = client.responses.create(
        model="exact",
        input=[
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
        max_output_tokens=6,
        temperature=0,
        store=False,
    )
    assert follow.usage is not None and whole.usage is not None
    assert follow.usage.input_tokens == whole.usage.input_tokens
    assert follow.output_text == whole.output_text
    # A third turn reads both earlier ones.
    third = client.responses.create(
        model="exact", previous_response_id=follow.id, input="Thanks.", max_output_tokens=2
    )
    assert third.usage is not None and third.usage.input_tokens > follow.usage.input_tokens


def test_a_continued_turn_reads_the_earlier_one_from_the_prefix_cache(client: openai.OpenAI):
    first = client.responses.create(
        model="tiny", input="Tell me about Paris.", max_output_tokens=8, temperature=0
    )
    follow = client.responses.create(
        model="tiny",
        previous_response_id=first.id,
        input="And Rome?",
        max_output_tokens=4,
        temperature=0,
    )
    assert first.usage is not None and follow.usage is not None
    cached = follow.usage.input_tokens_details.cached_tokens
    print(
        f"first turn: {first.usage.input_tokens} input tokens; continued turn: "
        f"{follow.usage.input_tokens} input tokens, {cached} of them cached"
    )
    assert cached >= first.usage.input_tokens


def test_a_tool_call_answered_through_previous_response_id(client: openai.OpenAI):
    called = client.responses.create(
        model="tiny",
        input="Weather in Paris?",
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice="required",
        max_output_tokens=64,
        temperature=0,
    )
    [call] = [item for item in called.output if item.type == "function_call"]
    answered = client.responses.create(
        model="tiny",
        previous_response_id=called.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}],
        tools=[TOOL],  # type: ignore[list-item]
        max_output_tokens=4,
        temperature=0,
    )
    assert answered.status in ("completed", "incomplete")
    assert called.usage is not None and answered.usage is not None
    assert answered.usage.input_tokens > called.usage.input_tokens


def test_get_and_delete_a_kept_response(client: openai.OpenAI, url: str):
    made = client.responses.create(model="tiny", input="Hi", max_output_tokens=3, temperature=0)
    got = client.responses.retrieve(made.id)
    assert got.model_dump() == made.model_dump()
    deleted = httpx.delete(f"{url}/v1/responses/{made.id}", timeout=60)
    assert deleted.status_code == 200
    assert deleted.json() == {"id": made.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.retrieve(made.id)
    assert made.id in caught.value.message
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model="tiny", previous_response_id=made.id, input="Hi")
    body = caught.value.body
    assert isinstance(body, dict) and body["param"] == "previous_response_id"
    assert made.id in body["message"] and "store: false" in body["message"]
    assert httpx.delete(f"{url}/v1/responses/{made.id}", timeout=60).status_code == 404


def test_a_streamed_response_is_kept_too(client: openai.OpenAI):
    with client.responses.stream(
        model="tiny", input="Hello", max_output_tokens=4, temperature=0
    ) as stream:
        final = stream.get_final_response()
    assert client.responses.retrieve(final.id).output_text == final.output_text
    follow = client.responses.create(
        model="tiny", previous_response_id=final.id, input="Again", max_output_tokens=2
    )
    assert follow.previous_response_id == final.id


def test_a_server_that_keeps_none(tiny_llama):
    config = ServeConfig(responses_store_size=0)
    with BackgroundServer(config) as base:
        body = {"model": str(tiny_llama), "input": "Hi", "max_output_tokens": 1, "store": True}
        reply = httpx.post(f"{base}/v1/responses", json=body, timeout=60)
        assert reply.status_code == 200
        assert reply.json()["store"] is False
        assert reply.headers["x-mlxi-ignored-fields"] == "store"
        assert httpx.get(f"{base}/v1/responses/{reply.json()['id']}").status_code == 404


def _response(number: int) -> wire.Response:
    return wire.Response(id=f"resp_{number}", created_at=0, model="m")


def test_the_store_is_bounded_in_size_and_time(monkeypatch: pytest.MonkeyPatch):
    clock = [100.0]
    monkeypatch.setattr(response_store.time, "monotonic", lambda: clock[0])
    store = ResponseStore(size=2, ttl_s=60)
    for number in range(3):
        store.put(_response(number), [])
    assert store.get("resp_0") is None  # the oldest went first
    assert len(store) == 2
    clock[0] += 59
    assert store.get("resp_2") is not None
    clock[0] += 2
    assert store.get("resp_2") is None and len(store) == 0
    forever = ResponseStore(size=1, ttl_s=math.inf)
    forever.put(_response(1), [])
    clock[0] += 1e9
    assert forever.get("resp_1") is not None


@pytest.mark.parametrize(
    ("ttl", "message"), [("soon", "responses_ttl must be a duration"), (0, "longer than 0")]
)
def test_bad_store_settings_name_themselves(ttl: Any, message: str):
    with pytest.raises(ValueError, match=message):
        ServeConfig(responses_ttl=ttl)
    with pytest.raises(ValueError, match="responses_store_size must be >= 0"):
        ServeConfig(responses_store_size=-1)


# ------------------------------------------------------------------ logprobs


def test_responses_give_the_answers_logprobs_as_chat_does(client: openai.OpenAI, url: str):
    reply = client.responses.create(
        model="exact",
        input="What is the weather in Paris?",
        max_output_tokens=8,
        temperature=0,
        include=LOGPROBS,  # type: ignore[list-item]
        top_logprobs=3,
    )
    [text] = reply.output[0].content  # type: ignore[union-attr]
    assert text.logprobs
    chat = openai.OpenAI(base_url=f"{url}/v1", api_key="unused").chat.completions.create(
        model="exact",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert [(t.token, t.logprob) for t in text.logprobs] == [
        (t.token, t.logprob) for t in content or []
    ]
    assert all(len(t.top_logprobs) == 3 for t in text.logprobs)

    streamed: list[Any] = []
    done: list[Any] = []
    for event in client.responses.create(
        model="exact",
        input="What is the weather in Paris?",
        max_output_tokens=8,
        temperature=0,
        include=LOGPROBS,  # type: ignore[list-item]
        top_logprobs=3,
        stream=True,
    ):
        if event.type == "response.output_text.delta":
            streamed += event.logprobs
        elif event.type == "response.output_text.done":
            done = event.logprobs
    assert (
        [t.token for t in streamed] == [t.token for t in done] == [t.token for t in text.logprobs]
    )


def test_logprobs_asked_only_through_include(url: str):
    body = {"model": "tiny", "input": "Hi", "max_output_tokens": 3, "temperature": 0}
    asked = httpx.post(f"{url}/v1/responses", json={**body, "include": LOGPROBS}, timeout=60)
    assert asked.status_code == 200
    assert "x-mlxi-ignored-fields" not in asked.headers
    assert asked.json()["output"][0]["content"][0]["logprobs"]
    alone = httpx.post(f"{url}/v1/responses", json={**body, "top_logprobs": 2}, timeout=60)
    assert alone.headers["x-mlxi-ignored-fields"] == "top_logprobs"
    assert alone.json()["output"][0]["content"][0]["logprobs"] == []
