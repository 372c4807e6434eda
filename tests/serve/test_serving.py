"""Serving behaviour: disconnects abort, limits answer with the right status, shutdown
lets replies finish, figures are in Prometheus' format, the API key is required."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from mlx_integrations.serve.config import ModelConfig, ServeConfig
from mlx_integrations.serve.server import BackgroundServer
from tests.serve.conftest import LONG, engine_of, no_eos_bias, sse_events, wait_for

USER = [{"role": "user", "content": "Tell me a long story."}]


@pytest.fixture(scope="module")
def served(long_model: Path) -> Iterator[BackgroundServer]:
    """``long`` (batched) and ``busy`` (one request at a time, refusing a second)."""
    server = BackgroundServer(
        ServeConfig(
            models=[
                ModelConfig("long", source=str(long_model), preload=True),
                ModelConfig(
                    "busy",
                    source=str(long_model),
                    engine_type="simple",
                    options={"admission": "fail_fast", "cache_memory_mb": 0},
                    preload=True,
                ),
            ],
            only_listed=True,
        )
    )
    server.start()
    yield server
    server.stop()


def _long_body(server: BackgroundServer, model: str = "long", **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": USER,
        "max_tokens": LONG,
        "temperature": 0,
        "stream": True,
        "logit_bias": no_eos_bias(engine_of(server, model)),
        **extra,
    }


def test_a_client_gone_mid_stream_aborts_its_request(served: BackgroundServer):
    engine = engine_of(served, "long")
    before = engine.get_stats()["num_requests_aborted"]
    with httpx.stream(
        "POST", f"{served.url}/v1/chat/completions", json=_long_body(served), timeout=60
    ) as response:
        events = sse_events(response)
        next(events)
        next(events)  # tokens are coming: the request runs on the engine
    # The connection is closed: the request stops between two tokens.
    wait_for(lambda: engine.get_stats()["num_requests_aborted"] == before + 1, "the abort")
    stats = engine.get_stats()
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0
    assert stats["last_request"]["completion_tokens"] < LONG  # type: ignore[index]
    # The engine serves the next request as usual.
    reply = httpx.post(
        f"{served.url}/v1/chat/completions",
        json={"model": "long", "messages": USER, "max_tokens": 3, "temperature": 0},
        timeout=60,
    )
    assert reply.status_code == 200
    assert (
        reply.json()["usage"]["completion_tokens"] == 3
        or reply.json()["choices"][0]["finish_reason"] == "stop"
    )
    metrics = httpx.get(f"{served.url}/metrics").text
    assert 'mlxi_client_disconnects_total{endpoint="/v1/chat/completions"}' in metrics


def test_a_client_gone_before_a_whole_reply_aborts_it(served: BackgroundServer):
    engine = engine_of(served, "long")
    before = engine.get_stats()["num_requests_aborted"]
    body = json.dumps({**_long_body(served), "stream": False}).encode()
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_for(lambda: engine.get_stats()["num_running"] == 1, "the request to run")
    wait_for(lambda: engine.get_stats()["num_requests_aborted"] == before + 1, "the abort")
    assert engine.get_stats()["num_running"] == 0


def test_an_anthropic_stream_gone_mid_way_aborts_too(served: BackgroundServer):
    engine = engine_of(served, "long")
    before = engine.get_stats()["num_requests_aborted"]
    body = {k: v for k, v in _long_body(served).items()}
    with httpx.stream("POST", f"{served.url}/v1/messages", json=body, timeout=60) as response:
        names = []
        for name, _ in sse_events(response):
            names.append(name)
            if name == "content_block_delta":
                break
    wait_for(lambda: engine.get_stats()["num_requests_aborted"] == before + 1, "the abort")
    assert names[0] == "message_start"


def test_a_served_batched_engine_takes_32_requests_at_once_unless_told(tiny_llama: Path):
    """A server's clients arrive together: its batched engines decode up to 32 requests
    at once (the engine alone takes 8); --max-num-seqs or a model's options set it."""
    config = ServeConfig(
        models=[
            ModelConfig("default", source=str(tiny_llama)),
            ModelConfig("four", source=str(tiny_llama), options={"max_num_seqs": 4}),
        ],
        engine_options={"cache_memory_mb": 0},
        only_listed=True,
    )
    background = BackgroundServer(config)
    with background as url:
        for name, seqs in (("default", 32), ("four", 4)):
            body = {"model": name, "messages": USER, "max_tokens": 2}
            reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
            assert reply.status_code == 200, reply.text
            engine = engine_of(background, name)
            assert type(engine).__name__ == "BatchedEngine"
            assert engine.max_num_seqs == seqs


