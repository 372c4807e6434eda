"""``POST /v1/rerank``, ``/rerank`` and ``/v2/rerank``: documents ranked by relevance.

Jina's and Cohere's shape (:mod:`.protocol.rerank`), on the library's rerankers
(:mod:`mlx_integrations.embeddings.rerank`): a cross-encoder scores each (query,
document) pair on its encoder engine; an LLM reranker (Qwen3-Reranker), or any chat
model whose tokenizer has "yes" and "no" as tokens, scores by the odds of "yes" over
"no" on its chat engine (as ``MLXRerank(kind="llm")`` does). ``/v2/rerank`` is Cohere
v2's: its results carry no document unless ``return_documents`` asks.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from mlx_integrations.serve.errors import APIError, api_error
from mlx_integrations.serve.protocol import rerank as wire
from mlx_integrations.serve.registry import Served
from mlx_integrations.serve.replies import Accepted, json_reply, new_id
from mlx_integrations.serve.sse import until_disconnected
from mlx_integrations.serve.state import ServerState

__all__ = ["rerank", "rerank_v2"]


async def _reranker(state: ServerState, model: str) -> tuple[Served, Any]:
    """The model's reranker: its cross-encoder engine, or an LLM reranker on its chat
    engine (made once per model, off the event loop: it reads the tokenizer)."""
    served = await state.served(model, None)
    if served.kind == "reranker":
        return served, served.engine
    if served.kind == "embedding":
        raise APIError(
            400,
            f"The model {model!r} is an embedding model, which compares texts one at a "
            "time; rerank with a cross-encoder (ms-marco-MiniLM, bge-reranker) or a chat "
            "model, or send it to POST /v1/embeddings",
            param="model",
            code="wrong_model_kind",
        )
    found = state.rerankers.get(served.name)
    if found is None or found.engine is not served.engine:
        from mlx_integrations.embeddings.llm_rerank import LLMReranker

        try:
            found = await asyncio.to_thread(LLMReranker, served.engine)
        except ValueError as exc:  # "yes" or "no" is not one token of its vocabulary
            raise APIError(
                400, f"The model {model!r} cannot rerank: {exc}", param="model"
            ) from None
        state.rerankers[served.name] = found
    return served, found


async def _answer(
    body: wire.RerankRequest, request: Request, version: str, documents: bool
) -> Response:
    state: ServerState = request.app.state.server
    accepted = Accepted(request, body)
    served, reranker = await _reranker(state, body.model)
    texts = [d if isinstance(d, str) else d.text for d in body.documents]
    from mlx_integrations.embeddings.rerank import arerank

    try:
        ranking = await until_disconnected(
            request.receive, arerank(reranker, body.query, texts, top_n=body.top_n)
        )
    except (TypeError, ValueError) as exc:
        raise api_error(exc, param="documents") from None
    state.metrics.add("prompt_tokens_total", ranking.tokens, model=served.name)
    show = documents if body.return_documents is None else body.return_documents
    results = [
        wire.RerankResult(
            index=r.index,
            relevance_score=r.relevance_score,
            document=wire.DocumentOut(text=r.text) if show else None,
        )
        for r in ranking.results
    ]
    reply = wire.RerankReply(
        id=new_id("rerank-"),
        model=body.model,
        results=results,
        usage=wire.RerankUsage(total_tokens=ranking.tokens),
        meta=wire.RerankMeta(
            api_version=wire.ApiVersion(version=version),
            tokens=wire.RerankTokens(input_tokens=ranking.tokens),
        ),
    )
    return json_reply(reply, accepted)


async def rerank(body: wire.RerankRequest, request: Request) -> Response:
    """Answer ``POST /v1/rerank`` and ``/rerank`` (Jina, Cohere v1): the documents
    come back with their results unless ``return_documents`` is false."""
    return await _answer(body, request, "1", documents=True)


async def rerank_v2(body: wire.RerankRequest, request: Request) -> Response:
    """Answer ``POST /v2/rerank`` (Cohere v2): the results carry no document unless
    ``return_documents`` asks."""
    return await _answer(body, request, "2", documents=False)
