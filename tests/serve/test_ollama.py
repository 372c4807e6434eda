"""Ollama's API on ``mlxi serve``, through ``ollama-python`` (and httpx where a client
cannot say it): the same engines and chat core as the OpenAI endpoint, Ollama's
shapes, names, counters, streams and errors."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import ollama
import pytest

from mlx_integrations.serve.config import ModelConfig, ServeConfig
from mlx_integrations.serve.server import BackgroundServer
from tests.serve.conftest import CITY_SCHEMA, LONG, WEATHER, engine_of, wait_for
from tests.support.thinking import QWEN3_TEMPLATE, build_thinking_model

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0, "num_predict": 6}


@pytest.fixture(scope="module")
def server(
    tiny_llama: Path,
    thinking_model: Path,
    long_model: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[BackgroundServer]:
    """``tiny`` (no prefix cache: greedy replies do not depend on what was cached),
    ``thinker`` (its prompt opens a thinking block), ``qwen3`` (Qwen3's switch) and
    ``long`` (64k context: greedy, it writes until num_predict)."""
    qwen3 = build_thinking_model(tmp_path_factory.mktemp("ollama-qwen3"), QWEN3_TEMPLATE)
    config = ServeConfig(
        models=[
            ModelConfig(
                "tiny", source=str(tiny_llama), options={"cache_memory_mb": 0}, preload=True
            ),
            ModelConfig("thinker", source=str(thinking_model)),
            ModelConfig("qwen3", source=str(qwen3)),
            ModelConfig("long", source=str(long_model)),
        ],
        only_listed=True,
    )
    background = BackgroundServer(config)
    background.start()
    yield background
    background.stop()


@pytest.fixture(scope="module")
def url(server: BackgroundServer) -> str:
    return server.url


@pytest.fixture(scope="module")
def client(url: str) -> ollama.Client:
    return ollama.Client(host=url)


def openai_chat(url: str, **body: Any) -> dict[str, Any]:
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


# ------------------------------------------------------------------ discovery


def test_the_probes_clients_send(url: str):
    root = httpx.get(f"{url}/")
    assert root.status_code == 200 and root.text == "Ollama is running"
    assert root.headers["content-type"].startswith("text/plain")
    assert httpx.head(f"{url}/").status_code == 200  # Claude Code's probe, too
    version = httpx.get(f"{url}/api/version").json()
    assert version["version"].count(".") == 2 and version["mlxi"]


def test_tags_list_each_model_as_name_latest_and_show_reads_its_files(client: ollama.Client):
    listed = {m.model: m for m in client.list().models}
    assert set(listed) == {"tiny:latest", "thinker:latest", "qwen3:latest", "long:latest"}
    tiny = listed["tiny:latest"]
    assert tiny.size and tiny.size > 100_000 and len(tiny.digest or "") == 64
    assert tiny.details and tiny.details.family == "llama"
    assert tiny.details.parameter_size.endswith("K")

    shown = client.show("tiny")  # and the same under its Ollama name
    assert client.show("tiny:latest").template == shown.template
    assert "<|im_start|>" in (shown.template or "")
    assert shown.capabilities == ["completion", "tools"]
    assert shown.modelinfo["llama.context_length"] == 4096
    assert shown.details and shown.details.quantization_level == "F32"
    assert "thinking" in (client.show("thinker").capabilities or [])
    assert "thinking" in (client.show("qwen3").capabilities or [])


# ------------------------------------------------------------------------ chat


def test_chat_is_the_openai_endpoints_turn_in_ollamas_shape(client: ollama.Client, url: str):
    reply = client.chat(model="tiny", messages=USER, options=GREEDY)
    same = openai_chat(url, model="tiny", messages=USER, max_tokens=6, temperature=0)
    assert reply.message.role == "assistant"
    assert reply.message.content == same["choices"][0]["message"]["content"]
    assert reply.model == "tiny" and reply.done and reply.done_reason == "length"
    assert reply.prompt_eval_count == same["usage"]["prompt_tokens"]
    assert reply.eval_count == 6
    for duration in ("total_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(getattr(reply, duration), int) and getattr(reply, duration) > 0
    assert reply.total_duration >= reply.eval_duration  # type: ignore[operator]

    streamed = list(client.chat(model="tiny:latest", messages=USER, options=GREEDY, stream=True))
    assert [c.done for c in streamed] == [False] * (len(streamed) - 1) + [True]
    assert "".join(c.message.content or "" for c in streamed) == reply.message.content
    last = streamed[-1]
    assert last.done_reason == "length" and last.eval_count == 6 and last.message.content == ""


def test_a_stream_is_ndjson_with_ollamas_fields(url: str):
    body = {"model": "tiny", "messages": USER, "options": GREEDY}
    with httpx.stream("POST", f"{url}/api/chat", json=body, timeout=60) as response:
        assert response.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert set(lines[0]) == {"model", "created_at", "done", "message"}
    assert lines[0]["created_at"].endswith("Z")
    assert set(lines[-1]) >= {
        "done_reason",
        "total_duration",
        "load_duration",
        "prompt_eval_count",
        "prompt_eval_duration",
        "eval_count",
        "eval_duration",
    }


def test_options_are_the_sampling_fields(client: ollama.Client, url: str):
    options = {"temperature": 0.9, "top_p": 0.8, "top_k": 20, "seed": 7, "repeat_penalty": 1.3}
    one = client.chat(model="tiny", messages=USER, options={**options, "num_predict": 8})
    two = client.chat(model="tiny", messages=USER, options={**options, "num_predict": 8})
    assert one.message.content == two.message.content  # seeded
    same = openai_chat(
        url,
        model="tiny",
        messages=USER,
        max_tokens=8,
        temperature=0.9,
        top_p=0.8,
        top_k=20,
        seed=7,
        repetition_penalty=1.3,
    )
    assert one.message.content == same["choices"][0]["message"]["content"]
    first = one.message.content or ""
    assert len(first) > 2
    stop = first[1:3]
    cut = client.chat(
        model="tiny", messages=USER, options={**options, "num_predict": 8, "stop": [stop]}
    )
    assert cut.done_reason == "stop" and stop not in (cut.message.content or "")


def test_a_format_schema_always_holds(client: ollama.Client):
    """A random model writes anything; the schema holds by construction, streamed or not."""
    rng = random.Random(5)
    for _ in range(4):
        options = {"temperature": 1.0, "seed": rng.randrange(10_000), "num_predict": 48}
        reply = client.chat(model="tiny", messages=USER, format=CITY_SCHEMA, options=options)
        jsonschema.validate(json.loads(reply.message.content or ""), CITY_SCHEMA)
        parts = client.chat(
            model="tiny", messages=USER, format=CITY_SCHEMA, options=options, stream=True
        )
        text = "".join(p.message.content or "" for p in parts)
        assert text == reply.message.content
        generated = client.generate(
            model="tiny", prompt="A city:", format=CITY_SCHEMA, options=options
        )
        jsonschema.validate(json.loads(generated.response), CITY_SCHEMA)


def test_a_tool_loop_renders_as_on_the_openai_endpoint(client: ollama.Client, url: str):
    """Ollama's arguments are objects and a tool message names its tool (or answers the
    earlier calls in order): the prompt is the OpenAI conversation's, token for token."""
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    loop = [
        *USER,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
    ]
    reply = client.chat(model="tiny", messages=loop, tools=[WEATHER], options=GREEDY)
    openai_loop = [
        *USER,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1_0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1_0"},
    ]
    # ollama-python sends the tool's schema with its keys in its own order.
    sent = ollama.Tool.model_validate(WEATHER).model_dump(exclude_none=True, by_alias=True)
    same = openai_chat(
        url, model="tiny", messages=openai_loop, tools=[sent], max_tokens=6, temperature=0
    )
    assert reply.prompt_eval_count == same["usage"]["prompt_tokens"]
    assert reply.message.content == same["choices"][0]["message"]["content"]
    without = client.chat(model="tiny", messages=USER, tools=[WEATHER], options=GREEDY)
    assert reply.prompt_eval_count > without.prompt_eval_count  # type: ignore[operator]