def test_a_full_engine_answers_503_with_retry_after(served: BackgroundServer):
    engine = engine_of(served, "busy")
    with httpx.stream(
        "POST", f"{served.url}/v1/chat/completions", json=_long_body(served, "busy"), timeout=60
    ) as first:
        events = sse_events(first)  # held: a dropped reader would close the stream
        next(events)
        quick = {"model": "busy", "messages": USER, "max_tokens": 2}
        second = httpx.post(f"{served.url}/v1/chat/completions", json=quick, timeout=60)
        assert second.status_code == 503
        assert second.headers["retry-after"] == "1"
        assert second.json()["error"]["code"] == "engine_busy"
        third = httpx.post(f"{served.url}/v1/messages", json=quick, timeout=60)
        assert third.status_code == 503
        assert third.json()["error"]["type"] == "overloaded_error"
    wait_for(lambda: engine.get_stats()["num_running"] == 0, "the abort")
    metrics = httpx.get(f"{served.url}/metrics").text
    assert 'mlxi_rejected_requests_total{reason="engine_busy"} 2' in metrics


def test_past_max_concurrent_requests_answers_429(long_model: Path):
    config = ServeConfig(
        models=[ModelConfig("long", source=str(long_model), preload=True)],
        max_concurrent_requests=1,
    )
    with BackgroundServer(config) as url:
        body = {
            "model": "long",
            "messages": USER,
            "max_tokens": LONG,
            "temperature": 0,
            "stream": True,
        }
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as first:
            events = sse_events(first)  # held: a dropped reader would close the stream
            next(events)
            with pytest.raises(openai.RateLimitError) as caught:
                client.chat.completions.create(model="long", messages=USER, max_tokens=2)  # type: ignore[arg-type]
            assert caught.value.response.headers["retry-after"] == "1"
            assert httpx.get(f"{url}/health").status_code == 200  # not counted


def test_shutdown_lets_a_reply_in_flight_finish(long_model: Path):
    server = BackgroundServer(
        ServeConfig(
            models=[ModelConfig("long", source=str(long_model), preload=True)],
            shutdown_timeout_s=300,
        )
    )
    server.start()
    body = {**_long_body(server), "max_tokens": 200, "stream_options": {"include_usage": True}}
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json=body, timeout=120
    ) as response:
        events = sse_events(response)
        next(events)
        server.begin_shutdown()  # what SIGTERM does
        rest = [data for _, data in events]
    assert rest[-1] == "[DONE]"
    assert rest[-2]["usage"]["completion_tokens"] == 200  # type: ignore[index]
    server.stop()
    assert server.stopped
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/health", timeout=5)


def test_shutdown_deadline_ends_what_is_left_with_its_closing_event(long_model: Path):
    server = BackgroundServer(
        ServeConfig(
            models=[ModelConfig("long", source=str(long_model), preload=True)], shutdown_timeout_s=1
        )
    )
    server.start()
    engine = engine_of(server, "long")
    before = engine.get_stats()["num_requests_aborted"]
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json=_long_body(server), timeout=120
    ) as response:
        events = sse_events(response)
        next(events)
        server.begin_shutdown()
        rest = [data for _, data in events]
    # Past shutdown_timeout_s the reply ends as OpenAI's streams end on an error.
    assert rest[-1] == "[DONE]"
    assert rest[-2]["error"]["code"] == "shutting_down"  # type: ignore[index]
    server.stop()
    wait_for(lambda: engine.get_stats()["num_requests_aborted"] == before + 1, "the abort")


