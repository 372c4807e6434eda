"""``mlxi serve`` as a process (SIGTERM lets a reply finish), ``mlxi ps`` and ``mlxi stop``
against a running server, the config file."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mlx_integrations.cli.main import app
from typer.testing import CliRunner

from mlx_integrations.serve.config import ModelConfig, ServeConfig
from mlx_integrations.serve.server import BackgroundServer, security_warnings
from tests.serve.conftest import LONG, engine_of, no_eos_bias, sse_events, wait_for
from tests.support.tiny_models import build_tiny_model

USER = [{"role": "user", "content": "Hello"}]


def mlxi(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env=env)


@pytest.fixture
def serve_process(
    long_model: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[subprocess.Popen, str]]:
    """``mlxi serve MODEL --port 0`` (and the options a test gives as its parameter),
    and the URL it prints once it serves. Should the process abort, Python's fault
    handler writes every thread's stack to the stderr that the tests' messages end with."""
    env = {**os.environ, "MLXI_HOME": str(tmp_path / "home"), "PYTHONFAULTHANDLER": "1"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlx_integrations.cli",
            "serve",
            str(long_model),
            "--port",
            "0",
            "--log-level",
            "warning",
            *getattr(request, "param", []),
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stderr is not None
    url = None
    lines = []
    for line in process.stderr:  # the announcement comes once the model is loaded
        lines.append(line)
        found = re.search(r"at (http://127\.0\.0\.1:\d+) ", line)
        if found:
            url = found.group(1)
            break
    assert url is not None, "".join(lines)
    try:
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def test_sigterm_lets_the_reply_in_flight_finish(serve_process, long_model: Path):
    process, url = serve_process
    bias = no_eos_bias(long_model)
    body = {
        "model": str(long_model),
        "messages": USER,
        "max_tokens": 100,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logit_bias": bias,
    }
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as response:
        events = sse_events(response)
        next(events)
        process.send_signal(signal.SIGTERM)
        rest = [data for _, data in events]
    assert rest[-1] == "[DONE]"
    assert rest[-2]["usage"]["completion_tokens"] == 100  # type: ignore[index]
    code = process.wait(timeout=120)
    assert code == 0, process.stderr.read()[-3000:] if process.stderr else code


def _endless(long_model: Path) -> dict[str, object]:
    return {
        "model": str(long_model),
        "messages": USER,
        "max_tokens": LONG,
        "temperature": 0,
        "stream": True,
        "logit_bias": no_eos_bias(long_model),
    }


def test_ctrl_c_ends_the_stream_in_flight_in_one_line(serve_process, long_model: Path):
    """Ctrl-C stops at once: the stream in flight ends as OpenAI's streams end on an
    error, the server says so in one line (no traceback) and exits 0."""
    process, url = serve_process
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=_endless(long_model), timeout=120
    ) as response:
        events = sse_events(response)
        next(events)
        process.send_signal(signal.SIGINT)
        rest = [data for _, data in events]
    assert rest[-1] == "[DONE]"
    assert rest[-2]["error"]["code"] == "shutting_down"  # type: ignore[index]
    code = process.wait(timeout=120)
    said = process.stderr.read() if process.stderr else ""
    assert code == 0, said[-3000:]
    assert said.splitlines() == ["mlxi serve: stopped (Ctrl-C); 1 reply still running ended"]


@pytest.mark.parametrize("serve_process", [["--shutdown-timeout", "1"]], indirect=True)
def test_sigterm_ends_what_outlasts_the_shutdown_timeout(serve_process, long_model: Path):
    process, url = serve_process
    body = {**_endless(long_model), "messages": [{"role": "user", "content": "Hi"}]}
    with httpx.stream("POST", f"{url}/v1/messages", json=body, timeout=120) as response:
        events = sse_events(response)
        next(events)
        process.send_signal(signal.SIGTERM)
        rest = list(events)
    assert rest[-1][0] == "error"
    assert rest[-1][1]["error"]["type"] == "overloaded_error"  # type: ignore[index]
    code = process.wait(timeout=120)
    said = process.stderr.read() if process.stderr else ""
    assert code == 0, said[-3000:]
    assert said.splitlines() == [
        "mlxi serve: stopped (SIGTERM); 1 reply still running after 1 s ended"
    ]


@pytest.fixture(scope="module")
def server(tiny_llama: Path) -> Iterator[BackgroundServer]:
    background = BackgroundServer(
        ServeConfig(models=[ModelConfig("tiny", source=str(tiny_llama), preload=True)])
    )
    background.start()
    yield background
    background.stop()


def test_ps_and_stop_talk_to_the_server(server: BackgroundServer):
    httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "tiny", "messages": USER, "max_tokens": 2},
    )
    shown = mlxi("ps", "--server", server.url)
    assert shown.exit_code == 0, shown.output
    assert re.search(r"^tiny\s+chat\s+\S+ \S+\s+.*from now", shown.stdout, re.M), shown.stdout
    data = json.loads(mlxi("ps", "--server", server.url, "--json").stdout)
    assert [m["name"] for m in data["models"]] == ["tiny"]
    assert data["models"][0]["keep_alive_s"] == 300  # the served default, 5 minutes
    # The default server is found through MLXI_SERVER.
    assert "tiny" in mlxi("ps", env={"MLXI_SERVER": server.url}).stdout

    stopped = mlxi("stop", "tiny", "--server", server.url)
    assert stopped.exit_code == 0, stopped.output
    assert stopped.stdout.strip() == "stopped tiny"
    assert not engine_of(server, "tiny").is_loaded
    assert json.loads(mlxi("ps", "--server", server.url, "--json").stdout)["models"] == []
    # The next request loads it again, with the served keep-alive.
    reply = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "tiny", "messages": USER, "max_tokens": 2},
    )
    assert reply.status_code == 200
    assert engine_of(server, "tiny").keep_alive == 300

    unknown = mlxi("stop", "other", "--server", server.url)
    assert unknown.exit_code == 2
    assert "not loaded by this server" in unknown.stderr


def test_ps_without_a_server(tmp_path: Path):
    nobody = "http://127.0.0.1:9"  # the discard port: nothing answers
    named = mlxi("ps", "--server", nobody)
    assert named.exit_code == 1 and "no mlxi server answers" in named.stderr
    # Asked of no server in particular, ps lists the store's leases as before.
    fallback = mlxi("ps", "--json", env={"MLXI_SERVER": nobody, "MLXI_HOME": str(tmp_path)})
    assert fallback.exit_code == 0 and json.loads(fallback.stdout) == []
    missing = mlxi("stop", "tiny", "--server", nobody)
    assert missing.exit_code == 1 and "mlxi serve tiny" in missing.stderr


def test_exposed_without_a_key_warns_loudly(server: BackgroundServer):
    assert security_warnings(ServeConfig(host="127.0.0.1")) == []
    assert security_warnings(ServeConfig(host="0.0.0.0", api_key="k")) == []
    [warning] = security_warnings(ServeConfig(host="0.0.0.0"))
    assert "WITHOUT an API key" in warning
    # The warning comes before anything else; here the port is taken, so nothing listens.
    port = server.url.rsplit(":", 1)[1]
    result = mlxi("serve", "--host", "0.0.0.0", "--port", port)
    assert "WARNING: mlxi serve listens on 0.0.0.0" in result.stderr
    assert result.exit_code == 1 and "cannot listen on 0.0.0.0" in result.stderr
    # A key from the environment is a key: no warning then.
    keyed = mlxi("serve", "--host", "0.0.0.0", "--port", port, env={"MLXI_API_KEY": "k"})
    assert keyed.exit_code == 1 and "cannot listen on 0.0.0.0" in keyed.stderr
    assert "WARNING" not in keyed.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-memory", "lots"], "max_memory='lots' is not a size"),
        (["--engine-type", "fast"], "engine_type must be one of"),
        (["--keep-alive", "soon"], "soon"),
        (["--kv-bits", "5"], "kv_bits"),
        (["--responses-ttl", "soon"], "responses_ttl must be a duration, got 'soon'"),
        (["--responses-store-size", "-1"], "responses_store_size must be >= 0"),
    ],
)
def test_bad_flags_stop_the_start_naming_the_value(args: list[str], message: str):
    result = mlxi("serve", *args, "--port", "0")
    assert result.exit_code == 2, result.output
    assert message in result.stderr


def test_without_the_serve_extra_it_says_what_to_install(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "starlette", None)  # as if it were not installed
    result = mlxi("serve", "--port", "0")
    assert result.exit_code == 1
    assert "Hint: pip install 'mlx-integrations[serve]'" in result.stderr


def test_a_missing_model_stops_the_start(tmp_path: Path):
    result = mlxi("serve", "no-such-model", "--port", "0", env={"MLXI_HOME": str(tmp_path)})
    assert result.exit_code == 1
    # Not a Hub repo id: nothing to pull, so the store's list and an import are named.
    assert "mlxi pull" not in result.stderr
    assert "mlxi list" in result.stderr and "mlxi import" in result.stderr
    hub = mlxi("serve", "acme/no-such-model", "--port", "0", env={"MLXI_HOME": str(tmp_path)})
    assert hub.exit_code == 1
    assert "mlxi pull acme/no-such-model" in hub.stderr


def test_the_config_file(tmp_path: Path, tiny_llama: Path):
    file = tmp_path / "serve.toml"
    file.write_text(
        f"""
