"""``mlxi run --draft-model / --prompt-lookup``: same greedy answer, figures with -v."""

from __future__ import annotations

import pytest
from mlx_integrations.cli.main import app
from typer.testing import CliRunner

# Which steps draft must not depend on the machine's speed (see conftest).
pytestmark = pytest.mark.usefixtures("lookup_rounds")

ARGS = ["run", "tiny", "Repeat: the lazy dog, the lazy dog", "-t", "0", "-m", "24"]


@pytest.mark.parametrize("option", [["--prompt-lookup", "4"], ["--draft-model", "tiny"]])
def test_speculative_run_prints_the_plain_answer(home, option):
    plain = CliRunner().invoke(app, ARGS)
    fast = CliRunner().invoke(app, [*ARGS, *option, "-v"])
    assert plain.exit_code == 0 and fast.exit_code == 0, fast.stderr
    assert fast.stdout == plain.stdout
    assert "drafts accepted" in fast.stderr


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--prompt-lookup", "-1"], "prompt_lookup must be >= 0, got -1"),
        (["--prompt-lookup", "2", "--draft-model", "tiny"], "pick one"),
    ],
)
def test_bad_speculative_options_are_usage_errors(home, option, message):
    result = CliRunner().invoke(app, [*ARGS, *option])
    assert result.exit_code == 2
    assert message in result.stderr


def test_a_missing_draft_model_is_named(home):
    result = CliRunner().invoke(app, [*ARGS, "--draft-model", "no-such-draft"])
    assert result.exit_code != 0
    assert "no-such-draft" in result.stderr
