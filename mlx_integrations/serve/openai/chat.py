"""``POST /v1/chat/completions``: OpenAI's chat format to the chat core and back.

The request is a :class:`~.protocol.openai.ChatCompletionRequest`: what the engines do
not do (audio, the legacy ``functions``) is refused there with a 400 naming the field;
fields that change nothing here (``user``, ``metadata``, ``store``, ``service_tier``...)
are accepted and reported. Sampling extensions that vLLM also takes (``top_k``,
``min_p``, ``repetition_penalty``, ``chat_template_kwargs``) are read;
``reasoning_effort`` goes to the chat template's own switch, and the
``thinking_budget`` extension caps the thinking at N tokens.

``n`` choices are n requests sent to the engine together (a batched engine decodes
them in one batch); with a ``seed``, choice i samples with seed + i. ``logprobs`` lists
the tokens of each choice's answer (:mod:`.logprobs` says which), streamed with the
chunks that carry their text.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from mlx_integrations.chat.completion import (
    Finished,
    InvalidToolCall,
    Logprobs,
    ParsedToolCall,
    ReasoningDelta,
    Started,
    TextDelta,
    Turn,
)
from mlx_integrations.chat.output_parser import Event
from mlx_integrations.serve.errors import api_error, openai_error_body
from mlx_integrations.serve.openai.logprobs import Entry, with_answer_logprobs
from mlx_integrations.serve.paths import WirePaths
from mlx_integrations.serve.protocol import openai as wire
from mlx_integrations.serve.protocol.logprobs import ChoiceLogprobs
from mlx_integrations.serve.replies import Accepted, json_reply, new_id, now, stream_reply
from mlx_integrations.serve.sse import closing, merged, sse, until_disconnected
from mlx_integrations.serve.state import ChatParts, ServerState, sampling_fields

__all__ = [
    "Choice",
    "chat_completions",
    "choice_parts",
    "collect",
    "core_response_format",
    "openai_error_frame",
    "openai_finish_reason",
    "openai_usage",
]

TurnEvent = Event | Finished | Started | Logprobs


# ------------------------------------------------------------------ request


def _text(content: str | list[wire.TextPart] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content)


def _part(part: Any) -> dict[str, Any]:
    """A content part as the chat core takes it (its unused fields left out)."""
    if isinstance(part, wire.TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, wire.ImageURLPart):
        return {"type": "image_url", "image_url": {"url": part.image_url.url}}
    if isinstance(part, wire.VideoURLPart):
        return {"type": "video_url", "video_url": {"url": part.video_url.url}}
    if isinstance(part, wire.MediaPart):
        return {"type": part.type, part.type: getattr(part, part.type)}
    return {"type": part.type}  # the chat core names the type it does not take


def _content(content: str | list[Any]) -> Any:
    return content if isinstance(content, str) else [_part(p) for p in content]


def core_message(message: Any) -> dict[str, Any]:
    """One OpenAI message as the chat core takes it (``developer`` becomes ``system``:
    chat templates know no developer role)."""
    if isinstance(message, (wire.SystemMessage, wire.DeveloperMessage)):
        return {"role": "system", "content": _text(message.content)}
    if isinstance(message, wire.UserMessage):
        return {"role": "user", "content": _content(message.content)}
    if isinstance(message, wire.ToolMessage):
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id,
            "content": _content(message.content),
        }
    out: dict[str, Any] = {"role": "assistant", "content": _text(message.content)}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for call in message.tool_calls
        ]
    if message.reasoning_content:
        out["reasoning_content"] = message.reasoning_content
    return out


def core_tool(tool: wire.Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.function.name}
    if tool.function.description is not None:
        function["description"] = tool.function.description
    if tool.function.parameters is not None:
        function["parameters"] = tool.function.parameters
    return {"type": tool.type, "function": function}


def core_response_format(value: Any) -> dict[str, Any] | None:
    """``text`` (no constraint), ``json_object`` or ``json_schema``."""
    if value is None or isinstance(value, wire.TextFormat):
        return None
    if isinstance(value, wire.JSONObjectFormat):
        return {"type": "json_object"}
    spec = value.json_schema
    return {"type": "json_schema", "json_schema": {"name": spec.name, "schema": spec.schema_}}


def chat_parts(body: wire.ChatCompletionRequest) -> ChatParts:
    """The chat-core pieces of a request."""
    choice: Any = body.tool_choice
    if isinstance(choice, wire.NamedToolChoice):
        choice = {"type": "function", "function": {"name": choice.function.name}}
    if not body.tools and choice in ("none", "auto"):
        choice = None  # clients send it with an empty tool list
    max_tokens, max_name = body.max_completion_tokens, "max_completion_tokens"
    if max_tokens is None:
        max_tokens, max_name = body.max_tokens, "max_tokens"
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    return ChatParts(
        model=body.model,
        messages=[core_message(m) for m in body.messages],
        paths=WirePaths(fields={"max_tokens": max_name}),
        tools=[core_tool(t) for t in body.tools] if body.tools else None,
        tool_choice=choice,
        parallel_tool_calls=body.parallel_tool_calls,
        response_format=core_response_format(body.response_format),
        max_tokens=max_tokens,
        stop=stop or None,
        reasoning_effort=body.reasoning_effort,
        logprobs=body.logprobs,
        top_logprobs=body.top_logprobs,
        **sampling_fields(body),
    )


def choice_parts(parts: ChatParts, index: int) -> ChatParts:
    """The pieces of choice ``index`` of ``n``: with a seed, it samples with seed + index
    (choices of one seed would all be the same)."""
    if index == 0 or parts.seed is None:
        return parts
    return replace(parts, seed=parts.seed + index)


# ----------------------------------------------------------------- response


@dataclass
class Choice:
    """One choice folded from its turn's events: the turn, and the answer's tokens
    with their log-probabilities where they were asked for."""

    turn: Turn = field(default_factory=Turn)
    logprobs: list[Entry] | None = None


async def collect(events: AsyncIterator[TurnEvent], logprobs: bool = False) -> Choice:
    """A whole choice folded from its events (with ``logprobs``, from a streamed turn
    whose :class:`Logprobs` events are sorted by :func:`with_answer_logprobs`)."""
    choice = Choice(logprobs=[] if logprobs else None)
    async with closing(with_answer_logprobs(events, logprobs)) as pairs:
        async for event, tokens in pairs:
            if choice.logprobs is not None and tokens:
                choice.logprobs += tokens
            if event is not None and not isinstance(event, Started):
                choice.turn.add(event)
    return choice


def openai_finish_reason(finished: Finished) -> Any:
    reason = finished.finish_reason
    return reason if reason in ("length", "tool_calls") else "stop"


def openai_usage(finished: Finished, more: list[Finished] | None = None) -> wire.Usage:
    """The usage of a turn; with ``more`` (the other choices of the request), their
    completion tokens added: the prompt counts once, as OpenAI counts it."""
    completion = finished.completion_tokens + sum(f.completion_tokens for f in more or ())
    return wire.Usage(
        prompt_tokens=finished.prompt_tokens,
        completion_tokens=completion,
        total_tokens=finished.prompt_tokens + completion,
        prompt_tokens_details=wire.PromptTokensDetails(cached_tokens=finished.cached_tokens),
    )


def _function(call: ParsedToolCall) -> wire.ToolCallFunction:
    return wire.ToolCallFunction(
        name=call.name, arguments=json.dumps(call.arguments, ensure_ascii=False)
    )


def _logprobs(entries: list[Entry] | None) -> ChoiceLogprobs | None:
    return None if entries is None else ChoiceLogprobs.model_validate({"content": entries})


def completion_body(choices: list[Choice], completion_id: str, model: str) -> wire.ChatCompletion:
    """The non-streamed answer (``object: chat.completion``)."""
    out = []
    for index, choice in enumerate(choices):
        turn = choice.turn
        assert turn.finished is not None
        content = turn.content + "".join(c.raw for c in turn.invalid_tool_calls)
        calls = [wire.ToolCallOut(id=c.id, function=_function(c)) for c in turn.tool_calls]
        message = wire.AssistantReply(
            content=content if content or not turn.tool_calls else None,
            reasoning_content=turn.reasoning or None,
            tool_calls=calls or None,
        )
        out.append(
            wire.Choice(
                index=index,
                message=message,
                finish_reason=openai_finish_reason(turn.finished),
                logprobs=_logprobs(choice.logprobs),
            )
        )
    finished = [c.turn.finished for c in choices if c.turn.finished is not None]
    return wire.ChatCompletion(
        id=completion_id,
        created=now(),
        model=model,
        choices=out,
        usage=openai_usage(finished[0], finished[1:]),
    )


async def chunk_frames(
    events: AsyncIterator[tuple[int, tuple[Any, list[Entry] | None]]],
    completion_id: str,
    model: str,
    include_usage: bool,
    choices: int = 1,
) -> AsyncIterator[bytes]:
    """The streamed answer: ``chat.completion.chunk`` events, then ``[DONE]``; each
    chunk carries its choice's ``index`` (the events come tagged by it, each with the
    answer's tokens it carries: :func:`with_answer_logprobs`).

    A tool call comes whole in one delta (its id, name and all its arguments), so the
    deltas joined are the call of the non-streamed answer.
    """
    created = now()
    usage: dict[str, Any] = {"usage": None} if include_usage else {}

    def chunk(index: int, delta: wire.Delta, finish: Any = None, tokens: Any = None) -> bytes:
        choice = wire.ChunkChoice(
            index=index, delta=delta, finish_reason=finish, logprobs=_logprobs(tokens or None)
        )
        return sse(
            wire.ChatCompletionChunk(
                id=completion_id, created=created, model=model, choices=[choice], **usage
            )
        )

    calls = [0] * choices
    for index in range(choices):
        yield chunk(index, wire.Delta(role="assistant", content=""))
    finished: list[Finished] = []
    async with closing(events):
        async for index, (event, tokens) in events:
            if event is None or isinstance(event, TextDelta):
                text = event.text if event is not None else None
                yield chunk(index, wire.Delta(content=text), tokens=tokens)
            elif isinstance(event, ReasoningDelta):
                yield chunk(index, wire.Delta(reasoning_content=event.text))
            elif isinstance(event, ParsedToolCall):
                call = wire.ToolCallDelta(
                    index=calls[index], id=event.id, function=_function(event)
                )
                yield chunk(index, wire.Delta(tool_calls=[call]))
                calls[index] += 1
            elif isinstance(event, InvalidToolCall):
                yield chunk(index, wire.Delta(content=event.raw), tokens=tokens)
            elif isinstance(event, Finished):
                yield chunk(index, wire.Delta(), openai_finish_reason(event))
                finished.append(event)
    if include_usage and finished:
        yield sse(
            wire.ChatCompletionChunk(
                id=completion_id,
                created=created,
                model=model,
                choices=[],
                usage=openai_usage(finished[0], finished[1:]),
            )
        )
    yield sse("[DONE]")


def openai_error_frame(exc: BaseException) -> bytes:
    """An error met after the stream began, as vLLM reports it: one ``error`` event."""
    return sse(openai_error_body(api_error(exc))) + sse("[DONE]")


async def chat_completions(body: wire.ChatCompletionRequest, request: Request) -> Response:
    """Answer ``POST /v1/chat/completions``."""
    state: ServerState = request.app.state.server
    accepted = Accepted(request, body)
    parts = chat_parts(body)
    served = await state.served(parts.model)
    completion_id = new_id("chatcmpl-")
    n = body.n or 1
    chats = [
        state.chat_request(
            served,
            choice_parts(parts, i),
            request_id=completion_id if n == 1 else f"{completion_id}-{i}",
        )
        for i in range(n)
    ]
    logprobs = chats[0].logprobs is not None
    # Logprobs are sorted by the events of each engine chunk: a streamed turn.
    turns = [
        state.turn(
            served, chat, body.stream or logprobs, parts.paths, body.stream, logprobs=logprobs
        )
        for chat in chats
    ]
    if not body.stream:
        choices = await until_disconnected(
            request.receive, asyncio.gather(*(collect(t, logprobs) for t in turns))
        )
        return json_reply(completion_body(list(choices), completion_id, parts.model), accepted)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def frames(events: AsyncIterator[Any]) -> AsyncIterator[bytes]:
        return chunk_frames(events, completion_id, parts.model, include_usage, n)

    tagged = merged([with_answer_logprobs(turn, logprobs) for turn in turns])
    return await stream_reply(request, tagged, frames, openai_error_frame, accepted)
