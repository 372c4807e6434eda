"""``mlxi run``: stream a model's answers with :class:`SimpleEngine`."""

from __future__ import annotations

import json
import queue
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import typer
from mlx_integrations.cli.signals import STOP, SessionSignals

_HELP = (
    "/clear forgets the conversation, Ctrl-C stops an answer, /bye or Ctrl-D leaves; "
    "with --tools, type each called tool's result when asked."
)
_END = object()  # the answer's task finished (done, failed or cancelled)


@dataclass(frozen=True)
class RunOptions:
    """What ``mlxi run`` asks of every answer."""

    system: str | None = None
    max_tokens: int = 512
    temperature: float = 0.7
    verbose: bool = False
    response_format: dict[str, Any] | None = None
    show_thinking: bool = True
    tools: list[dict[str, Any]] | None = None
    tool_choice: str = "auto"
    engine_options: dict[str, Any] = field(default_factory=dict)
    """Keywords of the engine (``draft_model``, ``prompt_lookup``, ``kv_bits``)."""
    images: tuple[str, ...] = ()
    """Images (paths or URLs) that go with the first question (vision models)."""
    json_output: bool = False
    """Print nothing while the answer streams; :func:`one_shot` prints one JSON object."""
    reasoning_effort: str | None = None
    """How much a thinking model thinks (its template's own switch; ``--reasoning-effort``)."""
    thinking_budget: int | None = None
    """Most tokens a thinking model may think before it answers (``--thinking-budget``)."""

    def reasoning_options(self) -> dict[str, Any]:
        """The chat request's reasoning controls that were given."""
        given = {"reasoning_effort": self.reasoning_effort, "thinking_budget": self.thinking_budget}
        return {k: v for k, v in given.items() if v is not None}

    def first_messages(self) -> list[dict[str, str]]:
        """The conversation before the first user turn."""
        return [{"role": "system", "content": self.system}] if self.system else []

    def user_turn(self, text: str, first: bool) -> dict[str, Any]:
        """A user message; the first one carries the images, before the text."""
        if not (first and self.images):
            return {"role": "user", "content": text}
        parts: list[dict[str, str]] = [{"type": "image", "image": s} for s in self.images]
        return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


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


@dataclass
class Answer:
    """What one streamed answer said: its text, thinking, tool calls and usage."""

    text: str
    tool_calls: list[dict[str, Any]]
    finish_reason: str | None = None
    reasoning: str = ""
    finished: Any = None
    """The turn's last event (:class:`~mlx_integrations.chat.completion.Finished`)."""

    def to_json(self, model: str) -> dict[str, Any]:
        """The answer as ``mlxi run --json`` prints it.

        ``tokens_per_second`` is the decode rate after the first token (the prompt's
        prefill is in ``time_to_first_token_s``).
        """
        last = self.finished
        return {
            "model": model,
            "model_path": last.model_name if last is not None else None,
            "text": self.text,
            "reasoning": self.reasoning or None,
            "tool_calls": self.tool_calls,
            "finish_reason": self.finish_reason,
            "usage": {
                "prompt_tokens": last.prompt_tokens if last is not None else 0,
                "completion_tokens": last.completion_tokens if last is not None else 0,
                "cached_tokens": last.cached_tokens if last is not None else 0,
                "reasoning_tokens": last.reasoning_tokens if last is not None else 0,
            },
            "time_to_first_token_s": round(last.ttft_s, 4) if last is not None else None,
            "tokens_per_second": round(last.generation_tps, 2) if last is not None else None,
        }

    def cut_off(self, opts: RunOptions) -> bool:
        """True when ``--format`` asked for JSON and ``--max-tokens`` ended it first:
        what was printed is not the whole JSON. Says so on stderr."""
        if opts.response_format is None or self.finish_reason != "length":
            return False
        from mlx_integrations.cli.errors import print_error

        print_error(
            f"The answer reached --max-tokens ({opts.max_tokens}) before its JSON was complete.",
            "Raise --max-tokens.",
        )
        return True

    def message(self) -> dict[str, Any]:
        """The answer as an assistant message of the conversation."""
        calls = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in self.tool_calls
        ]
        return {
            "role": "assistant",
            "content": self.text,
            **({"tool_calls": calls} if calls else {}),
            # A template that renders earlier thinking shows it; others drop it.
            **({"reasoning_content": self.reasoning} if self.reasoning else {}),
        }


