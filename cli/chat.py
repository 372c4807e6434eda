"""``mlxi run``: stream a model's answers with :class:`SimpleEngine`."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

_HELP = "/clear forgets the conversation, Ctrl-C stops an answer, /bye or Ctrl-D leaves."


@dataclass(frozen=True)
class RunOptions:
    """What ``mlxi run`` asks of every answer."""

    system: str | None = None
    max_tokens: int = 512
    temperature: float = 0.7
    verbose: bool = False
    response_format: dict[str, Any] | None = None
    show_thinking: bool = True

    def first_messages(self) -> list[dict[str, str]]:
        """The conversation before the first user turn."""
        return [{"role": "system", "content": self.system}] if self.system else []


def response_format_option(value: str | None) -> dict[str, Any] | None:
    """``--format``: 'json' or a JSON Schema file, as an OpenAI-style ``response_format``."""
    if value is None:
        return None
    if value.strip().lower() == "json":
        return {"type": "json_object"}
    path = Path(value).expanduser()
    try:
        schema = json.loads(path.read_text())
    except OSError as exc:
        raise typer.BadParameter(
            f"{value!r} is neither 'json' nor a readable JSON Schema file ({exc.strerror}).",
            param_hint="--format",
        ) from None
    except ValueError as exc:
        raise typer.BadParameter(
            f"{value} is not valid JSON: {exc}", param_hint="--format"
        ) from None
    if not isinstance(schema, dict):
        raise typer.BadParameter(
            f"{value} holds a {type(schema).__name__}; a JSON Schema is an object.",
            param_hint="--format",
        )
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(map(str, exc.path)) or "the top level"
        raise typer.BadParameter(
            f"{value} is not a valid JSON Schema at {where}: {exc.message}", param_hint="--format"
        ) from None
    return {
        "type": "json_schema",
        "json_schema": {"name": path.stem or "answer", "schema": schema},
    }


def _stream(engine: Any, messages: list[dict[str, str]], opts: RunOptions) -> str:
    """Print the answer as it streams (reasoning on stderr, dimmed); return its text.

    Ctrl-C while it streams aborts the request in the engine and raises
    KeyboardInterrupt here (the engine goes on serving).
    """
    from mlx_integrations.chat.completion import ChatRequest, Finished, stream_chat_events
    from mlx_integrations.chat.output_parser import ReasoningDelta, TextDelta
    from mlx_integrations.engine.sync import iterate_sync

    request = ChatRequest(
        messages,
        response_format=opts.response_format,
        max_tokens=opts.max_tokens,
        temperature=opts.temperature,
    )
    dim, plain = ("\x1b[2m", "\x1b[0m") if sys.stderr.isatty() else ("", "")
    parts: list[str] = []
    thinking = False
    start = time.perf_counter()
    last: Finished | None = None
    try:
        for event in iterate_sync(stream_chat_events(engine, request)):
            if isinstance(event, ReasoningDelta) and opts.show_thinking:
                if not thinking:
                    sys.stderr.write(dim)
                    thinking = True
                sys.stderr.write(event.text)
                sys.stderr.flush()
            elif isinstance(event, TextDelta):
                if thinking:
                    sys.stderr.write(plain + "\n")
                    thinking = False
                parts.append(event.text)
                sys.stdout.write(event.text)
                sys.stdout.flush()
            elif isinstance(event, Finished):
                last = event
    finally:
        if thinking:
            sys.stderr.write(plain + "\n")
        sys.stdout.write("\n")
        sys.stdout.flush()
    if opts.verbose and last is not None:
        seconds = time.perf_counter() - start
        n = last.completion_tokens
        typer.echo(
            f"[{last.prompt_tokens} prompt tokens, {n} tokens in "
            f"{seconds:.2f} s, {n / max(seconds, 1e-9):.1f} tok/s, "
            f"finish: {last.finish_reason}]",
            err=True,
        )
    return "".join(parts)


def _engine(model: str) -> Any:
    from mlx_integrations.engine.simple import SimpleEngine
    from mlx_integrations.engine.sync import run_sync
    from mlx_integrations.models.resolve import resolve_model

    engine = SimpleEngine(resolve_model(model))
    run_sync(engine.start())
    return engine


def _stop(engine: Any) -> None:
    from mlx_integrations.engine.sync import run_sync

    run_sync(engine.stop())


def one_shot(model: str, prompt: str, opts: RunOptions) -> None:
    """Answer one prompt and exit (Ctrl-C: exit code 130)."""
    messages = [*opts.first_messages(), {"role": "user", "content": prompt}]
    engine = _engine(model)
    try:
        _stream(engine, messages, opts)
    finally:
        _stop(engine)


def chat_session(model: str, opts: RunOptions) -> None:
    """Read user turns until /bye, Ctrl-D or Ctrl-C at the prompt.

    Ctrl-C while an answer streams stops that answer only; the turn is not kept.
    """
    history = opts.first_messages()
    engine = _engine(model)
    typer.echo(f"Type /? for help. {_HELP}", err=True)
    try:
        while True:
            try:
                line = input(">>> ")
            except EOFError:
                typer.echo("", err=True)
                break
            command = line.strip()
            if command in {"/bye", "/exit", "/quit"}:
                break
            if command in {"/?", "/help"}:
                typer.echo(_HELP, err=True)
                continue
            if command == "/clear":
                history = opts.first_messages()
                typer.echo("Conversation cleared.", err=True)
                continue
            if not command:
                continue
            turns = [*history, {"role": "user", "content": line}]
            try:
                text = _stream(engine, turns, opts)
            except KeyboardInterrupt:
                typer.echo("[stopped]", err=True)
                continue
            except ValueError as exc:  # e.g. the conversation outgrew the context
                typer.echo(f"Error: {exc}", err=True)
                typer.echo("Hint: /clear starts the conversation afresh.", err=True)
                continue
            history = [*turns, {"role": "assistant", "content": text}]
    finally:
        _stop(engine)
