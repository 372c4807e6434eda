"""``mlxi run``: stream a model's answers with :class:`SimpleEngine`."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import typer


async def _stream(
    engine: Any, messages: list[dict[str, str]], max_tokens: int, temperature: float, verbose: bool
) -> str:
    """Print the answer as it streams; return its text."""
    parts: list[str] = []
    start = time.perf_counter()
    last: Any = None
    async for out in engine.stream_chat(messages, max_tokens=max_tokens, temperature=temperature):
        if out.new_text:
            parts.append(out.new_text)
            sys.stdout.write(out.new_text)
            sys.stdout.flush()
        last = out
    sys.stdout.write("\n")
    sys.stdout.flush()
    if verbose and last is not None:
        seconds = time.perf_counter() - start
        n = getattr(last, "completion_tokens", 0)
        typer.echo(
            f"[{getattr(last, 'prompt_tokens', 0)} prompt tokens, {n} tokens in "
            f"{seconds:.2f} s, {n / max(seconds, 1e-9):.1f} tok/s, "
            f"finish: {getattr(last, 'finish_reason', None)}]",
            err=True,
        )
    return "".join(parts)


def _engine(model: str) -> Any:
    from mlx_integrations.engine.simple import SimpleEngine
    from mlx_integrations.models.resolve import resolve_model

    return SimpleEngine(resolve_model(model))


def one_shot(
    model: str,
    prompt: str,
    *,
    system: str | None,
    max_tokens: int,
    temperature: float,
    verbose: bool,
) -> None:
    """Answer one prompt and exit."""
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}
    ]

    async def main() -> None:
        engine = _engine(model)
        await engine.start()
        try:
            await _stream(engine, messages, max_tokens, temperature, verbose)
        finally:
            await engine.stop()

    asyncio.run(main())


def chat_session(
    model: str, *, system: str | None, max_tokens: int, temperature: float, verbose: bool
) -> None:
    """Read user turns from the terminal until /bye or end of input."""
    history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []

    async def main() -> None:
        engine = _engine(model)
        await engine.start()
        typer.echo("Type /bye or press Ctrl-D to leave.", err=True)
        try:
            while True:
                try:
                    line = await asyncio.to_thread(input, ">>> ")
                except EOFError:
                    typer.echo("", err=True)
                    break
                if line.strip() in {"/bye", "/exit", "/quit"}:
                    break
                if not line.strip():
                    continue
                history.append({"role": "user", "content": line})
                answer = await _stream(engine, history, max_tokens, temperature, verbose)
                history.append({"role": "assistant", "content": answer})
        finally:
            await engine.stop()

    asyncio.run(main())
