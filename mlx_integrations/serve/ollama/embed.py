"""``POST /api/embed`` and ``POST /api/embeddings``: vectors from an embedding model.

The same engines as ``/v1/embeddings`` (BERT family, sentence-transformers folders,
through :func:`~mlx_integrations.embeddings.get_embedding_engine`): ``/api/embed``
takes one text or several and answers ``embeddings``; the older ``/api/embeddings``
takes one ``prompt`` and answers ``embedding``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from mlx_integrations.serve.errors import APIError, api_error
from mlx_integrations.serve.ollama import protocol as wire
from mlx_integrations.serve.ollama.chat import keep_alive, served_model
from mlx_integrations.serve.ollama.ndjson import json_answer
from mlx_integrations.serve.registry import Served
from mlx_integrations.serve.replies import Accepted
from mlx_integrations.serve.sse import until_disconnected
from mlx_integrations.serve.state import ServerState

__all__ = ["embed", "embeddings"]


def _count_tokens(engine: Any, texts: list[str]) -> int:
    tokenizer = getattr(engine, "_tokenizer", None)
    if tokenizer is None:
        return 0
    try:
        return sum(len(tokenizer.encode(t)) for t in texts)
    except Exception:  # a tokenizer of another shape: the count is advisory
        return 0


async def _vectors(
    state: ServerState, served: Served, texts: list[str], request: Request, param: str
) -> tuple[list[list[float]], int]:
    try:
        vectors = await until_disconnected(request.receive, served.engine.aembed(texts))
    except (TypeError, ValueError) as exc:
        raise api_error(exc, param=param) from None
    tokens = await asyncio.to_thread(_count_tokens, served.engine, texts)
    state.metrics.add("prompt_tokens_total", tokens, model=served.name)
    return vectors, tokens


async def embed(body: wire.EmbedRequest, request: Request) -> Response:
    """Answer ``POST /api/embed``."""
    started = time.perf_counter_ns()
    state: ServerState = request.app.state.server
    accepted = Accepted(request, body)
    served = await served_model(state, body.model, "embedding")
    keep_alive(state, served, body.keep_alive)
    dimension = served.engine.info.dimension
    if body.dimensions is not None and body.dimensions != dimension:
        raise APIError(
            400,
            f"'dimensions' must be {dimension}, the size of {body.model!r}'s vectors (it "
            "cannot be shortened); leave it out",
            param="dimensions",
        )
    texts = [body.input] if isinstance(body.input, str) else body.input
    vectors, tokens = await _vectors(state, served, texts, request, "input")
    reply = wire.EmbedResponse(
        model=body.model,
        embeddings=vectors,
        total_duration=time.perf_counter_ns() - started,
        load_duration=0,
        prompt_eval_count=tokens,
    )
    return json_answer(reply, accepted)


async def embeddings(body: wire.EmbeddingsRequest, request: Request) -> Response:
    """Answer ``POST /api/embeddings`` (Ollama's older endpoint)."""
    state: ServerState = request.app.state.server
    accepted = Accepted(request, body)
    served = await served_model(state, body.model, "embedding")
    keep_alive(state, served, body.keep_alive)
    vectors, _ = await _vectors(state, served, [body.prompt], request, "prompt")
    return json_answer(wire.EmbeddingsResponse(embedding=vectors[0]), accepted)
