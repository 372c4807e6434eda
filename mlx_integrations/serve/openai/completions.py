"""``POST /v1/completions``: raw text continued, without a chat template.

As ``MLXLLM.complete(..., formatted=True)`` does; ``response_format`` constrains the
text as on the chat endpoint. Several prompts make several choices (not streamed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, cast

from starlette.requests import Request
from starlette.responses import Response

from mlx_integrations.engine.base import GenerationOutput
from mlx_integrations.serve.errors import APIError, api_error
from mlx_integrations.serve.openai.chat import core_response_format, openai_error_frame
from mlx_integrations.serve.protocol import openai as wire
from mlx_integrations.serve.registry import Served
from mlx_integrations.serve.replies import Accepted, json_reply, new_id, now, stream_reply
from mlx_integrations.serve.sse import closing, sse, until_disconnected
from mlx_integrations.serve.state import SAMPLING_FIELDS, ServerState

__all__ = ["completions"]

# Chat-only fields: a raw prompt has no template and no thinking to budget.
_NOT_RAW = {"chat_template_kwargs", "thinking_budget"}


def _finish(out: GenerationOutput) -> Any:
    return "length" if out.finish_reason == "length" else "stop"


def _usage(outs: list[GenerationOutput]) -> wire.Usage:
    prompt = sum(o.prompt_tokens for o in outs)
    completion = sum(o.completion_tokens for o in outs)
    cached = sum(int(getattr(o, "cached_tokens", 0) or 0) for o in outs)
    return wire.Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=wire.PromptTokensDetails(cached_tokens=cached),
    )


async def _generate(
    state: ServerState, served: Served, prompt: str, call: dict[str, Any]
) -> AsyncIterator[GenerationOutput]:
    """The engine's stream for a raw prompt, its figures counted at the end."""
    started = time.perf_counter()
    first: float | None = None
    stream = cast(AsyncIterator[GenerationOutput], served.engine.stream_generate(prompt, **call))
    async with closing(stream) as outs:
        async for out in outs:
            if first is None and out.new_text:
                first = time.perf_counter() - started
            if out.finished:
                cached = int(getattr(out, "cached_tokens", 0) or 0)
                state.metrics.finished(
                    served.name, out.prompt_tokens, out.completion_tokens, cached, first
                )
            yield out


async def _call(body: wire.CompletionRequest, served: Served) -> dict[str, Any]:
    """The engine's keyword arguments for the request (the engine checks their values)."""
    call: dict[str, Any] = {
        name: value
        for name in SAMPLING_FIELDS
        if name not in _NOT_RAW and (value := getattr(body, name)) is not None
    }
    call.setdefault("temperature", 1.0)
    call.setdefault("top_p", 1.0)
    call["max_tokens"] = body.max_tokens
    call["stop"] = [body.stop] if isinstance(body.stop, str) else body.stop
    response_format = core_response_format(body.response_format)
    if response_format is not None:
        from mlx_integrations.chat.request import check_response_format

        try:
            _, constraint = check_response_format(response_format)
        except (TypeError, ValueError) as exc:
            raise api_error(exc, param="response_format") from None
        if constraint is not None:
            processor = await asyncio.to_thread(constraint.make_processor, served.engine.tokenizer)
            call["logits_processors"] = [processor]
    return call


async def completions(body: wire.CompletionRequest, request: Request) -> Response:
    """Answer ``POST /v1/completions``."""
    state: ServerState = request.app.state.server
    accepted = Accepted(request, body)
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    if body.stream and len(prompts) > 1:
        raise APIError(400, "'prompt' must be one string when streaming", param="prompt")
    served = await state.served(body.model)
    call = await _call(body, served)
    completion_id = new_id("cmpl-")
    if not body.stream:

        async def whole(prompt: str) -> GenerationOutput:
            last = None
            async for last in _generate(state, served, prompt, call):  # noqa: B007
                pass
            assert last is not None
            return last

        outs = await until_disconnected(
            request.receive, asyncio.gather(*(whole(p) for p in prompts))
        )
        choices = [
            wire.CompletionChoice(
                index=i,
                text=(prompts[i] if body.echo else "") + out.text,
                finish_reason=_finish(out),
            )
            for i, out in enumerate(outs)
        ]
        reply = wire.Completion(
            id=completion_id,
            created=now(),
            model=body.model,
            choices=choices,
            usage=_usage(list(outs)),
        )
        return json_reply(reply, accepted)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    echo = prompts[0] if body.echo else ""

    def frames(outs: AsyncIterator[GenerationOutput]) -> AsyncIterator[bytes]:
        return _completion_frames(outs, completion_id, body.model, echo, include_usage)

    stream = _generate(state, served, prompts[0], call)
    return await stream_reply(request, stream, frames, openai_error_frame, accepted)


async def _completion_frames(
    outs: AsyncIterator[GenerationOutput],
    completion_id: str,
    model: str,
    echo: str,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    created = now()
    usage: dict[str, Any] = {"usage": None} if include_usage else {}

    def chunk(text: str, finish: Any) -> bytes:
        choice = wire.CompletionChoice(index=0, text=text, finish_reason=finish)
        return sse(
            wire.Completion(
                id=completion_id, created=created, model=model, choices=[choice], **usage
            )
        )

    if echo:
        yield chunk(echo, None)
    async with closing(outs):
        async for out in outs:
            if out.finished:
                yield chunk(out.new_text, _finish(out))
                if include_usage:
                    yield sse(
                        wire.Completion(
                            id=completion_id,
                            created=created,
                            model=model,
                            choices=[],
                            usage=_usage([out]),
                        )
                    )
            elif out.new_text:
                yield chunk(out.new_text, None)
    yield sse("[DONE]")
