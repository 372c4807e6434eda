"""``POST /api/chat`` and ``POST /api/generate``: Ollama's generation endpoints.

Both run the chat turn every API ends in (:meth:`ServerState.turn`, the
``stream_chat_events`` call the adapters make), so tool calls, a ``format`` schema
(valid by construction), thinking and usage behave as on ``/v1/chat/completions``.
``/api/generate`` with ``raw: true`` continues its prompt as it is, without the chat
template, as ``/v1/completions`` does.

A request without messages (or without a prompt) loads the model and answers
``done_reason: "load"``; with ``keep_alive: 0`` it unloads it (``"unload"``).
``keep_alive`` sets how long the model stays loaded after the request, as in Ollama;
a request without it puts back the server's keep-alive for that model.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, cast

from starlette.requests import Request
from starlette.responses import Response

from mlx_integrations.chat.completion import (
    Finished,
    InvalidToolCall,
    ParsedToolCall,
    ReasoningDelta,
    TextDelta,
    Turn,
)
from mlx_integrations.chat.output_parser import Event
from mlx_integrations.engine.base import GenerationOutput
from mlx_integrations.engine.params import encode_raw_prompt
from mlx_integrations.serve.errors import APIError, api_error
from mlx_integrations.serve.ollama import protocol as wire
from mlx_integrations.serve.ollama.names import served_name, unknown_tag
from mlx_integrations.serve.ollama.ndjson import Clock, json_answer, line, ndjson_reply, now_iso
from mlx_integrations.serve.ollama.requests import chat_parts, generate_parts
from mlx_integrations.serve.registry import Served
from mlx_integrations.serve.replies import Accepted, new_id
from mlx_integrations.serve.sse import closing, prime, until_disconnected
from mlx_integrations.serve.state import ChatParts, ServerState

__all__ = ["chat", "generate", "served_model"]


async def served_model(state: ServerState, model: str, kind: str = "chat") -> Served:
    """The engine of an Ollama model name (``x:latest`` is ``x``); a tag that names
    nothing here is a 404 that says how models are named."""
    name = served_name(model)
    try:
        return await state.served(name, kind)
    except APIError as exc:
        tagged = unknown_tag(name)
        raise (tagged if exc.status == 404 and tagged is not None else exc) from None


def keep_alive(state: ServerState, served: Served, value: Any) -> None:
    """Ollama's ``keep_alive`` of a request: how long the model stays loaded after it
    (the server's own keep-alive for the model when the request sets none)."""
    engine = served.engine
    if not hasattr(type(engine), "keep_alive"):
        return
    if value is None:
        if not served.pooled and served.kind == "chat":
            return  # an engine the program gave the server keeps its own keep-alive
        value = served.config.keep_alive
        if value is None:
            value = state.config.keep_alive
    seconds = _seconds(value)
    if getattr(engine, "engine_type", None) == "distributed":
        return  # a distributed engine stays loaded
    engine.keep_alive = seconds


def _seconds(value: Any) -> float:
    from mlx_integrations.runtime.memory import parse_keep_alive

    try:
        return parse_keep_alive(value)
    except (TypeError, ValueError) as exc:
        raise APIError(400, f"'keep_alive' {exc}", param="keep_alive") from None


async def _load(served: Served) -> int:
    """Load the model if it is not loaded; the nanoseconds it took."""
    started = time.perf_counter_ns()
    await served.engine.start()
    return time.perf_counter_ns() - started


async def _nothing_to_say(
    state: ServerState, served: Served, body: wire.Generating, chat: bool
) -> Response:
    """A request without input: load the model, or unload it (``keep_alive: 0``)."""
    clock = Clock()
    if body.keep_alive is not None and _seconds(body.keep_alive) == 0:
        await state.registry.stop(served.name)
        reason = "unload"
    else:
        keep_alive(state, served, body.keep_alive)
        clock.load_ns = await _load(served)
        reason = "load"
    common: dict[str, Any] = {
        "model": body.model,
        "created_at": now_iso(),
        "done": True,
        "done_reason": reason,
    }
    if reason == "load":
        common["total_duration"] = time.perf_counter_ns() - clock.started_ns
        common["load_duration"] = clock.load_ns
    answer: Any = (
        wire.ChatResponse(message=wire.MessageOut(), **common)
        if chat
        else wire.GenerateResponse(**common)
    )
    return json_answer(answer)


async def _prepare(
    state: ServerState,
    served: Served,
    parts: ChatParts,
    options: wire.Options | None,
    raw_prompt: str | None = None,
) -> tuple[Any, Clock]:
    """The checked request, the model loaded, and ``num_ctx`` applied: a prompt longer
    than it is refused, and the reply stops where prompt and reply fill it."""
    clock = Clock()
    clock.load_ns = await _load(served)
    chat = state.chat_request(served, parts, request_id=new_id("ollama-"))
    limit = options.num_ctx if options is not None else None
    if limit is not None:
        if limit < 1:
            raise APIError(
                400, f"'options.num_ctx' must be >= 1, got {limit}", param="options.num_ctx"
            )
        if raw_prompt is None:
            prompt = await state.prompt_tokens(served, chat, parts.paths)
        else:
            tokenizer = served.engine.tokenizer  # counted as the engine encodes it
            encoded = await asyncio.to_thread(encode_raw_prompt, tokenizer, raw_prompt, None)
            prompt = len(encoded[1])
        if prompt >= limit:
            raise APIError(
                400,
                f"The prompt is {prompt} tokens, which leaves no room under "
                f"options.num_ctx={limit}; raise num_ctx or send a shorter conversation",
                param="options.num_ctx",
            )
        chat = chat.replace(max_tokens=min(chat.max_tokens, limit - prompt))
    return chat, clock


async def chat(body: wire.ChatRequest, request: Request) -> Response:
    """Answer ``POST /api/chat``."""
    state: ServerState = request.app.state.server
    accepted = Accepted(request, body)
    served = await served_model(state, body.model)
    if not body.messages:
        return await _nothing_to_say(state, served, body, chat=True)
    parts = chat_parts(body, served.name)
    keep_alive(state, served, body.keep_alive)
    request_, clock = await _prepare(state, served, parts, body.options)
    events = state.turn(served, request_, body.stream, parts.paths)
    if not body.stream:
        turn = await until_disconnected(request.receive, _collect(events))
        return json_answer(_chat_answer(turn, body.model, clock), accepted)
    _, events = await until_disconnected(request.receive, prime(events))
    return ndjson_reply(request, _chat_lines(events, body.model, clock), accepted)


async def generate(body: wire.GenerateRequest, request: Request) -> Response:
    """Answer ``POST /api/generate``."""
    state: ServerState = request.app.state.server
    accepted = Accepted(request, body)
    served = await served_model(state, body.model)
    if not body.prompt and not body.images:
        return await _nothing_to_say(state, served, body, chat=False)
    keep_alive(state, served, body.keep_alive)
    if body.raw:
        return await _raw(state, served, body, request, accepted)
    parts = generate_parts(body, served.name)
    request_, clock = await _prepare(state, served, parts, body.options)
    events = state.turn(served, request_, body.stream, parts.paths)
    if not body.stream:
        turn = await until_disconnected(request.receive, _collect(events))
        return json_answer(_generate_answer(turn, body.model, clock), accepted)
    _, events = await until_disconnected(request.receive, prime(events))
    return ndjson_reply(request, _generate_lines(events, body.model, clock), accepted)


# ------------------------------------------------------------------ replies


async def _collect(events: AsyncIterator[Event | Finished]) -> Turn:
    turn = Turn()
    async with closing(events):
        async for event in events:
            turn.add(event)
    return turn


def _call(call: ParsedToolCall) -> wire.ToolCallOut:
    return wire.ToolCallOut(
        id=call.id, function=wire.FunctionOut(name=call.name, arguments=call.arguments)
    )


def _chat_answer(turn: Turn, model: str, clock: Clock) -> wire.ChatResponse:
    assert turn.finished is not None
    message = wire.MessageOut(
        content=turn.content + "".join(c.raw for c in turn.invalid_tool_calls),
        thinking=turn.reasoning or None,
        tool_calls=[_call(c) for c in turn.tool_calls] or None,
    )
    return wire.ChatResponse(
        model=model,
        created_at=now_iso(),
        message=message,
        done=True,
        **clock.counters(turn.finished),  # type: ignore[arg-type]
    )


def _generate_answer(turn: Turn, model: str, clock: Clock) -> wire.GenerateResponse:
    assert turn.finished is not None
    text = turn.content + "".join(c.raw for c in turn.invalid_tool_calls)
    return wire.GenerateResponse(
        model=model,
        created_at=now_iso(),
        response=text,
        thinking=turn.reasoning or None,
        done=True,
        **clock.counters(turn.finished),  # type: ignore[arg-type]
    )


async def _chat_lines(
    events: AsyncIterator[Event | Finished], model: str, clock: Clock
) -> AsyncIterator[bytes]:
    def chunk(message: wire.MessageOut) -> bytes:
        return line(wire.ChatResponse(model=model, created_at=now_iso(), message=message))

    async with closing(events):
        async for event in events:
            if isinstance(event, TextDelta):
                yield chunk(wire.MessageOut(content=event.text))
            elif isinstance(event, ReasoningDelta):
                yield chunk(wire.MessageOut(thinking=event.text))
            elif isinstance(event, ParsedToolCall):
                yield chunk(wire.MessageOut(tool_calls=[_call(event)]))
            elif isinstance(event, InvalidToolCall):
                yield chunk(wire.MessageOut(content=event.raw))
            elif isinstance(event, Finished):
                yield line(
                    wire.ChatResponse(
                        model=model,
                        created_at=now_iso(),
                        message=wire.MessageOut(),
                        done=True,
                        **clock.counters(event),  # type: ignore[arg-type]
                    )
                )


async def _generate_lines(
    events: AsyncIterator[Event | Finished], model: str, clock: Clock
) -> AsyncIterator[bytes]:
    def chunk(text: str = "", thinking: str | None = None) -> bytes:
        return line(
            wire.GenerateResponse(
                model=model, created_at=now_iso(), response=text, thinking=thinking
            )
        )

    async with closing(events):
        async for event in events:
            if isinstance(event, TextDelta):
                yield chunk(event.text)
            elif isinstance(event, ReasoningDelta):
                yield chunk(thinking=event.text)
            elif isinstance(event, InvalidToolCall):
                yield chunk(event.raw)
            elif isinstance(event, Finished):
                yield line(
                    wire.GenerateResponse(
                        model=model,
                        created_at=now_iso(),
                        done=True,
                        **clock.counters(event),  # type: ignore[arg-type]
                    )
                )


# ---------------------------------------------------------------- raw prompts


async def _raw(
    state: ServerState,
    served: Served,
    body: wire.GenerateRequest,
    request: Request,
    accepted: Accepted,
) -> Response:
    """``raw: true``: the prompt continued as it is (no template), as ``/v1/completions``
    does; the request's fields are checked by the same request builder."""
    if body.images:
        raise APIError(
            400,
            "'images' need the chat template, which raw: true leaves out; send raw: false",
            param="images",
        )
    parts = generate_parts(body, served.name)
    request_, clock = await _prepare(state, served, parts, body.options, body.prompt)
    call = request_.engine_kwargs()
    call.pop("tools", None)
    call.pop("chat_template_kwargs", None)
    constraint = request_.format_constraint
    if constraint is not None:
        processor = await asyncio.to_thread(constraint.make_processor, served.engine.tokenizer)
        call["logits_processors"] = [*call.get("logits_processors", []), processor]
    outputs = _outputs(state, served, body.prompt, call)
    if not body.stream:
        last = await until_disconnected(request.receive, _last(outputs))
        answer = wire.GenerateResponse(
            model=body.model,
            created_at=now_iso(),
            response=last.text,
            done=True,
            **clock.counters(_finished(last, served)),  # type: ignore[arg-type]
        )
        return json_answer(answer, accepted)
    _, outputs = await until_disconnected(request.receive, prime(outputs))
    return ndjson_reply(request, _raw_lines(outputs, body.model, clock, served), accepted)


async def _outputs(
    state: ServerState, served: Served, prompt: str, call: dict[str, Any]
) -> AsyncIterator[GenerationOutput]:
    stream = cast(AsyncIterator[GenerationOutput], served.engine.stream_generate(prompt, **call))
    try:
        async with closing(stream) as outs:
            async for out in outs:
                if out.finished:
                    cached = int(getattr(out, "cached_tokens", 0) or 0)
                    ttft = getattr(out, "ttft_s", None)
                    state.metrics.finished(
                        served.name, out.prompt_tokens, out.completion_tokens, cached, ttft
                    )
                yield out
    except (TypeError, ValueError) as exc:
        raise api_error(exc, param="prompt") from None


async def _last(outputs: AsyncIterator[GenerationOutput]) -> GenerationOutput:
    last = None
    async with closing(outputs):
        async for last in outputs:  # noqa: B007
            pass
    assert last is not None, "the engine returned no output"
    return last


def _finished(out: GenerationOutput, served: Served) -> Finished:
    return Finished(
        finish_reason=out.finish_reason,
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        cached_tokens=int(getattr(out, "cached_tokens", 0) or 0),
        model_name=served.name,
        ttft_s=float(getattr(out, "ttft_s", 0.0) or 0.0),
        generation_tps=float(getattr(out, "generation_tps", 0.0) or 0.0),
        model_path=None,
        text=out.text,
    )


async def _raw_lines(
    outputs: AsyncIterator[GenerationOutput], model: str, clock: Clock, served: Served
) -> AsyncIterator[bytes]:
    async with closing(outputs):
        async for out in outputs:
            if out.new_text:
                yield line(
                    wire.GenerateResponse(model=model, created_at=now_iso(), response=out.new_text)
                )
            if out.finished:
                yield line(
                    wire.GenerateResponse(
                        model=model,
                        created_at=now_iso(),
                        done=True,
                        **clock.counters(_finished(out, served)),  # type: ignore[arg-type]
                    )
                )
