"""mlxi run --reasoning-effort and --thinking-budget on a tiny thinking model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from mlx_integrations.cli.main import app
from typer.testing import CliRunner

from tests.cli.conftest import store_with
from tests.support.thinking import OPENING_TEMPLATE, build_thinking_model


@pytest.fixture
def thinker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    # The template opens a <think> block (enable_thinking=False closes it at once).
    model = build_thinking_model(tmp_path / "thinker", OPENING_TEMPLATE)
    store_with(tmp_path, monkeypatch, model, "thinker")
    return ["run", "thinker", "Hi", "--max-tokens", "16", "--temperature", "0", "--json"]


def answer(args: list[str]) -> dict:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_effort_none_turns_the_thinking_off_and_the_budget_caps_it(thinker):
    free = answer(thinker)
    assert free["usage"]["reasoning_tokens"] > 4  # it thinks on by itself
    capped = answer([*thinker, "--thinking-budget", "4"])
    assert capped["usage"]["reasoning_tokens"] == 4 and capped["reasoning"]
    off = answer([*thinker, "--reasoning-effort", "none"])
    assert off["usage"]["reasoning_tokens"] == 0 and off["reasoning"] is None


@pytest.mark.parametrize(
    ("flags", "code", "says"),
    [
        (["--reasoning-effort", "medium"], 2, "takes reasoning_effort 'none', 'high'"),
        (["--reasoning-effort", "max"], 2, "'max' is not one of"),
        # Typer's wording of a minimum differs between its versions.
        (
            ["--thinking-budget", "-1"],
            2,
            "'--thinking-budget': .*(greater than or equal to 0|x>=0)",
        ),
    ],
)
def test_bad_reasoning_flags_are_refused(thinker, flags, code, says):
    result = CliRunner().invoke(app, [*thinker, *flags])
    assert result.exit_code == code
    assert re.search(says, result.stderr), result.stderr
