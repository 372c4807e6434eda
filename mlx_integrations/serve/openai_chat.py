"""``POST /v1/chat/completions``: OpenAI's chat format to the chat core and back.

What the engines do not do is refused with 400 naming the field rather than
ignored: ``n`` above 1, ``logprobs``/``top_logprobs`` (the engines return no token
probabilities), audio output, the legacy ``functions``. Sampling extensions that vLLM
also takes (``top_k``, ``min_p``, ``repetition_penalty``, ``chat_template_kwargs``)
are read; fields that change nothing here (``user``, ``metadata``, ``store``,
``service_tier``) are ignored. ``reasoning_effort`` goes to the chat template's own
switch, and the ``thinking_budget`` extension caps the thinking at N tokens.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlx_integrations.chat.completion import (
    Finished,
    InvalidToolCall,
    ParsedToolCall,
    ReasoningDelta,
    TextDelta,
    Turn,
)
from mlx_integrations.chat.output_parser import Event
from mlx_integrations.chat.reasoning import check_effort
from mlx_integrations.serve.errors import api_error, openai_error_body
from mlx_integrations.serve.sse import EventStream, closing, prime, sse, until_disconnected
from mlx_integrations.serve.state import ChatParts, ServerState
from mlx_integrations.serve.wire import Body, new_id, now, parse_json, sampling_options, stop_list

__all__ = ["chat_completions", "collect", "openai_finish_reason", "openai_usage"]

_NO_LOGPROBS = "is not supported: the engines return no token probabilities; leave it out"


def read_messages(body: Body) -> list[dict[str, Any]]:
    """OpenAI messages as the chat core takes them (``developer`` becomes ``system``:
    chat templates know no developer role)."""
    messages = body.required("messages", list)
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise body.error(f"messages[{i}]", "must be an object with 'role' and 'content'")
        if message.get("role") == "developer":
            message = {**message, "role": "system"}
        out.append(message)
    return out


def read_response_format(body: Body, name: str = "response_format") -> dict[str, Any] | None:
    """``text`` (no constraint), ``json_object`` or ``json_schema``."""
    value = body.obj(name)
    if value is None:
        return None
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise body.error(
                name,
                "of type 'json_schema' needs json_schema.schema, e.g. "
                '{"type": "json_schema", "json_schema": {"name": "x", "schema": {...}}}',
            )
        return {"type": "json_schema", "json_schema": spec}
    raise body.error(name, f"has type {kind!r}; use 'text', 'json_object' or 'json_schema'")


def reasoning_options(body: Body, name: str, effort: Any) -> dict[str, Any]:
    """``reasoning_effort`` (at ``name``) and the ``thinking_budget`` extension as engine
    options: the effort goes to the chat template's own switch (a level the template
    does not take is a 400 naming those it takes), the budget caps the thinking tokens."""
    options: dict[str, Any] = {}
    if effort is not None:
        try:
            options["reasoning_effort"] = check_effort(effort)
        except ValueError as exc:
            raise body.error(name, str(exc).removeprefix("reasoning_effort ")) from None
    budget = body.integer("thinking_budget", low=0)
    if budget is not None:
        options["thinking_budget"] = budget
    return options


def read_chat(body: Body) -> tuple[ChatParts, bool, bool]:
    """The chat parts of a request, whether it streams, whether usage is streamed."""
    model = body.raw("model")
    body.refuse("n", "must be 1: one choice per request (send several requests)", (1,))
    body.refuse("logprobs", _NO_LOGPROBS)
    body.refuse("top_logprobs", _NO_LOGPROBS, (0,))
    body.refuse("functions", "(legacy) is not supported; pass 'tools' instead", ())
    body.refuse("function_call", "(legacy) is not supported; pass 'tool_choice' instead", ())
    body.refuse("audio", "is not supported: the reply is text", ())
    modalities = body.array("modalities")
    if modalities and modalities != ["text"]:
        raise body.error("modalities", "must be ['text']: the reply is text")
    stream = bool(body.flag("stream", False))
    stream_options = body.obj("stream_options") or {}
    include_usage = bool(stream_options.get("include_usage", False))
    max_tokens = body.integer("max_completion_tokens", low=1)
    if max_tokens is None:
        max_tokens = body.integer("max_tokens", low=1)
    options = sampling_options(body)
    options.update(reasoning_options(body, "reasoning_effort", body.text("reasoning_effort")))
    tools = body.array("tools")
    parts = ChatParts(
        model=model,
        messages=read_messages(body),
        tools=tools or None,
        tool_choice=body.raw("tool_choice"),
        parallel_tool_calls=body.flag("parallel_tool_calls"),
        response_format=read_response_format(body),
        max_tokens=max_tokens,
        temperature=body.number("temperature"),
        top_p=body.number("top_p"),
        stop=stop_list(body, "stop"),
        options=options,
    )
    if not parts.tools and parts.tool_choice in ("none", "auto"):
        parts.tool_choice = None  # clients send it with an empty tool list
    return parts, stream, include_usage


async def collect(events: AsyncIterator[Event | Finished]) -> Turn:
    """A whole turn folded from its events."""
    turn = Turn()
    async with closing(events):
        async for event in events:
            turn.add(event)
    return turn


def openai_finish_reason(finished: Finished) -> str:
    reason = finished.finish_reason
    return reason if reason in ("length", "tool_calls") else "stop"


def openai_usage(finished: Finished) -> dict[str, Any]:
    return {
        "prompt_tokens": finished.prompt_tokens,
        "completion_tokens": finished.completion_tokens,
        "total_tokens": finished.prompt_tokens + finished.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": finished.cached_tokens},
    }


def tool_call_body(call: ParsedToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {
            "name": call.name,
            "arguments": json.dumps(call.arguments, ensure_ascii=False),
        },
    }


def completion_body(turn: Turn, completion_id: str, model: str) -> dict[str, Any]:
    """The non-streamed answer (``object: chat.completion``)."""
    assert turn.finished is not None
    content = turn.content + "".join(c.raw for c in turn.invalid_tool_calls)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content if content or not turn.tool_calls else None,
    }
    if turn.reasoning:
        message["reasoning_content"] = turn.reasoning
    if turn.tool_calls:
        message["tool_calls"] = [tool_call_body(c) for c in turn.tool_calls]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": now(),
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": openai_finish_reason(turn.finished),
                "logprobs": None,
            }
        ],
        "usage": openai_usage(turn.finished),
    }


async def chunk_frames(
    events: AsyncIterator[Event | Finished], completion_id: str, model: str, include_usage: bool
) -> AsyncIterator[bytes]:
    """The streamed answer: ``chat.completion.chunk`` events, then ``[DONE]``.

    A tool call comes whole in one delta (its id, name and all its arguments), so the
    deltas joined are the call of the non-streamed answer.
    """
    created = now()

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        body: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        if include_usage:
            body["usage"] = None
        return sse(body)

    yield chunk({"role": "assistant", "content": ""})
    calls = 0
    async with closing(events):
        async for event in events:
            if isinstance(event, TextDelta):
                yield chunk({"content": event.text})
            elif isinstance(event, ReasoningDelta):
                yield chunk({"reasoning_content": event.text})
            elif isinstance(event, ParsedToolCall):
                yield chunk({"tool_calls": [{"index": calls, **tool_call_body(event)}]})
                calls += 1
            elif isinstance(event, InvalidToolCall):
                yield chunk({"content": event.raw})
            elif isinstance(event, Finished):
                yield chunk({}, openai_finish_reason(event))
                if include_usage:
                    yield sse(
                        {
                            "id": completion_id,
                            "object": "chat.completion.chunk",
                            "created": created,
                            "model": model,
                            "system_fingerprint": None,
                            "choices": [],
                            "usage": openai_usage(event),
                        }
                    )
    yield sse("[DONE]")


def openai_error_frame(exc: BaseException) -> bytes:
    """An error met after the stream began, as vLLM reports it: one ``error`` event."""
    return sse(openai_error_body(api_error(exc))) + sse("[DONE]")


async def chat_completions(state: ServerState, request: Request) -> Response:
    """Answer ``POST /v1/chat/completions``."""
    body = Body(parse_json(await request.body()))
    parts, stream, include_usage = read_chat(body)
    served = await state.served(parts.model)
    chat = state.chat_request(served, parts)
    completion_id = new_id("chatcmpl-")
    chat.options["request_id"] = completion_id
    events = state.turn(served, chat, stream)
    if not stream:
        turn = await until_disconnected(request.receive, collect(events))
        return JSONResponse(completion_body(turn, completion_id, parts.model))
    _, events = await until_disconnected(request.receive, prime(events))
    return stream_response(
        state,
        chunk_frames(events, completion_id, parts.model, include_usage),
        openai_error_frame,
        request,
    )


def stream_response(
    state: ServerState, frames: AsyncIterator[bytes], on_error: Any, request: Request
) -> Response:
    """An :class:`EventStream` that counts a client gone mid-stream."""
    endpoint = request.url.path

    def gone() -> None:
        state.metrics.add("client_disconnects_total", endpoint=endpoint)

    return EventStream(frames, on_error=on_error, on_disconnect=gone)  # type: ignore[return-value]
