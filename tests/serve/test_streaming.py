"""Streams that long prompts and slow machines survive: the headers go out once the
prompt is counted, keep-alives come while it is processed, a client gone during the
prefill frees the engine, and a server that stops ends each stream with its API's
closing event.

The prefill is held by the test, not timed: the engine's model is wrapped so that each
prefill piece waits for an event the test sets. Nothing here depends on how fast the
machine is; the bounds are only there so that a broken server fails instead of hanging.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlx_integrations.serve.config import ModelConfig, ServeConfig
from mlx_integrations.serve.server import BackgroundServer
from tests.serve.conftest import engine_of, sse_events, wait_for

# Options of their own: this engine is not shared with other modules' servers, whose
# requests must not meet a held prefill. No prefix cache: every request prefills.
HELD_OPTIONS = {"prefill_step_size": 8, "cache_memory_mb": 0}
KEEPALIVE_S = 0.2
LONG_PROMPT = [{"role": "user", "content": "one two three four five six seven eight " * 12}]
SECONDS = 30  # a bound, not a measure: only a broken server comes near it


class HeldPrefill:
    """An engine's model whose prefill pieces (forward passes over more than one
    token) wait until :attr:`release` is set; decoding steps pass.

    Attributes:
        release: Set by the test to let the prefill go on.
        entered: Set once a prefill piece is waiting (or has run).
        pieces: Prefill pieces started.
    """

    def __init__(self, model: Any):
        self.model = model
        self.release = threading.Event()
        self.entered = threading.Event()
        self.pieces = 0

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if inputs.shape[1] > 1:
            self.pieces += 1
            self.entered.set()
            # The bound frees the owner thread should a test fail before it releases.
            self.release.wait(SECONDS * 4)
        return self.model(inputs, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


@contextmanager
def held(engine: Any) -> Iterator[HeldPrefill]:
    """The engine's prefill held until the block releases it (or ends)."""
    hold = HeldPrefill(engine._model)
    engine._model = hold
    try:
        yield hold
    finally:
        hold.release.set()
        wait_for(lambda: engine.get_stats()["num_running"] == 0, "the held request to end")
        engine._model = hold.model


def _config(tiny_llama: Path, engine_type: str = "batched", **settings: Any) -> ServeConfig:
    model = ModelConfig(
        "held",
        source=str(tiny_llama),
        engine_type=engine_type,
        options=dict(HELD_OPTIONS),
        preload=True,
    )
    return ServeConfig(models=[model], only_listed=True, stream_keepalive_s=KEEPALIVE_S, **settings)


@pytest.fixture(scope="module", params=["batched", "simple"])
def server(tiny_llama: Path, request: pytest.FixtureRequest) -> Iterator[BackgroundServer]:
    """A server of the model ``held`` on either engine (batched is the default)."""
    background = BackgroundServer(_config(tiny_llama, request.param))
    background.start()
    yield background
    background.stop()


# Each API: its path, a streamed body, how its keep-alive reads, how its stream ends.
APIS = {
    "chat": ("/v1/chat/completions", {"messages": LONG_PROMPT, "max_tokens": 3}),
    "messages": ("/v1/messages", {"messages": LONG_PROMPT, "max_tokens": 3}),
    "responses": ("/v1/responses", {"input": LONG_PROMPT, "max_output_tokens": 3}),
}


def _body(api: str) -> dict[str, Any]:
    return {"model": "held", "stream": True, "temperature": 0, **APIS[api][1]}


def _frames(lines: Iterator[str]) -> Iterator[tuple[str | None, str]]:
    """(event name, data) of each event, and ``(":", ": keepalive")`` for a comment."""
    name = None
    for line in lines:
        if line.startswith(":"):
            yield ":", line
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            yield name, line[6:]
            name = None


def _until_keepalive(frames: Iterator[tuple[str | None, str]], api: str) -> list[Any]:
    """The frames up to the first keep-alive (Anthropic's: a ping after the one that
    follows message_start)."""
    seen: list[Any] = []
    pings = 0
    for name, data in frames:
        seen.append((name, data))
        if api == "messages" and name == "ping":
            pings += 1
            if pings == 2:
                return seen
        elif api != "messages" and name == ":":
            return seen
    raise AssertionError(f"the stream ended without a keep-alive: {seen}")


@pytest.mark.parametrize("api", APIS)
def test_headers_and_keepalives_come_while_the_prompt_is_processed(
    server: BackgroundServer, api: str
):
    engine = engine_of(server, "held")
    path = APIS[api][0]
    with (
        held(engine) as hold,
        httpx.stream("POST", server.url + path, json=_body(api), timeout=SECONDS) as response,
    ):
        # The status line came while no token can exist: the prefill is held.
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        frames = _frames(response.iter_lines())
        before = _until_keepalive(frames, api)
        assert hold.entered.wait(SECONDS) and not hold.release.is_set()
        hold.release.set()
        after = list(frames)
    names = [name for name, _ in before]
    if api == "chat":  # the role, then the keep-alive comment
        assert len(before) == 2 and json.loads(before[0][1])["choices"][0]["delta"]["role"]
        assert before[-1][1] == ": keepalive" and after[-1][1] == "[DONE]"
    elif api == "messages":  # message_start first, then pings only
        assert names == ["message_start", "ping", "ping"]
        assert after[-1][0] == "message_stop"
    else:
        assert names == ["response.created", "response.in_progress", ":"]
        assert after[-1][0] == "response.completed"