keep_alive = "10m"
engine_type = "simple"

[engine_options]
cache_memory_mb = 256

[models.smol]
model = "{tiny_llama}"
engine_type = "batched"
prompt_lookup = 4
keep_alive = -1
preload = true
"""
    )
    config = ServeConfig(port=9000).with_file(file)
    assert (config.port, config.keep_alive, config.engine_type) == (9000, "10m", "simple")
    assert config.engine_options == {"cache_memory_mb": 256}
    [smol] = config.models
    assert (smol.name, smol.source, smol.engine_type, smol.keep_alive, smol.preload) == (
        "smol",
        str(tiny_llama),
        "batched",
        -1,
        True,
    )
    assert smol.options == {"prompt_lookup": 4}
    as_json = tmp_path / "serve.json"
    as_json.write_text(json.dumps({"models": {"smol": {"model": str(tiny_llama), "kv_bits": 8}}}))
    assert ServeConfig().with_file(as_json).models[0].options == {"kv_bits": 8}
    for text, message in (
        ('api_key = "x"', "--api-key"),
        ("colour = 1", "unknown key"),
        ("[models.a]\nkv_bits = 5", "model 'a'"),
        ("[models.a]\nturbo = true", "unknown engine option"),
        ("[models.a]\nengine_type = 'fast'", "engine_type must be one of"),
        ("keep_alive = 'soon'", "keep_alive"),
    ):
        file.write_text(text)
        with pytest.raises(ValueError, match=message):
            ServeConfig().with_file(file)


def test_max_memory_refuses_a_model_that_cannot_fit(tiny_llama: Path):
    from mlx_integrations.engine import pool

    before = pool.memory_budget()
    weights = sum(f.stat().st_size for f in tiny_llama.glob("*.safetensors"))
    # Engine options of its own: no other test's engine on this model is shared.
    model = ModelConfig("tiny", source=str(tiny_llama), options={"cache_memory_mb": 7})
    config = ServeConfig(models=[model], max_memory=weights // 2)
    with BackgroundServer(config) as url:
        assert pool.memory_budget() == weights // 2
        body = {"model": "tiny", "messages": USER, "max_tokens": 2}
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 507, reply.text
        error = reply.json()["error"]
        assert error["code"] == "model_too_large" and "--max-memory" in error["message"]
    assert pool.memory_budget() == before  # the process's budget as it was
    # Named on the command line, the model is refused before the server starts.
    result = mlxi("serve", str(tiny_llama), "--max-memory", f"{weights // 2}B", "--port", "0")
    assert result.exit_code == 1, result.output
    assert "more than the memory budget" in result.stderr
    assert "Hint: start the server with a higher --max-memory" in result.stderr
    assert pool.memory_budget() == before


def test_under_mlxi_launch_one_model_is_named(tiny_llama: Path):
    launched = {"MLXI_CONTROL": "127.0.0.1:9", "MLXI_WORLD_SIZE": "2"}
    result = mlxi("serve", "--port", "0", env=launched)
    assert result.exit_code == 2
    assert "mlxi launch -n 2 -- mlxi serve MODEL" in result.stderr
    config = ServeConfig(models=[ModelConfig("m", preload=True), ModelConfig("other")])
    [sharded] = config.for_ranks(2).models
    assert (sharded.name, sharded.engine_type) == ("m", "distributed")
    assert config.for_ranks(2).only_listed
    batched = ServeConfig(models=[ModelConfig("m", engine_type="batched", preload=True)])
    with pytest.raises(ValueError, match="engine_type 'batched' cannot run under mlxi launch"):
        batched.for_ranks(2)


@pytest.fixture(scope="module")
def tiny_split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model whose heads and FFN divide by 2 ranks, with varied greedy replies."""
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny-split"),
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        tie_word_embeddings=False,
    )