def _stream(
    engine: Any, messages: list[dict[str, Any]], opts: RunOptions, signals: SessionSignals
) -> Answer:
    """Print the answer as it streams (reasoning on stderr, dimmed; tool calls as JSON lines).

    The answer runs as a task on the background loop that feeds a queue; this thread
    only reads the queue. Ctrl-C (from the moment this is called) puts a stop there:
    the task is cancelled, which aborts the request in the engine, and once the task
    has ended KeyboardInterrupt is raised here (the engine goes on serving).
    """
    from mlx_integrations.chat.completion import Finished, stream_chat_events
    from mlx_integrations.chat.output_parser import ReasoningDelta, TextDelta
    from mlx_integrations.chat.request import ChatRequest
    from mlx_integrations.chat.tool_formats import InvalidToolCall, ParsedToolCall
    from mlx_integrations.runtime.sync import background_loop

    request = ChatRequest.build(
        messages,
        tools=opts.tools,
        tool_choice=opts.tool_choice if opts.tools else None,
        parallel_tool_calls=opts.tool_choice == "auto",
        response_format=opts.response_format,
        max_tokens=opts.max_tokens,
        temperature=opts.temperature,
        **opts.reasoning_options(),
    )
    events: queue.SimpleQueue[Any] = queue.SimpleQueue()
    loop = background_loop()
    tasks: list[Any] = []

    async def pump() -> None:
        async for event in stream_chat_events(engine, request):
            events.put(event)

    def begin() -> None:  # on the loop
        task = loop.create_task(pump())
        task.add_done_callback(lambda _t: events.put(_END))
        tasks.append(task)

    dim, plain = ("\x1b[2m", "\x1b[0m") if sys.stderr.isatty() else ("", "")
    quiet = opts.json_output  # collected for one JSON object; nothing streams
    parts: list[str] = []
    thought: list[str] = []
    calls: list[dict[str, Any]] = []
    thinking = False
    stopped = False
    start = time.perf_counter()
    last: Finished | None = None
    with signals.answering(events):
        loop.call_soon_threadsafe(begin)
        try:
            while (event := events.get()) is not _END:
                if event is STOP:
                    if not stopped:  # begin() ran first: calls run in order on the loop
                        loop.call_soon_threadsafe(lambda: tasks[0].cancel())
                    stopped = True
                elif stopped:
                    continue  # what streamed in before the cancel took effect
                elif isinstance(event, ReasoningDelta) and opts.show_thinking:
                    thought.append(event.text)
                    if quiet:
                        continue
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
                    if not quiet:
                        sys.stdout.write(event.text)
                        sys.stdout.flush()
                elif isinstance(event, ParsedToolCall):
                    call = {"id": event.id, "name": event.name, "arguments": event.arguments}
                    calls.append(call)
                    if not quiet:
                        sys.stdout.write(
                            ("\n" if parts else "") + json.dumps(call, ensure_ascii=False)
                        )
                        sys.stdout.flush()
                elif isinstance(event, InvalidToolCall):
                    typer.echo(f"Warning: invalid tool call ({event.error}): {event.raw}", err=True)
                elif isinstance(event, Finished):
                    last = event
        except BaseException:
            loop.call_soon_threadsafe(lambda: tasks and tasks[0].cancel())
            raise
        finally:
            if thinking:
                sys.stderr.write(plain + "\n")
            if not quiet:
                sys.stdout.write("\n")
                sys.stdout.flush()
    if stopped:
        raise KeyboardInterrupt
    error = tasks[0].exception()
    if error is not None:
        raise error
    if opts.verbose and last is not None:
        seconds = time.perf_counter() - start
        n = last.completion_tokens
        drafts = (
            f", {last.accepted_draft_tokens}/{last.draft_tokens} drafts accepted"
            if last.draft_tokens
            else ""
        )
        typer.echo(
            f"[{last.prompt_tokens} prompt tokens, {n} tokens in "
            f"{seconds:.2f} s, {n / max(seconds, 1e-9):.1f} tok/s{drafts}, "
            f"finish: {last.finish_reason}]",
            err=True,
        )
    reason = last.finish_reason if last is not None else None
    return Answer("".join(parts), calls, reason, "".join(thought), last)


def _tool_results(answer: Answer) -> list[dict[str, Any]]:
    """Ask the user for the result of each call the answer made (EOF: no result)."""
    results = []
    for call in answer.tool_calls:
        try:
            result = input(f"{call['name']} returned> ")
        except EOFError:
            result = ""
        results.append(
            {"role": "tool", "tool_call_id": call["id"], "name": call["name"], "content": result}
        )
    return results


def _engine(model: str, opts: RunOptions) -> Any:
    from mlx_integrations.engine.distributed.ranks import launched_ranks
    from mlx_integrations.engine.simple import SimpleEngine
    from mlx_integrations.models.resolve import resolve_model
    from mlx_integrations.runtime.sync import run_sync

    engine: Any
    if launched_ranks() > 1:  # rank 0 of `mlxi launch`: the model is sharded over the ranks
        from mlx_integrations.engine.distributed.engine import DistributedEngine

        engine = DistributedEngine(resolve_model(model), **opts.engine_options)
    else:
        engine = SimpleEngine(resolve_model(model), **opts.engine_options)
    run_sync(engine.start())
    return engine


def _stop(engine: Any) -> None:
    from mlx_integrations.runtime.sync import run_sync

    run_sync(engine.stop())


