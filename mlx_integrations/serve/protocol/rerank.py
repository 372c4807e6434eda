"""Reranking (``POST /v1/rerank``, ``/rerank``, ``/v2/rerank``), as typed objects.

The request is the one Jina's and Cohere's rerank APIs take (and vLLM's, llama.cpp's
and LocalAI's servers): a ``query``, ``documents`` (strings or ``{"text": ...}``
objects), ``top_n`` and ``return_documents``. The reply carries what each API's
clients read: ``results`` (``index``, ``relevance_score``, the ``document`` when
asked), Jina's ``model`` and ``usage``, Cohere's ``id`` and ``meta``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from mlx_integrations.serve.protocol.base import ReplyModel, WireModel, unused

__all__ = ["RerankDocument", "RerankReply", "RerankRequest"]


class RerankDocument(WireModel):
    """A document as an object; other keys than ``text`` are kept and reported."""

    text: str


class RerankRequest(WireModel):
    """``POST /v1/rerank`` (Jina, Cohere v1), ``/rerank`` and ``/v2/rerank`` (Cohere v2)."""

    model: str
    """A cross-encoder (ms-marco-MiniLM, bge-reranker), an LLM reranker
    (Qwen3-Reranker), or a chat model, which reranks as an LLM reranker does."""
    query: str
    documents: list[str | RerankDocument]
    """The texts to rank, as strings or ``{"text": ...}`` objects."""
    top_n: int | None = Field(default=None, ge=1)
    """How many results to return, best first (all when unset)."""
    return_documents: bool | None = None
    """Put each result's text in ``document.text``; by default yes on ``/v1/rerank``
    and ``/rerank`` (as Jina does), no on ``/v2/rerank`` (as Cohere v2 does)."""
    max_chunks_per_doc: int | None = unused()
    rank_fields: list[str] | None = unused()
    max_tokens_per_doc: int | None = unused()
    """Each (query, document) pair is cut to the model's window instead."""
    truncation: bool | None = unused()
    """Long pairs are always cut to the model's window."""

    @field_validator("documents")
    @classmethod
    def _some_documents(cls, value: Any) -> Any:
        if not value:
            raise ValueError("must hold at least one document")
        return value


def _absent(value: Any) -> bool:
    return value is None


class DocumentOut(ReplyModel):
    text: str


class RerankResult(ReplyModel):
    index: int
    """The document's position in the request's ``documents``."""
    relevance_score: float
    """Higher is more relevant (a probability for sigmoid cross-encoders and LLM
    rerankers)."""
    document: DocumentOut | None = Field(default=None, exclude_if=_absent)
    """With ``return_documents``."""


class RerankUsage(ReplyModel):
    total_tokens: int
    """Tokens the model read over all (query, document) pairs."""


class ApiVersion(ReplyModel):
    version: str


class BilledUnits(ReplyModel):
    search_units: int = 1


class RerankTokens(ReplyModel):
    input_tokens: int
    output_tokens: int = 0


class RerankMeta(ReplyModel):
    """Cohere's ``meta``."""

    api_version: ApiVersion
    billed_units: BilledUnits = Field(default_factory=BilledUnits)
    tokens: RerankTokens


class RerankReply(ReplyModel):
    """The answer of the rerank endpoints."""

    id: str
    model: str
    results: list[RerankResult]
    """The ``top_n`` best documents, highest score first."""
    usage: RerankUsage
    meta: RerankMeta
