"""OpenAI's other endpoints: ``/v1/completions``, ``/v1/embeddings``, ``/v1/models``.

``/v1/completions`` continues raw text (no chat template), as ``MLXLLM.complete(...,
formatted=True)`` does; ``response_format`` constrains it as on the chat endpoint.
``/v1/embeddings`` serves embedding models (BERT family, sentence-transformers) through
:func:`~mlx_integrations.embeddings.get_embedding_engine`.
"""

from __future__ import annotations

import asyncio
import base64
import struct
import time
from collections.abc import AsyncIterator
from typing import Any, cast

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlx_integrations.engine.base import GenerationOutput
from mlx_integrations.serve.errors import APIError, api_error
from mlx_integrations.serve.openai_chat import (
    openai_error_frame,
    read_response_format,
    stream_response,
)
from mlx_integrations.serve.registry import Served
from mlx_integrations.serve.sse import closing, prime, sse, until_disconnected
from mlx_integrations.serve.state import ServerState
from mlx_integrations.serve.wire import Body, new_id, now, parse_json, sampling_options, stop_list

__all__ = ["completions", "embeddings", "get_model", "list_models"]

DEFAULT_COMPLETION_TOKENS = 16
"""OpenAI's default ``max_tokens`` for ``/v1/completions``."""


def _prompts(body: Body) -> list[str]:
    prompt = body.raw("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return prompt
    if isinstance(prompt, list) and prompt and not all(isinstance(p, str) for p in prompt):
        raise body.error(
            "prompt", "must be text: token-id prompts are not supported; send the text itself"
        )
    raise body.error("prompt", "is required: a string or a non-empty array of strings")


def _finish(out: GenerationOutput) -> str:
    return "length" if out.finish_reason == "length" else "stop"


def _usage(outs: list[GenerationOutput]) -> dict[str, Any]:
    prompt = sum(o.prompt_tokens for o in outs)
    completion = sum(o.completion_tokens for o in outs)
    cached = sum(int(getattr(o, "cached_tokens", 0) or 0) for o in outs)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


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


async def completions(state: ServerState, request: Request) -> Response:
    """Answer ``POST /v1/completions``."""
    body = Body(parse_json(await request.body()))
    model = body.raw("model")
    prompts = _prompts(body)
    body.refuse("n", "must be 1 (send the prompt several times instead)", (1,))
    body.refuse("best_of", "must be 1: one completion is made per prompt", (1,))
    body.refuse("logprobs", "is not supported: the engines return no token probabilities", (0,))
    body.refuse("suffix", "is not supported: the models here only continue text", ("",))
    stream = bool(body.flag("stream", False))
    include_usage = bool((body.obj("stream_options") or {}).get("include_usage", False))
    echo = bool(body.flag("echo", False))
    if stream and len(prompts) > 1:
        raise body.error("prompt", "must be one string when streaming")
    served = await state.served(model)
    options = sampling_options(body)
    options.pop("chat_template_kwargs", None)
    options.pop("enable_thinking", None)
    response_format = read_response_format(body)
    if response_format is not None:
        from mlx_integrations.chat.constraints import response_format_constraint

        try:
            constraint = response_format_constraint(response_format)
        except (TypeError, ValueError) as exc:
            raise api_error(exc, param="response_format") from None
        if constraint is not None:
            processor = await asyncio.to_thread(constraint.make_processor, served.engine.tokenizer)
            options["logits_processors"] = [processor]
    temperature = body.number("temperature")
    top_p = body.number("top_p")
    call = {
        "max_tokens": body.integer("max_tokens", DEFAULT_COMPLETION_TOKENS, low=1),
        "temperature": 1.0 if temperature is None else temperature,
        "top_p": 1.0 if top_p is None else top_p,
        "stop": stop_list(body, "stop"),
        **options,
    }
    completion_id = new_id("cmpl-")
    if not stream:

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
            {
                "index": i,
                "text": (prompts[i] if echo else "") + out.text,
                "logprobs": None,
                "finish_reason": _finish(out),
            }
            for i, out in enumerate(outs)
        ]
        return JSONResponse(
            {
                "id": completion_id,
                "object": "text_completion",
                "created": now(),
                "model": model,
                "system_fingerprint": None,
                "choices": choices,
                "usage": _usage(list(outs)),
            }
        )
    _, outs_stream = await until_disconnected(
        request.receive, prime(_generate(state, served, prompts[0], call))
    )
    frames = _completion_frames(
        outs_stream, completion_id, model, prompts[0] if echo else "", include_usage
    )
    return stream_response(state, frames, openai_error_frame, request)


