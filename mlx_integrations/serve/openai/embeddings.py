"""``POST /v1/embeddings``: vectors from an embedding model (BERT family,
sentence-transformers), through
:func:`~mlx_integrations.embeddings.get_embedding_engine`."""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from mlx_integrations.serve.errors import APIError, api_error
from mlx_integrations.serve.protocol import openai as wire
from mlx_integrations.serve.replies import Accepted, json_reply
from mlx_integrations.serve.sse import until_disconnected
from mlx_integrations.serve.state import ServerState

__all__ = ["embeddings"]


def _count_tokens(engine: Any, texts: list[str]) -> int:
    """Tokens the inputs hold, where the engine's tokenizer can count them."""
    tokenizer = getattr(engine, "_tokenizer", None)
    if tokenizer is None:
        return 0
    try:
        return sum(len(tokenizer.encode(t)) for t in texts)
    except Exception:  # a tokenizer of another shape: usage is advisory
        return 0


async def embeddings(body: wire.EmbeddingRequest, request: Request) -> Response:
    """Answer ``POST /v1/embeddings``."""
    state: ServerState = request.app.state.server
    accepted = Accepted(request, body)
    texts = [body.input] if isinstance(body.input, str) else body.input
    served = await state.served(body.model, "embedding")
    engine = served.engine
    if body.dimensions is not None and body.dimensions != engine.info.dimension:
        raise APIError(
            400,
            f"'dimensions' must be {engine.info.dimension}, the size of {body.model!r}'s "
            "vectors (it cannot be shortened); leave it out",
            param="dimensions",
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
        if body.encoding_format == "base64":
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
        data.append(wire.Embedding(index=i, embedding=value))
    usage = wire.EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens)
    return json_reply(wire.EmbeddingList(data=data, model=body.model, usage=usage), accepted)