def _reply(url: str, model: Path) -> httpx.Response:
    body = {"model": str(model), "messages": USER, "max_tokens": 8, "temperature": 0}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


@pytest.mark.timeout(300)
def test_under_mlxi_launch_it_serves_the_model_sharded(tiny_split: Path, tmp_path: Path):
    """`mlxi launch -n 2 -- mlxi serve MODEL` answers as one process does; SIGTERM to
    the launcher stops the server as SIGTERM to rank 0 does (rank 0 tells the other
    rank), and every rank ends on its own with status 0."""
    from mlx_integrations.engine.distributed.launch import free_ports

    single = ModelConfig(
        str(tiny_split), engine_type="simple", options={"cache_memory_mb": 0}, preload=True
    )
    with BackgroundServer(ServeConfig(models=[single])) as url:
        expected = _reply(url, tiny_split).json()["choices"][0]["message"]["content"]
    port = free_ports(1)[0]
    cli = [sys.executable, "-m", "mlx_integrations.cli"]
    rank0 = [*cli, "serve", str(tiny_split), "--port", str(port), "--log-level", "warning"]
    log = tmp_path / "launch.log"  # a file: a pipe nobody reads could fill and block
    with log.open("w") as stderr:
        launcher = subprocess.Popen([*cli, "launch", "-n", "2", "--", *rank0], stderr=stderr)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(url) or launcher.poll() is not None, "the server", timeout=240)
        assert launcher.poll() is None, log.read_text()
        reply = _reply(url, tiny_split)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == expected
        [row] = httpx.get(f"{url}/api/ps").json()["models"]
        assert row["engine_type"] == "distributed"
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(120)
        except subprocess.TimeoutExpired:
            launcher.kill()  # its ranks die with it
            launcher.wait()
    assert launcher.returncode == 0, log.read_text()


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize(("sig", "name"), [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C")])
def test_a_signal_while_the_models_load_stops_the_server_cleanly(
    tiny_llama: Path, sig: int, name: str
):
    """SIGTERM or Ctrl-C while the preloaded models load (sent by the loading line's
    callback, once the server listens for them): the loading is cancelled, what was
    loaded is let go, the server says so in one line and returns; nothing serves."""
    import asyncio

    from mlx_integrations.engine import pool
    from mlx_integrations.serve.server import serve

    said: list[str] = []
    config = ServeConfig(port=0, models=[ModelConfig("tiny", source=str(tiny_llama), preload=True)])

    def loading(models: list[str]) -> None:
        said.append(f"loading {', '.join(models)}")
        os.kill(os.getpid(), sig)

    async def main() -> None:
        before = signal.getsignal(signal.SIGINT)  # asyncio.run's own
        await serve(config, announce=said.append, stopped=said.append, loading=loading)
        assert signal.getsignal(signal.SIGINT) == before  # given back

    asyncio.run(main())
    assert said == ["loading tiny", f"stopped ({name}) while loading"]
    assert not pool.shared_engines()


def serve_tiny(model: Path, tmp_path: Path) -> subprocess.Popen:
    """``mlxi serve MODEL --port 0`` as a process, its stderr read as text."""
    env = {**os.environ, "MLXI_HOME": str(tmp_path / "home")}
    return subprocess.Popen(
        [sys.executable, "-m", "mlx_integrations.cli", "serve", str(model), "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def last_line_after_sigterm(process: subprocess.Popen) -> str:
    """SIGTERM, then the exit status must be 0: the last line the process said (a
    process that outlives the wait is killed, not left behind)."""
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    rest = process.stderr.read().splitlines() if process.stderr else []
    assert code == 0, rest
    return rest[-1]


def test_sigterm_during_the_load_exits_0(tiny_llama: Path, tmp_path: Path):
    """The process: SIGTERM once it says it is loading ends it with exit 0 and one line,
    whether the load was still running (the usual case) or had just finished."""
    process = serve_tiny(tiny_llama, tmp_path)
    assert process.stderr is not None
    first = process.stderr.readline()
    assert first.startswith(f"mlxi serve: loading {tiny_llama}"), first
    assert last_line_after_sigterm(process) in (
        "mlxi serve: stopped (SIGTERM) while loading",
        "mlxi serve: stopped (SIGTERM)",
    )


def test_sigterm_right_after_the_address_exits_0(tiny_llama: Path, tmp_path: Path):
    """Once the address is announced, before the server takes requests, SIGTERM still
    ends it with exit 0 and one line."""
    process = serve_tiny(tiny_llama, tmp_path)
    assert process.stderr is not None
    for line in process.stderr:
        if " at http://" in line:
            break
    assert last_line_after_sigterm(process) in (
        "mlxi serve: stopped (SIGTERM) before serving",
        "mlxi serve: stopped (SIGTERM)",
    )