async def _completion_frames(
    outs: AsyncIterator[GenerationOutput],
    completion_id: str,
    model: str,
    echo: str,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    created = now()

    def chunk(text: str, finish: str | None) -> bytes:
        body: dict[str, Any] = {
            "id": completion_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            body["usage"] = None
        return sse(body)

    if echo:
        yield chunk(echo, None)
    async with closing(outs):
        async for out in outs:
            if out.finished:
                yield chunk(out.new_text, _finish(out))
                if include_usage:
                    usage = {
                        "id": completion_id,
                        "object": "text_completion",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": _usage([out]),
                    }
                    yield sse(usage)
            elif out.new_text:
                yield chunk(out.new_text, None)
    yield sse("[DONE]")


# ------------------------------------------------------------------ embeddings


def _texts(body: Body) -> list[str]:
    value = body.raw("input")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise body.error("input", "is required: a string or a non-empty array of strings")
    if not all(isinstance(v, str) for v in value):
        raise body.error(
            "input",
            "must be text: token-id input is not supported (LangChain's OpenAIEmbeddings: "
            "pass check_embedding_ctx_length=False)",
        )
    return value


def _count_tokens(engine: Any, texts: list[str]) -> int:
    """Tokens the inputs hold, where the engine's tokenizer can count them."""
    tokenizer = getattr(engine, "_tokenizer", None)
    if tokenizer is None:
        return 0
    try:
        return sum(len(tokenizer.encode(t)) for t in texts)
    except Exception:  # a tokenizer of another shape: usage is advisory
        return 0


async def embeddings(state: ServerState, request: Request) -> Response:
    """Answer ``POST /v1/embeddings``."""
    body = Body(parse_json(await request.body()))
    model = body.raw("model")
    texts = _texts(body)
    encoding = body.text("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise body.error("encoding_format", f"must be 'float' or 'base64', got {encoding!r}")
    dimensions = body.integer("dimensions", low=1)
    served = await state.served(model, "embedding")
    engine = served.engine
    if dimensions is not None and dimensions != engine.info.dimension:
        raise body.error(
            "dimensions",
            f"must be {engine.info.dimension}, the size of {model!r}'s vectors (it cannot be "
            "shortened); leave it out",
        )
    try:
        vectors = await until_disconnected(request.receive, engine.aembed(texts))
    except (TypeError, ValueError) as exc:
        raise api_error(exc, param="input") from None
    tokens = await asyncio.to_thread(_count_tokens, engine, texts)
    state.metrics.add("prompt_tokens_total", tokens, model=served.name)
    data = []
    for i, vector in enumerate(vectors):
        value: Any = vector
        if encoding == "base64":
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
        data.append({"object": "embedding", "index": i, "embedding": value})
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


# ---------------------------------------------------------------------- models


def _model_card(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": "mlxi"}


async def list_models(state: ServerState, request: Request) -> Response:
    """Answer ``GET /v1/models``: the configured models, the loaded ones, the store's."""
    names = await asyncio.to_thread(state.registry.names)
    created = int(state.started_at)
    return JSONResponse({"object": "list", "data": [_model_card(n, created) for n in names]})


async def get_model(state: ServerState, request: Request) -> Response:
    """Answer ``GET /v1/models/{model}``."""
    name = request.path_params["model"]
    names = await asyncio.to_thread(state.registry.names)
    if name not in names:
        raise APIError(
            404,
            f"The model {name!r} is not served here; GET /v1/models lists the models, "
            f"mlxi pull {name} fetches a Hub model",
            param="model",
            code="model_not_found",
        )
    return JSONResponse(_model_card(name, int(state.started_at)))