def test_message_start_carries_the_prompt_tokens(server: BackgroundServer):
    body = _body("messages")
    counted = httpx.post(f"{server.url}/v1/messages/count_tokens", json=body, timeout=SECONDS)
    with httpx.stream("POST", f"{server.url}/v1/messages", json=body, timeout=SECONDS) as reply:
        events = list(sse_events(reply))
    start = events[0][1]["message"]["usage"]
    end = events[-2][1]["usage"]
    assert start["input_tokens"] == counted.json()["input_tokens"] > 20
    # At the end the count splits into fresh and cached tokens, adding up the same.
    assert end["input_tokens"] + end["cache_read_input_tokens"] == start["input_tokens"]


def _disconnects(server: BackgroundServer, path: str) -> float:
    return server.state.metrics.count("client_disconnects_total", endpoint=path)


@pytest.mark.parametrize("api", APIS)
def test_a_client_gone_while_its_prompt_is_processed_frees_the_engine(
    server: BackgroundServer, api: str
):
    engine = engine_of(server, "held")
    path = APIS[api][0]
    before = engine.get_stats()["num_requests_aborted"]
    gone = _disconnects(server, path)
    with held(engine) as hold:
        with httpx.stream("POST", server.url + path, json=_body(api), timeout=SECONDS):
            assert hold.entered.wait(SECONDS)  # the prefill has begun, and waits
            assert engine.get_stats()["num_running"] == 1
        # The client has gone: the server sees it while the prefill is still held...
        wait_for(lambda: _disconnects(server, path) == gone + 1, "the disconnect", SECONDS)
        assert not hold.release.is_set()
        hold.release.set()
        # ...and the request stops after the piece in progress, not at the prompt's end.
        wait_for(lambda: engine.get_stats()["num_running"] == 0, "the engine free", SECONDS)
    stats = engine.get_stats()
    assert stats["num_requests_aborted"] == before + 1 and stats["num_waiting"] == 0
    assert stats["last_request"]["prompt_tokens"] > 8 * 4  # type: ignore[index]
    assert hold.pieces < stats["last_request"]["prompt_tokens"] // 8  # type: ignore[index]
    # The engine serves the next request as usual.
    reply = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "held", "messages": LONG_PROMPT, "max_tokens": 2},
        timeout=SECONDS,
    )
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] <= 2


CLOSINGS = {
    "chat": lambda frames: (
        frames[-1][1] == "[DONE]" and json.loads(frames[-2][1])["error"]["code"] == "shutting_down"
    ),
    "messages": lambda frames: (
        frames[-1][0] == "error"
        and json.loads(frames[-1][1])["error"]["type"] == "overloaded_error"
    ),
    "responses": lambda frames: (
        frames[-1][0] == "response.failed"
        and json.loads(frames[-1][1])["response"]["error"]["code"] == "shutting_down"
    ),
}


def test_a_stopping_server_ends_each_stream_with_its_closing_event(tiny_llama: Path):
    """Past ``shutdown_timeout_s`` (at once on Ctrl-C), each stream still running ends
    as its API ends a stream on an error, and every engine request is aborted."""
    server = BackgroundServer(_config(tiny_llama, shutdown_timeout_s=0.5))
    server.start()
    engine = engine_of(server, "held")
    before = engine.get_stats()["num_requests_aborted"]
    ended: dict[str, list[Any]] = {}
    try:
        with held(engine) as hold:
            with (
                httpx.stream(
                    "POST", f"{server.url}/v1/chat/completions", json=_body("chat"), timeout=SECONDS
                ) as chat,
                httpx.stream(
                    "POST", f"{server.url}/v1/messages", json=_body("messages"), timeout=SECONDS
                ) as messages,
                httpx.stream(
                    "POST", f"{server.url}/v1/responses", json=_body("responses"), timeout=SECONDS
                ) as responses,
            ):
                # One prefill held, two requests waiting behind it: all three
                # streams have their headers.
                assert hold.entered.wait(SECONDS)
                server.begin_shutdown()  # what SIGTERM does
                for api, reply in (
                    ("chat", chat),
                    ("messages", messages),
                    ("responses", responses),
                ):
                    ended[api] = [f for f in _frames(reply.iter_lines()) if f[0] != ":"]
            assert not hold.release.is_set()  # they ended while the prefill was held
    finally:
        server.stop()
    for api, frames in ended.items():
        assert CLOSINGS[api](frames), (api, frames[-3:])
    wait_for(
        lambda: engine.get_stats()["num_requests_aborted"] == before + 3, "the aborts", SECONDS
    )


def test_an_answer_not_begun_gets_503_when_the_server_stops(tiny_llama: Path):
    server = BackgroundServer(_config(tiny_llama, shutdown_timeout_s=0.5))
    server.start()
    engine = engine_of(server, "held")
    body = {"model": "held", "messages": LONG_PROMPT, "max_tokens": 2}
    answers: list[httpx.Response] = []
    try:
        with held(engine) as hold:
            asker = threading.Thread(
                target=lambda: answers.append(
                    httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=SECONDS)
                )
            )
            asker.start()
            assert hold.entered.wait(SECONDS)
            server.begin_shutdown()
            asker.join(SECONDS)
    finally:
        server.stop()
    [answer] = answers
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "shutting_down"
    assert re.fullmatch(r"\d+", answer.headers["retry-after"])
