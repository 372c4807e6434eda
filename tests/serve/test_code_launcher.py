"""``mlxi code``: each client's settings, the context check, and the launcher's runs.

The settings are read back the way the clients read them (TOML for Codex, JSON for
OpenCode and Claude Code's state file); the command is driven through Typer's
CliRunner. A stand-in for Codex (a script named ``codex`` that sends one Responses
request to the URL of its config.toml) exercises the whole launch without npm; the real
clients run in test_coding_agents.py.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlx_integrations.cli.main import app
from typer.testing import CliRunner

from mlx_integrations.coding_agents import (
    CLIENTS,
    check_context,
    client_setup,
    get_client,
    plan_launch,
    running_models,
)
from mlx_integrations.serve.config import ModelConfig, ServeConfig
from mlx_integrations.serve.server import BackgroundServer

URL = "http://127.0.0.1:8123"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty store (``MLXI_HOME``), no server key, no port from the environment."""
    monkeypatch.setenv("MLXI_HOME", str(tmp_path / "mlxi"))
    monkeypatch.delenv("MLXI_API_KEY", raising=False)
    monkeypatch.delenv("MLXI_PORT", raising=False)
    return tmp_path / "mlxi"


# ---------------------------------------------------------------- settings


def test_claude_code_gets_every_model_slot_and_a_profile(tmp_path: Path):
    setup = client_setup(
        "claude", url=URL + "/", model="qwen3-4b-q4", context_length=40960, profile=tmp_path
    )
    env = setup.env
    assert env["ANTHROPIC_BASE_URL"] == URL
    assert env["ANTHROPIC_AUTH_TOKEN"] and env["ANTHROPIC_API_KEY"] == ""
    slots = ("MODEL", "DEFAULT_OPUS_MODEL", "DEFAULT_SONNET_MODEL", "DEFAULT_HAIKU_MODEL")
    assert {env[f"ANTHROPIC_{slot}"] for slot in slots} == {"qwen3-4b-q4"}
    assert env["CLAUDE_CODE_SUBAGENT_MODEL"] == "qwen3-4b-q4"
    assert env["CLAUDE_CONFIG_DIR"] == str(tmp_path)
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "40960"
    assert "CLAUDE_CODE_MAX_OUTPUT_TOKENS" not in env
    assert setup.command == ["claude"]
    state = json.loads(setup.files[tmp_path / ".claude.json"])
    assert state == {"hasCompletedOnboarding": True}


def test_codex_gets_a_responses_provider(tmp_path: Path):
    setup = client_setup(
        "codex",
        url=URL,
        model="qwen3-4b-q4",
        context_length=40960,
        args=["exec", "hi"],
        profile=tmp_path,
    )
    assert setup.env == {"CODEX_HOME": str(tmp_path)}
    config = tomllib.loads(setup.files[tmp_path / "config.toml"])
    assert config["model"] == "qwen3-4b-q4"
    assert config["model_context_window"] == 40960
    assert config["check_for_update_on_startup"] is False
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == URL + "/v1"
    assert provider["wire_api"] == "responses"
    assert "env_key" not in provider
    assert setup.command == ["codex", "exec", "hi"]


def test_opencode_gets_an_openai_compatible_provider(tmp_path: Path):
    setup = client_setup(
        "opencode", url=URL, model="qwen3-4b-q4", context_length=40960, profile=tmp_path
    )
    path = tmp_path / "opencode.json"
    assert setup.env["OPENCODE_CONFIG"] == str(path)
    assert setup.env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"
    config = json.loads(setup.files[path])
    provider_id, model = config["model"].split("/", 1)
    assert config["small_model"] == config["model"]
    provider = config["provider"][provider_id]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"]["baseURL"] == URL + "/v1"
    assert provider["models"][model]["limit"] == {"context": 40960, "output": 10240}


def test_max_tokens_caps_the_replies_the_clients_ask_for(tmp_path: Path):
    claude = client_setup("claude", url=URL, model="m", max_tokens=64, profile=tmp_path)
    assert claude.env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "64"
    opencode = client_setup(
        "opencode", url=URL, model="m", context_length=8192, max_tokens=64, profile=tmp_path
    )
    entry = json.loads(opencode.files[tmp_path / "opencode.json"])["provider"]["mlxi"]["models"]
    assert entry["m"]["limit"] == {"context": 8192, "output": 64}


def test_the_server_key_goes_to_each_client(tmp_path: Path):
    claude = client_setup("claude", url=URL, model="m", api_key="sekret", profile=tmp_path)
    assert claude.env["ANTHROPIC_AUTH_TOKEN"] == "sekret"
    codex = client_setup("codex", url=URL, model="m", api_key="sekret", profile=tmp_path)
    provider = tomllib.loads(codex.files[tmp_path / "config.toml"])["model_providers"]["mlxi"]
    assert codex.env[provider["env_key"]] == "sekret"
    opencode = client_setup("opencode", url=URL, model="m", api_key="sekret", profile=tmp_path)
    options = json.loads(opencode.files[tmp_path / "opencode.json"])["provider"]["mlxi"]["options"]
    assert options["apiKey"] == "{env:MLXI_API_KEY}" and opencode.env["MLXI_API_KEY"] == "sekret"