def one_shot(model: str, prompt: str, opts: RunOptions) -> None:
    """Answer one prompt and exit (Ctrl-C: exit code 130)."""
    messages = [*opts.first_messages(), opts.user_turn(prompt, first=True)]
    with SessionSignals() as signals:
        engine = _engine(model, opts)
        try:
            answer = _stream(engine, messages, opts, signals)
        finally:
            _stop(engine)
    if opts.json_output:
        from mlx_integrations.cli.output import print_json

        print_json(answer.to_json(model))
    if answer.cut_off(opts):
        raise typer.Exit(1)


def chat_session(model: str, opts: RunOptions) -> None:
    """Read user turns until /bye, Ctrl-D or Ctrl-C at the prompt.

    Ctrl-C while an answer streams stops that answer only; the turn is not kept.
    """
    with SessionSignals() as signals:
        _session(model, opts, signals)


def _session(model: str, opts: RunOptions, signals: SessionSignals) -> None:
    history = opts.first_messages()
    engine = _engine(model, opts)
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
            if _unknown_command(command):
                typer.echo(f"Unknown command {command!r}. Type /? for help.", err=True)
                continue
            first = not any(m["role"] == "user" for m in history)
            turns = [*history, opts.user_turn(line, first)]
            try:
                answer = _stream(engine, turns, opts, signals)
                # With tools, the user plays each tool the model calls: its result goes
                # back as a tool message, and the model answers from it.
                # A forced choice holds for the turn's first answer only, as in agents.
                follow = replace(opts, tool_choice="auto")
                while answer.tool_calls:
                    turns = [*turns, answer.message(), *_tool_results(answer)]
                    answer = _stream(engine, turns, follow, signals)
                answer.cut_off(opts)
            except KeyboardInterrupt:
                typer.echo("[stopped]", err=True)
                continue
            except ValueError as exc:  # e.g. the conversation outgrew the context
                typer.echo(f"Error: {exc}", err=True)
                typer.echo("Hint: /clear starts the conversation afresh.", err=True)
                continue
            history = [*turns, answer.message()]
    finally:
        _stop(engine)


def _unknown_command(line: str) -> bool:
    """A single word like ``/by`` (a typo of a command), not a question or a path that
    begins with a slash, which go to the model."""
    return line.startswith("/") and len(line) > 1 and not any(c in line[1:] for c in " /")


def engine_options(
    draft_model: str | None,
    prompt_lookup: int,
    kv_bits: int | None,
    adapter: Path | None = None,
) -> dict[str, Any]:
    """``--draft-model``, ``--prompt-lookup``, ``--kv-bits`` and ``--adapter`` as engine
    keywords, checked."""
    from mlx_integrations.engine.options import EngineOptions

    options: dict[str, Any] = {"draft_model": draft_model} if draft_model else {}
    if prompt_lookup:
        options["prompt_lookup"] = prompt_lookup
    if kv_bits is not None:
        options["kv_bits"] = kv_bits
    if adapter is not None:
        options["adapter_path"] = str(adapter)
    try:
        checked = EngineOptions(**options)
    except (TypeError, ValueError) as exc:
        text = str(exc)
        hint = "--kv-bits" if "kv_bits" in text else "--draft-model / --prompt-lookup"
        hint = "--adapter" if "adapter" in text else hint
        raise typer.BadParameter(text, param_hint=hint) from None
    if checked.adapter_path is not None:
        options["adapter_path"] = checked.adapter_path  # absolute
    if draft_model:  # found before the model loads, and named as the draft model
        from mlx_integrations.models.errors import StoreError
        from mlx_integrations.models.resolve import resolve_model

        try:
            options["draft_model"] = str(resolve_model(draft_model))
        except StoreError as exc:
            message = f"{exc} {exc.hint}" if exc.hint else str(exc)
            raise typer.BadParameter(message, param_hint="--draft-model") from None
    return options


def read_tools(path: Path) -> list[dict[str, Any]]:
    """``--tools``: a JSON file of tool definitions (a list, one tool, or ``{"tools": [...]}``)."""
    from mlx_integrations.models.folders import read_json

    if not path.is_file():
        raise typer.BadParameter(f"there is no file {str(path)!r}", param_hint="--tools")
    data = read_json(path)
    if isinstance(data, dict) and "tools" in data:
        data = data["tools"]
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(t, dict) for t in data):
        raise ValueError(f"{path} must hold a JSON list of tool definitions.")
    return [t if "function" in t else {"type": "function", "function": t} for t in data]


def image_sources(values: list[str]) -> tuple[str, ...]:
    """``--image``: local files made absolute and checked before the model loads; URLs kept."""
    sources = []
    for value in values:
        if value.lower().startswith(("http://", "https://", "data:", "file://")):
            sources.append(value)
            continue
        path = Path(value).expanduser()
        if not path.is_file():
            raise typer.BadParameter(f"there is no file {value!r}", param_hint="--image")
        sources.append(str(path.resolve()))
    return tuple(sources)
