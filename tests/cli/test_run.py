"""``mlxi run``: one-shot answers, constrained formats, and the interactive session on a terminal."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlx_integrations.cli.main import app
from typer.testing import CliRunner

from tests.cli.conftest import store_with
from tests.support.signals import with_default_sigint


def test_format_json_schema_constrains_the_answer(home, tmp_path):
    schema = tmp_path / "answer.json"
    schema.write_text(
        json.dumps(
            {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}, "mood": {"enum": ["calm", "busy"]}},
                "required": ["ok", "mood"],
            }
        )
    )
    result = CliRunner().invoke(
        app, ["run", "tiny", "How are you?", "--format", str(schema), "--max-tokens", "64"]
    )
    assert result.exit_code == 0, result.stderr
    answer = json.loads(result.stdout)
    assert set(answer) == {"ok", "mood"} and answer["mood"] in {"calm", "busy"}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("yaml", "neither 'json' nor a readable JSON Schema file"),
        ("list.json", "a JSON Schema is an object"),
        ("bad.json", "not a valid JSON Schema at properties/n/type"),
    ],
)
def test_a_bad_format_is_a_usage_error(home, tmp_path, monkeypatch, value, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "bad.json").write_text('{"type": "object", "properties": {"n": {"type": 5}}}')
    result = CliRunner().invoke(app, ["run", "tiny", "Hi", "--format", value])
    assert result.exit_code == 2
    assert message in result.stderr


class Terminal:
    """``mlxi run`` in a pseudo-terminal, read and written like a person would."""

    def __init__(self, args: list[str]) -> None:
        master, slave = os.openpty()
        exe = Path(sys.executable).with_name("mlxi")
        self.proc = subprocess.Popen(
            with_default_sigint([str(exe), *args]),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            close_fds=True,
        )
        os.close(slave)
        self.master = master
        self.seen = ""

    def read_until(self, text: str, timeout: float = 60.0, start: int = 0) -> str:
        """Read until ``text`` shows at or after offset ``start`` of the output."""
        deadline = time.monotonic() + timeout
        while text not in self.seen[start:]:
            left = deadline - time.monotonic()
            assert left > 0, f"never saw {text!r}; output was:\n{self.seen}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # the process ended and closed the terminal
                    chunk = b""
                assert chunk, f"terminal closed before {text!r}; output was:\n{self.seen}"
                self.seen += chunk.decode(errors="replace")
        return self.seen

    def read_past(self, start: int, n: int = 1, timeout: float = 60.0) -> str:
        """Read until at least ``n`` more characters show after offset ``start``."""
        deadline = time.monotonic() + timeout
        while len(self.seen) < start + n:
            left = deadline - time.monotonic()
            assert left > 0, f"no output after offset {start}; output was:\n{self.seen}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:
                    chunk = b""
                assert chunk, f"terminal closed; output was:\n{self.seen}"
                self.seen += chunk.decode(errors="replace")
        return self.seen

    def send(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:  # a failed test must not leave mlxi running
            self.proc.kill()
            self.proc.wait()
        self._close_master()

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=60)
        finally:
            self._close_master()

    def _close_master(self) -> None:
        if self.master >= 0:
            os.close(self.master)
            self.master = -1


def test_interactive_session_clear_interrupt_and_bye(home):
    # Greedy decoding on the tiny model runs to the token limit: a long answer to stop.
    with Terminal(["run", "tiny", "--max-tokens", "20000", "--temperature", "0"]) as term:
        term.read_until(">>> ")
        mark = len(term.seen)
        term.send("/?")
        term.read_until("/clear forgets the conversation", start=mark)
        term.read_until(">>> ", start=mark)
        mark = len(term.seen)
        term.send("Tell me a long story")
        # The terminal echoes the line at once; the answer's first characters show that
        # mlxi has read it and is streaming. Ctrl-C then stops the answer only.
        echo = "Tell me a long story\r\n"
        term.read_until(echo, start=mark)
        term.read_past(term.seen.index(echo, mark) + len(echo), n=1)
        mark = len(term.seen)
        term.proc.send_signal(signal.SIGINT)
        term.read_until("[stopped]", timeout=120, start=mark)
        term.read_until(">>> ", timeout=120, start=mark)
        mark = len(term.seen)
        term.send("/clear")
        term.read_until("Conversation cleared.", start=mark)
        term.read_until(">>> ", start=mark)
        term.send("/bye")
        assert term.close() == 0


def test_ctrl_c_at_the_prompt_exits_130(home):
    with Terminal(["run", "tiny"]) as term:
        term.read_until(">>> ")
        # At once, while input() may still be drawing the prompt: it must not wait for a key.
        term.proc.send_signal(signal.SIGINT)
        assert term.close() == 130


def test_ctrl_c_that_a_blocked_main_thread_misses_is_handled():
    """A SIGINT handled by another thread (or before a blocking read began) wakes the main one.

    The main thread blocks SIGINT and waits in a read, so the kernel hands the signal to
    the watcher thread: only the session's nudge can make the main thread notice it.
    """
    script = (
        "import os, signal, sys\n"
        "from mlx_integrations.cli.signals import SessionSignals\n"
        "r, w = os.pipe()\n"
        "with SessionSignals():\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
        "    try:\n"
        # The signal may be handled as soon as the parent has read this line: inside
        # the try, like the read, so a handler run before the read starts is caught too.
        "        print('waiting', flush=True)\n"
        "        os.read(r, 1)\n"
        "    except KeyboardInterrupt:\n"
        "        print('interrupted', flush=True)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline() == "waiting\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out == "interrupted\n", err
    assert proc.returncode == 0


def test_a_turn_past_the_context_window_is_reported_and_the_session_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from tests.support.tiny_models import build_tiny_model

    small = build_tiny_model(tmp_path / "small", arch="llama", max_position_embeddings=64)
    store_with(tmp_path, monkeypatch, small, "small")
    with Terminal(["run", "small", "--max-tokens", "4", "--temperature", "0"]) as term:
        term.read_until(">>> ")
        mark = len(term.seen)
        term.send("tell me more " * 40)
        term.read_until("more than the context window", start=mark)
        term.read_until("/clear starts the conversation afresh", start=mark)
        term.read_until(">>> ", start=mark)
        mark = len(term.seen)
        term.send("hi")
        term.read_until("hi\r\n", start=mark)
        term.read_until(">>> ", start=mark + 4)  # answered; the session is still there
        term.send("/bye")
        assert term.close() == 0


def test_a_reasoning_models_thinking_goes_to_stderr_or_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from tests.chat.test_chat_engine import THINKING_TEMPLATE
    from tests.support.tiny_models import build_tiny_model

    # The template opens a <think> block: what the model writes first is its thinking.
    thinker = build_tiny_model(tmp_path / "thinker", arch="qwen2", chat_template=THINKING_TEMPLATE)
    store_with(tmp_path, monkeypatch, thinker, "thinker")
    args = ["run", "thinker", "Hi", "--max-tokens", "12", "--temperature", "0"]
    shown = CliRunner().invoke(app, args)
    assert shown.exit_code == 0, shown.stderr
    thought = shown.stderr.strip()
    assert thought and thought not in shown.stdout
    hidden = CliRunner().invoke(app, [*args, "--hide-thinking"])
    assert hidden.exit_code == 0, hidden.stderr
    assert thought not in hidden.stderr and hidden.stdout == shown.stdout


def test_a_session_with_tools_asks_for_each_result(home, tmp_path):
    tools = tmp_path / "tools.json"
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}}
    schema["required"] = ["city"]
    tools.write_text(json.dumps([{"name": "get_weather", "parameters": schema}]))
    args = ["run", "tiny", "--tools", str(tools), "--tool-choice", "get_weather"]
    with Terminal([*args, "--max-tokens", "40", "--temperature", "0"]) as term:
        term.read_until(">>> ")
        mark = len(term.seen)
        term.send("Weather in Paris?")
        term.read_until('"name": "get_weather"', start=mark)
        term.read_until("get_weather returned> ", start=mark)
        mark = len(term.seen)
        term.send("sunny, 21 C")
        # The model answers from the result (no forced call the second time), then the
        # session waits for the next turn.
        term.read_until(">>> ", start=mark)
        term.send("/bye")
        assert term.close() == 0