def test_thinking_comes_in_message_thinking(client: ollama.Client, url: str):
    reply = client.chat(
        model="thinker", messages=USER, options={"temperature": 0, "num_predict": 12}
    )
    same = openai_chat(url, model="thinker", messages=USER, max_tokens=12, temperature=0)
    message = same["choices"][0]["message"]
    assert reply.message.thinking and reply.message.thinking == message["reasoning_content"]
    assert (reply.message.content or "") == (message["content"] or "")
    streamed = list(
        client.chat(
            model="thinker",
            messages=USER,
            options={"temperature": 0, "num_predict": 12},
            stream=True,
        )
    )
    assert "".join(c.message.thinking or "" for c in streamed) == reply.message.thinking


def test_think_is_the_templates_switch(client: ollama.Client):
    """Qwen3's template writes an empty thinking block when thinking is off."""

    def prompt(**think: Any) -> int:
        reply = client.chat(model="qwen3", messages=USER, options={"num_predict": 1}, **think)
        return int(reply.prompt_eval_count or 0)

    assert prompt(think=True) == prompt() < prompt(think=False)
    assert prompt(think="high") == prompt(think=True)
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model="qwen3", messages=USER, think="low")
    assert refused.value.status_code == 400
    assert "'none', 'high', not 'low'" in refused.value.error


