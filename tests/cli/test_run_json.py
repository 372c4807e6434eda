"""``mlxi run --json``: one JSON object on stdout for a one-shot prompt, nothing streamed
(real engines on tiny models)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlx_integrations.cli.main import app
from typer.testing import CliRunner

from tests.cli.conftest import store_with
from tests.cli.test_run import Terminal

KEYS = {
    "model",
    "model_path",
    "text",
    "reasoning",
    "tool_calls",
    "finish_reason",
    "usage",
    "time_to_first_token_s",
    "tokens_per_second",
}


def mlxi(*args: str):
    return CliRunner().invoke(app, list(args))


def test_json_holds_the_answer_the_plain_run_prints_with_usage_and_timings(home):
    args = ["run", "tiny", "Hello there", "--max-tokens", "8", "--temperature", "0"]
    plain = mlxi(*args)
    assert plain.exit_code == 0, plain.stderr
    result = mlxi(*args, "--json")
    assert result.exit_code == 0, result.stderr
    answer = json.loads(result.stdout)  # the whole of stdout: nothing streamed before it
    assert set(answer) == KEYS
    assert answer["text"] + "\n" == plain.stdout
    assert answer["model"] == "tiny" and answer["model_path"].endswith("models/tiny")
    assert answer["finish_reason"] == "length" and answer["tool_calls"] == []
    assert answer["reasoning"] is None
    usage = answer["usage"]
    assert usage["completion_tokens"] == 8 and usage["prompt_tokens"] > 3
    assert usage["cached_tokens"] == 0
    assert answer["time_to_first_token_s"] > 0 and answer["tokens_per_second"] > 0
    assert result.stderr == ""


def test_json_keeps_the_thinking_apart_and_prints_none_of_it(tmp_path: Path, monkeypatch):
    from tests.chat.test_chat_engine import THINKING_TEMPLATE
    from tests.support.tiny_models import build_tiny_model

    thinker = build_tiny_model(tmp_path / "thinker", arch="qwen2", chat_template=THINKING_TEMPLATE)
    store_with(tmp_path, monkeypatch, thinker, "thinker")
    args = ["run", "thinker", "Hi", "--max-tokens", "12", "--temperature", "0"]
    shown = mlxi(*args)
    assert shown.exit_code == 0, shown.stderr
    result = mlxi(*args, "--json")
    assert result.exit_code == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["reasoning"] and answer["reasoning"].strip() == shown.stderr.strip()
    assert answer["text"] + "\n" == shown.stdout
    assert result.stderr == ""  # the thinking is in the object, not on the terminal
    hidden = json.loads(mlxi(*args, "--json", "--hide-thinking").stdout)
    assert hidden["reasoning"] is None and hidden["text"] == answer["text"]


def test_json_lists_the_tool_calls(home, tmp_path):
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}}
    schema["required"] = ["city"]
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"name": "get_weather", "parameters": schema}]))
    result = mlxi(
        "run",
        "tiny",
        "Weather in Paris?",
        "--tools",
        str(tools),
        "--tool-choice",
        "required",
        "--max-tokens",
        "60",
        "--temperature",
        "0",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["finish_reason"] == "tool_calls"
    [call] = answer["tool_calls"]
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    assert call["arguments"]["city"] in {"Paris", "Rome"}


def test_json_of_a_format_cut_off_is_printed_then_fails(home):
    args = ["run", "tiny", "Hi", "--format", "json", "--max-tokens", "12", "--temperature", "0"]
    result = mlxi(*args, "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["finish_reason"] == "length"
    assert "reached --max-tokens (12) before its JSON was complete" in result.stderr


@pytest.mark.parametrize("stdin", ["Hello there", "\n"])
def test_a_piped_prompt_is_one_shot(home, stdin):
    result = CliRunner().invoke(
        app, ["run", "tiny", "--json", "--max-tokens", "3", "--temperature", "0"], input=stdin
    )
    if stdin.strip():
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["usage"]["completion_tokens"] == 3
    else:
        assert result.exit_code == 2 and "the prompt is empty" in result.stderr


def test_json_in_an_interactive_session_is_a_usage_error_naming_the_fix(home):
    with Terminal(["run", "tiny", "--json"]) as term:
        seen = term.read_until("mlxi run MODEL 'PROMPT' --json")
        assert term.close() == 2
    assert "interactive session prints text" in seen and ">>> " not in seen