def test_a_model_name_with_quotes_stays_one_toml_string(tmp_path: Path):
    name = 'odd "name" \\ with = signs'
    setup = client_setup("codex", url=URL, model=name, profile=tmp_path)
    assert tomllib.loads(setup.files[tmp_path / "config.toml"])["model"] == name


def test_write_keeps_what_the_clients_keep_in_their_files(tmp_path: Path):
    """Claude Code's state file and the tables Codex adds to its config.toml (trusted
    folders) survive the next launch; the launcher's own settings are replaced."""
    (tmp_path / ".claude.json").write_text(json.dumps({"numStartups": 3, "theme": "dark"}))
    client_setup("claude", url=URL, model="m", profile=tmp_path).write()
    state = json.loads((tmp_path / ".claude.json").read_text())
    assert state == {"numStartups": 3, "theme": "dark", "hasCompletedOnboarding": True}

    client_setup("codex", url=URL, model="first", profile=tmp_path).write()
    config = tmp_path / "config.toml"
    config.write_text(config.read_text() + '\n[projects."/work/repo"]\ntrust_level = "trusted"\n')
    client_setup("codex", url="http://127.0.0.1:9000", model="second", profile=tmp_path).write()
    read = tomllib.loads(config.read_text())
    assert read["model"] == "second"
    assert read["model_providers"]["mlxi"]["base_url"] == "http://127.0.0.1:9000/v1"
    assert read["projects"]["/work/repo"]["trust_level"] == "trusted"


def test_bad_values_are_refused_by_name(tmp_path: Path):
    with pytest.raises(ValueError, match="unknown coding agent 'cursor'; choose one of: claude"):
        get_client("cursor")
    with pytest.raises(ValueError, match="url must start with http"):
        client_setup("codex", url="127.0.0.1:8000", model="m", profile=tmp_path)
    with pytest.raises(ValueError, match="model is empty"):
        client_setup("codex", url=URL, model=" ", profile=tmp_path)
    with pytest.raises(ValueError, match="context_length must be a positive number"):
        client_setup("codex", url=URL, model="m", context_length=0, profile=tmp_path)


def test_the_context_check_names_the_window_and_what_to_serve():
    small = check_context("claude", "smollm2-135m-instruct", 8192)
    assert small.too_small and small.needed == CLIENTS["claude"].prompt_tokens + 4096
    message = small.message()
    assert message is not None
    assert "smollm2-135m-instruct holds 8,192 tokens" in message
    assert "Claude Code sends about 21,000" in message and "32k or more" in message
    assert check_context("claude", "m", 65536).message() is None
    assert check_context("codex", "m", None).message() is None  # unknown: no claim
    assert check_context("opencode", "m", 8192).too_small  # 7,600 + room for the reply


# ---------------------------------------------------------------- mlxi code


def test_config_prints_the_settings_and_writes_nothing(home: Path, tiny_llama: Path):
    port = free_port()
    result = CliRunner().invoke(
        app,
        [
            "code",
            "claude",
            "--model",
            str(tiny_llama),
            "--port",
            str(port),
            "--config",
            "--",
            "-p",
            "hi",
        ],
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"# Claude Code on mlxi serve at http://127.0.0.1:{port}")
    assert lines[1].startswith(f"# starts: mlxi serve {tiny_llama} --host 127.0.0.1 --port {port}")
    assert f"export ANTHROPIC_BASE_URL=http://127.0.0.1:{port}" in lines
    assert "export CLAUDE_CODE_MAX_CONTEXT_TOKENS=4096" in lines
    assert lines[-1] == "claude -p hi"
    # The tiny model's window is 4,096 tokens: one warning line says so.
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 1 and "holds 4,096 tokens of context" in warnings[0]
    assert not (home / "clients").exists()