def test_generate_is_a_chat_turn_of_its_prompt_and_raw_skips_the_template(
    client: ollama.Client, url: str
):
    generated = client.generate(model="tiny", prompt=USER[0]["content"], options=GREEDY)
    chatted = client.chat(model="tiny", messages=USER, options=GREEDY)
    assert generated.response == chatted.message.content
    assert generated.prompt_eval_count == chatted.prompt_eval_count

    system = client.generate(
        model="tiny", prompt=USER[0]["content"], system="Be brief.", options=GREEDY
    )
    assert system.prompt_eval_count > generated.prompt_eval_count  # type: ignore[operator]

    raw = client.generate(model="tiny", prompt="Once upon a time", raw=True, options=GREEDY)
    completed = httpx.post(
        f"{url}/v1/completions",
        json={"model": "tiny", "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0},
    ).json()
    assert raw.response == completed["choices"][0]["text"]
    assert raw.prompt_eval_count == completed["usage"]["prompt_tokens"]
    streamed = list(
        client.generate(
            model="tiny", prompt="Once upon a time", raw=True, options=GREEDY, stream=True
        )
    )
    assert "".join(p.response for p in streamed) == raw.response and streamed[-1].done


def test_num_ctx_bounds_the_prompt_and_the_reply(client: ollama.Client):
    prompt = int(
        client.chat(model="tiny", messages=USER, options={"num_predict": 1}).prompt_eval_count or 0
    )
    room = client.chat(
        model="tiny", messages=USER, options={"num_ctx": prompt + 3, "num_predict": 50}
    )
    assert room.eval_count == 3 and room.done_reason == "length"
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model="tiny", messages=USER, options={"num_ctx": prompt - 1})
    assert refused.value.status_code == 400 and "options.num_ctx" in refused.value.error


def test_a_client_gone_mid_stream_aborts_its_request(server: BackgroundServer, url: str):
    engine = engine_of(server, "long")
    body = {"model": "long", "messages": USER, "options": {"temperature": 0, "num_predict": LONG}}
    # Loaded first (a request without messages), so the stream starts at once.
    httpx.post(f"{url}/api/chat", json={"model": "long", "messages": []}, timeout=120)
    before = engine.get_stats()["num_requests_aborted"]
    with httpx.stream("POST", f"{url}/api/chat", json=body, timeout=60) as response:
        first = json.loads(next(response.iter_lines()))
        assert first["done"] is False
    wait_for(lambda: engine.get_stats()["num_requests_aborted"] == before + 1, "the abort")
    assert engine.get_stats()["num_running"] == 0
    metrics = httpx.get(f"{url}/metrics").text
    assert 'mlxi_client_disconnects_total{endpoint="/api/chat"}' in metrics


# -------------------------------------------------------------- residency


