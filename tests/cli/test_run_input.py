"""``mlxi run`` given input it cannot use: the error names it (and the option), before the
model loads where it can; an answer cut short of its JSON is not passed off as whole.
Ctrl-C at ``mlxi rm``'s question exits as an interrupt."""

from __future__ import annotations

import signal

from mlx_integrations.cli.main import app
from typer.testing import CliRunner

from tests.cli.test_run import Terminal


def run(*args: str, stdin: str | None = None):
    return CliRunner().invoke(app, ["run", *args], input=stdin)


def test_a_folder_that_is_no_model_is_named_as_such(home, tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("hello")
    result = run(str(tmp_path / "notes"), "Hi")
    assert result.exit_code == 1
    assert f"Error: {tmp_path / 'notes'} is not a model folder" in result.stderr
    assert "No such file or folder" not in result.stderr


def test_an_unknown_draft_model_is_named_as_the_draft_model(home):
    result = run("tiny", "Hi", "--draft-model", "no-such-draft")
    assert result.exit_code == 2
    assert (
        "--draft-model" in result.stderr and "'no-such-draft' is not in the store" in result.stderr
    )


def test_a_missing_tools_file_is_a_usage_error_naming_the_option(home):
    result = run("tiny", "Hi", "--tools", "no-such-tools.json")
    assert result.exit_code == 2
    assert "--tools" in result.stderr and "no-such-tools.json" in result.stderr


def test_an_empty_prompt_is_refused(home):
    result = run("tiny", stdin="\n")
    assert result.exit_code == 2 and "the prompt is empty" in result.stderr
    assert result.stdout == ""


def test_json_cut_off_at_max_tokens_fails(home):
    # The tiny model's greedy JSON runs on past 12 tokens.
    result = run("tiny", "Hi", "--format", "json", "--max-tokens", "12", "--temperature", "0")
    assert result.exit_code == 1
    assert result.stdout.startswith("{")
    assert "reached --max-tokens (12) before its JSON was complete" in result.stderr
    assert "Raise --max-tokens" in result.stderr


def test_an_unknown_session_command_is_not_sent_to_the_model(home):
    with Terminal(["run", "tiny", "--max-tokens", "4", "--temperature", "0"]) as term:
        term.read_until(">>> ")
        mark = len(term.seen)
        term.send("/by")
        term.read_until("Unknown command '/by'. Type /? for help.", start=mark)
        term.read_until(">>> ", start=mark)
        term.send("/bye")
        assert term.close() == 0


def test_ctrl_c_at_rms_question_exits_130_and_keeps_the_model(home):
    with Terminal(["rm", "tiny"]) as term:
        term.read_until("Remove tiny? [y/N]: ")
        term.proc.send_signal(signal.SIGINT)
        term.read_until("Interrupted.")
        assert term.close() == 130
    with Terminal(["rm", "tiny"]) as term:
        term.read_until("Remove tiny? [y/N]: ")
        term.send("n")
        term.read_until("Nothing removed.")
        assert term.close() == 1
    listed = CliRunner().invoke(app, ["list", "-q"])
    assert listed.stdout == "tiny\n"