def test_draining_refuses_new_requests(served: BackgroundServer):
    served.state.draining = True
    try:
        health = httpx.get(f"{served.url}/health")
        assert health.status_code == 503
        reply = httpx.post(
            f"{served.url}/v1/chat/completions", json={"model": "long", "messages": USER}
        )
        assert reply.status_code == 503 and reply.headers["retry-after"] == "1"
        assert reply.json()["error"]["code"] == "shutting_down"
    finally:
        served.state.draining = False
    assert httpx.get(f"{served.url}/health").json() == {"status": "ok"}


def test_metrics_are_prometheus_text(served: BackgroundServer):
    httpx.post(
        f"{served.url}/v1/chat/completions",
        json={"model": "long", "messages": USER, "max_tokens": 3, "stream": True},
        timeout=60,
    )
    response = httpx.get(f"{served.url}/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = response.text
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert line.split()[1] in ("HELP", "TYPE")
            continue
        name, value = line.rsplit(" ", 1)
        samples[name] = float(value)
    assert samples['mlxi_requests_total{endpoint="/v1/chat/completions",status="200"}'] >= 1
    assert samples['mlxi_time_to_first_token_seconds_count{model="long"}'] >= 1
    assert samples['mlxi_time_to_first_token_seconds_bucket{model="long",le="+Inf"}'] >= 1
    assert samples['mlxi_generation_tokens_total{model="long"}'] >= 3
    assert samples['mlxi_model_loaded{model="long"}'] == 1
    assert samples['mlxi_model_memory_bytes{model="long"}'] > 0
    assert 'mlxi_prefix_cache_hits_total{model="long"}' in samples
    assert 'mlxi_engine_requests_waiting{model="busy"}' in samples
    assert samples["mlxi_requests_in_flight"] == 0


def test_the_api_key_is_required_except_for_health(tiny_llama: Path):
    config = ServeConfig(models=[ModelConfig("tiny", source=str(tiny_llama))], api_key="s3cret")
    with BackgroundServer(config) as url:
        assert httpx.get(f"{url}/health").status_code == 200
        with pytest.raises(openai.AuthenticationError) as caught:
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
        assert caught.value.body["code"] == "invalid_api_key"  # type: ignore[index]
        assert httpx.get(f"{url}/metrics").status_code == 401
        ok = openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret", max_retries=0)
        assert ok.chat.completions.create(model="tiny", messages=USER, max_tokens=2).choices  # type: ignore[arg-type]
        with pytest.raises(anthropic.AuthenticationError) as denied:
            anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0).messages.create(
                model="tiny",
                messages=USER,
                max_tokens=2,  # type: ignore[arg-type]
            )
        assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
        reply = anthropic.Anthropic(base_url=url, api_key="s3cret", max_retries=0).messages.create(
            model="tiny",
            messages=USER,
            max_tokens=2,  # type: ignore[arg-type]
        )
        assert reply.usage.output_tokens > 0


def test_a_body_over_the_limit_is_a_413(tiny_llama: Path):
    config = ServeConfig(models=[ModelConfig("tiny", source=str(tiny_llama))], max_body_mb=0.01)
    big = {"model": "tiny", "messages": [{"role": "user", "content": "x" * 20000}]}
    with BackgroundServer(config) as url:
        declared = httpx.post(f"{url}/v1/chat/completions", json=big)
        assert declared.status_code == 413
        assert "--max-body-mb" in declared.json()["error"]["message"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
            data = json.dumps(big).encode()
            for i in range(0, len(data), 1000):
                yield data[i : i + 1000]

        streamed = httpx.post(f"{url}/v1/messages", content=chunks())
        assert streamed.status_code == 413
        assert streamed.json()["error"]["type"] == "request_too_large"


def test_unknown_endpoints_and_bad_json(url: str):
    missing = httpx.get(f"{url}/v2/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_endpoint"
    bad = httpx.post(f"{url}/v1/chat/completions", content=b"{not json")
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
    no_model = httpx.post(f"{url}/v1/chat/completions", json={"messages": USER})
    assert no_model.status_code == 400 and no_model.json()["error"]["param"] == "model"