def test_keep_alive_is_the_models_and_a_request_without_input_loads_or_unloads(
    client: ollama.Client, server: BackgroundServer, url: str
):
    engine = engine_of(server, "tiny")
    client.chat(model="tiny", messages=USER, options={"num_predict": 1}, keep_alive="10m")
    assert engine.keep_alive == 600
    client.chat(model="tiny", messages=USER, options={"num_predict": 1})
    assert engine.keep_alive == 300  # the server's default again, as Ollama's

    unloaded = client.generate(model="tiny", keep_alive=0)
    assert unloaded.done and unloaded.done_reason == "unload"
    wait_for(lambda: not engine.is_loaded, "the model to unload")
    assert "tiny:latest" not in [m.name for m in client.ps().models]
    loaded = client.chat(model="tiny:latest", messages=[])
    assert loaded.done_reason == "load" and engine.is_loaded
    [running] = [m for m in client.ps().models if m.name == "tiny:latest"]
    assert running.model == "tiny:latest"
    assert running.size and running.size_vram == running.size
    assert running.expires_at is not None and running.context_length == 4096
    [row] = [m for m in httpx.get(f"{url}/api/ps").json()["models"] if m["name"] == "tiny:latest"]
    assert row["kind"] == "chat" and row["keep_alive_s"] == 300 and row["source"]


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"model": "nothing"}, 404, "this server serves only: tiny, thinker, qwen3, long"),
        ({"model": "tiny:7b"}, 404, "tags other than ':latest'"),
        ({"options": {"temperature": "hot"}}, 400, "'options.temperature' must be a number"),
        ({"options": {"num_predict": 0}}, 400, "options.num_predict"),
        ({"format": "yaml"}, 400, "'format'"),
        ({"logprobs": True}, 400, "no token probabilities"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, 400, "'messages[0].role'"),
        (
            {"messages": [{"role": "system", "content": "x", "images": ["aGk="]}]},
            400,
            "images go in user messages",
        ),
    ],
)
def test_errors_are_ollamas_shape_and_name_the_field(url: str, body, status, says):
    request = {"model": "tiny", "messages": USER, "stream": False, **body}
    reply = httpx.post(f"{url}/api/chat", json=request, timeout=60)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert isinstance(error, str) and says in error, error


def test_fields_it_does_not_use_are_accepted_and_named(url: str):
    body = {
        "model": "tiny",
        "messages": USER,
        "stream": False,
        "options": {"num_predict": 1, "num_gpu": 99, "mirostat": 0},
        "client_hint": "x",
    }
    reply = httpx.post(f"{url}/api/chat", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-mlxi-ignored-fields"] == "options.mirostat,options.num_gpu,client_hint"


def test_what_ollama_has_and_this_server_does_not_is_refused_clearly(url: str):
    create = httpx.post(f"{url}/api/create", json={"model": "x", "from": "tiny"})
    assert create.status_code == 501 and "mlxi import" in create.json()["error"]
    template = httpx.post(
        f"{url}/api/generate",
        json={"model": "tiny", "prompt": "hi", "template": "{{ .Prompt }}", "stream": False},
    )
    assert template.status_code == 400 and "raw: true" in template.json()["error"]
    # /api/stop stays this server's own (mlxi stop reads OpenAI's error shape).
    stop = httpx.post(f"{url}/api/stop", json={"model": "other"})
    assert stop.status_code == 404 and "not loaded" in stop.json()["error"]["message"]


def test_with_an_api_key_ollama_clients_send_it_from_ollama_api_key(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
):
    config = ServeConfig(models=[ModelConfig("tiny", source=str(tiny_llama))], api_key="s3cret")
    with BackgroundServer(config) as base:
        with pytest.raises(ollama.ResponseError) as refused:
            ollama.Client(host=base).list()
        assert refused.value.status_code == 401 and "API key" in refused.value.error
        assert httpx.get(f"{base}/").text == "Ollama is running"  # the probe needs no key
        monkeypatch.setenv("OLLAMA_API_KEY", "s3cret")
        assert "tiny:latest" in [m.model for m in ollama.Client(host=base).list().models]


def test_a_request_without_a_model_says_what_to_send(url: str):
    reply = httpx.post(f"{url}/api/show", json={})
    assert reply.status_code == 400
    assert reply.json()["error"].startswith("The request body must name its model in 'model'")