def test_config_as_json(home: Path, tiny_llama: Path):
    port = free_port()
    result = CliRunner().invoke(
        app, ["code", "codex", "-m", str(tiny_llama), "--port", str(port), "--config", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["client"] == "codex" and data["server_running"] is False
    assert data["server_command"][-4:] == ["--host", "127.0.0.1", "--port", str(port)]
    assert data["context_length"] == 4096 and data["context_needed"] > 4096
    assert data["env"] == {"CODEX_HOME": str(home / "clients" / "codex")}
    ((_, text),) = data["files"].items()
    assert tomllib.loads(text)["model_providers"]["mlxi"]["wire_api"] == "responses"


@pytest.fixture(scope="module")
def running(tiny_llama: Path) -> Iterator[BackgroundServer]:
    config = ServeConfig(
        models=[ModelConfig("tiny", source=str(tiny_llama), preload=True)], only_listed=True
    )
    background = BackgroundServer(config)
    background.start()
    yield background
    background.stop()


def test_a_running_server_is_used_with_its_model(home: Path, running: BackgroundServer):
    port = running.url.rsplit(":", 1)[1]
    plan = plan_launch("opencode", port=int(port))
    assert plan.server is None and plan.setup.model == "tiny"
    assert plan.context.window == 4096  # "tiny" is the server's name: its window, from it
    result = CliRunner().invoke(app, ["code", "opencode", "--port", port, "--config"])
    assert result.exit_code == 0, result.output
    assert f"# uses the mlxi serve running at {running.url}" in result.stdout


def test_no_model_and_no_server(home: Path):
    result = CliRunner().invoke(app, ["code", "claude", "--port", str(free_port())])
    assert result.exit_code == 2
    assert "name a model: mlxi code claude --model NAME" in result.stderr


def test_an_unknown_client_or_model(home: Path):
    result = CliRunner().invoke(app, ["code", "cursor", "--model", "x", "--config"])
    assert result.exit_code == 2 and "choose one of: claude, codex, opencode" in result.stderr
    result = CliRunner().invoke(
        app, ["code", "codex", "--model", "no-such-model", "--port", str(free_port()), "--config"]
    )
    assert result.exit_code == 1 and "no-such-model" in result.stderr


def test_a_missing_client_is_named_before_a_server_starts(
    home: Path, tiny_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    result = CliRunner().invoke(
        app, ["code", "claude", "--model", str(tiny_llama), "--port", str(free_port())]
    )
    assert result.exit_code == 1
    assert "Claude Code is not installed" in result.stderr
    assert "npm install -g @anthropic-ai/claude-code" in result.stderr
    assert not (home / "clients" / "claude" / "server.log").exists()


STAND_IN = """#!{python}
# A stand-in for Codex: one Responses request to the provider of its config.toml.
import json, os, sys, tomllib, urllib.request
config = tomllib.load(open(os.path.join(os.environ["CODEX_HOME"], "config.toml"), "rb"))
provider = config["model_providers"][config["model_provider"]]
body = {{"model": config["model"], "input": sys.argv[-1], "max_output_tokens": 4}}
request = urllib.request.Request(
    provider["base_url"] + "/responses", json.dumps(body).encode(),
    {{"Content-Type": "application/json"}},
)
reply = json.load(urllib.request.urlopen(request, timeout=120))
print("stand-in:", sys.argv[1:], reply["status"], reply["model"])
sys.exit(3)
"""


def test_launch_starts_a_server_runs_the_client_and_stops_the_server(
    home: Path, tiny_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd
):
    """The client gets its arguments and settings, reaches the model through the server
    started for it, and its exit code is the command's; the server is gone after."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "codex"
    stand_in.write_text(STAND_IN.format(python=sys.executable))
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), os.environ["PATH"]]))
    port = free_port()
    result = CliRunner().invoke(
        app,
        ["code", "codex", "-m", str(tiny_llama), "--port", str(port), "--", "exec", "Say hello"],
    )
    out = capfd.readouterr().out
    assert result.exit_code == 3, result.output
    assert f"stand-in: ['exec', 'Say hello'] incomplete {tiny_llama}" in out
    assert "starting mlxi serve" in result.stderr and "stopping mlxi serve" in result.stderr
    log = (home / "clients" / "codex" / "server.log").read_text()
    assert '"POST /v1/responses HTTP/1.1" 200' in log
    assert "Finished server process" in log  # stopped, not killed
    assert running_models(f"http://127.0.0.1:{port}") is None


SLEEPER = """#!{python}
# A stand-in client that says whether Ctrl-C would reach it, then waits to be stopped.
import signal, time
print("stand-in ready, SIGINT ignored:", signal.getsignal(signal.SIGINT) is signal.SIG_IGN, flush=True)
time.sleep(120)
"""


def test_sigterm_stops_the_client_and_the_server(home: Path, tiny_llama: Path, tmp_path: Path):
    """``mlxi code`` stopped with SIGTERM passes it to the client and stops the server
    it started (which runs in a session of its own, out of reach of the terminal); the
    client gets Ctrl-C (SIGINT is not ignored in it, though the launcher waits it out)."""
    import signal
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "codex"
    stand_in.write_text(SLEEPER.format(python=sys.executable))
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IEXEC)
    port = free_port()
    env = {**os.environ, "PATH": os.pathsep.join([str(bin_dir), os.environ["PATH"]])}
    command = [sys.executable, "-m", "mlx_integrations.cli", "code", "codex"]
    command += ["-m", str(tiny_llama), "--port", str(port)]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) as launcher:
        assert launcher.stdout is not None
        assert launcher.stdout.readline().strip() == "stand-in ready, SIGINT ignored: False"
        assert running_models(f"http://127.0.0.1:{port}") is not None
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(60) == 128 + signal.SIGTERM
    log = (home / "clients" / "codex" / "server.log").read_text()
    assert "Finished server process" in log
    assert running_models(f"http://127.0.0.1:{port}") is None
