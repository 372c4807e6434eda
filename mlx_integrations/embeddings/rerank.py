"""Reranking: a query and documents in, the documents ranked by relevance out.

What the adapters (``MLXRerank`` for LangChain and LlamaIndex) and an HTTP rerank
endpoint share:

- :func:`rerank` / :func:`arerank`: score documents (strings, or objects with a
  ``text``) with a :class:`Reranker` and return the best ``top_n`` as
  :class:`RerankResult` (the document's index in the input and its relevance score,
  highest first), in the shape of Cohere's and Jina's rerank APIs;
- :func:`load_reranker`: the reranker of a model name, a cross-encoder
  (:class:`~mlx_integrations.embeddings.rerank_engine.RerankEngine`) or an LLM reranker
  (:class:`~mlx_integrations.embeddings.llm_rerank.LLMReranker`, on a chat engine the
  caller gives);
- :func:`reranker_kind`: which of the two a model folder holds.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from mlx_integrations.embeddings.cross_encoder import is_cross_encoder_config
from mlx_integrations.embeddings.encoder_engine import EncoderDtype
from mlx_integrations.embeddings.llm_rerank import (
    DEFAULT_INSTRUCTION,
    LLMReranker,
    is_llm_reranker_folder,
)
from mlx_integrations.embeddings.rerank_engine import RerankScores, get_rerank_engine
from mlx_integrations.engine.base import BaseEngine
from mlx_integrations.models.folders import read_json_object
from mlx_integrations.models.resolve import resolve_model_path

__all__ = [
    "Ranking",
    "RerankResult",
    "Reranker",
    "RerankerKind",
    "arerank",
    "document_text",
    "load_reranker",
    "rank",
    "rerank",
    "reranker_kind",
]

RerankerKind = Literal["cross-encoder", "llm"]


@runtime_checkable
class Reranker(Protocol):
    """What scores documents against a query: ``RerankEngine`` and ``LLMReranker``."""

    def score(self, query: str, documents: Sequence[str]) -> RerankScores:
        """One relevance score per document, blocking the calling thread."""
        ...

    async def ascore(self, query: str, documents: Sequence[str]) -> RerankScores:
        """One relevance score per document, without blocking the event loop."""
        ...


@dataclass(frozen=True)
class RerankResult:
    """One ranked document, as rerank APIs return it."""

    index: int
    """Its position in the documents given."""
    relevance_score: float
    """Its score; higher is more relevant (a probability for sigmoid cross-encoders
    and LLM rerankers)."""
    text: str
    """Its text, as scored."""


def document_text(document: Any, index: int) -> str:
    """The text of a document given as a string, a mapping with ``"text"``, or an object
    with a ``text`` attribute (a LlamaIndex node) or ``page_content`` (a LangChain document).

    Raises:
        TypeError: Naming the document's index, when none of these holds a string.
    """
    if isinstance(document, str):
        return document
    if isinstance(document, Mapping):
        text = document.get("text")
    else:
        text = getattr(document, "text", None)
        if text is None:
            text = getattr(document, "page_content", None)
    if not isinstance(text, str):
        raise TypeError(
            f"documents[{index}] is a {type(document).__name__} without a text; give a "
            'string or an object with a "text" string ({"text": "..."}).'
        )
    return text


@dataclass(frozen=True)
class Ranking:
    """What :func:`rerank` returns: the kept documents, best first, and the call's size."""

    results: list[RerankResult]
    """The ``top_n`` best documents, highest score first (ties keep the input's order)."""
    tokens: int
    """Tokens the reranker read, over all documents (a rerank API's usage)."""


def rank(scored: RerankScores, texts: Sequence[str], top_n: int | None) -> Ranking:
    """The ``top_n`` best of scored documents, highest score first.

    Raises:
        ValueError: A ``top_n`` that is not a positive integer.
    """
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise ValueError(f"top_n must be a positive integer or None, not {top_n!r}.")
    scores = scored.scores
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    results = [RerankResult(i, float(scores[i]), texts[i]) for i in order[:top_n]]
    return Ranking(results, scored.tokens)


def rerank(
    reranker: Reranker, query: str, documents: Sequence[Any], *, top_n: int | None = None
) -> Ranking:
    """Rank documents by relevance to the query, blocking the calling thread only.

    Args:
        reranker: A cross-encoder engine or an LLM reranker (see :func:`load_reranker`).
        query: The query.
        documents: Strings, mappings with a ``"text"`` or objects with a ``text``.
        top_n: How many results to return (None: all).

    Returns:
        The results, highest score first, and the tokens read.

    Examples:
        >>> reranker = load_reranker("ms-marco-minilm-l6")  # doctest: +SKIP
        >>> docs = ["Paris is in France.", {"text": "MLX runs on Apple silicon."}]
        >>> ranking = rerank(reranker, "Macs?", docs)  # doctest: +SKIP
        >>> [(r.index, round(r.relevance_score, 2)) for r in ranking.results]  # doctest: +SKIP
        [(1, 0.91), (0, 0.0)]
    """
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, not {type(query).__name__}.")
    texts = _texts(documents)
    return rank(reranker.score(query, texts), texts, top_n)


async def arerank(
    reranker: Reranker, query: str, documents: Sequence[Any], *, top_n: int | None = None
) -> Ranking:
    """:func:`rerank` without blocking the event loop."""
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, not {type(query).__name__}.")
    texts = _texts(documents)
    return rank(await reranker.ascore(query, texts), texts, top_n)


def _texts(documents: Sequence[Any]) -> list[str]:
    if isinstance(documents, str) or not isinstance(documents, Sequence):
        raise TypeError(
            f"documents must be a list, not {type(documents).__name__}; wrap a single "
            "document in a list."
        )
    return [document_text(d, i) for i, d in enumerate(documents)]


def reranker_kind(path: Path) -> RerankerKind | None:
    """``"cross-encoder"``, ``"llm"`` (Qwen3-Reranker and kin) or None for a model folder."""
    config = read_json_object(path / "config.json") or {}
    if is_cross_encoder_config(config):
        return "cross-encoder"
    if is_llm_reranker_folder(path, config):
        return "llm"
    return None


def load_reranker(
    model: str | os.PathLike[str],
    *,
    chat_engine: BaseEngine | None = None,
    dtype: EncoderDtype = "float32",
    keep_alive: Any = None,
    instruction: str | None = None,
) -> Reranker:
    """The reranker of a model: its shared cross-encoder engine, or an LLM reranker.

    Args:
        model: A model folder, a store name or alias, or a Hub id pulled with ``mlxi pull``.
        chat_engine: For an LLM reranker (or any chat model used as one): the chat
            engine of that model, e.g. ``mlx_integrations.engine.pool.acquire(model)``.
        dtype: A cross-encoder's floating point type.
        keep_alive: A cross-encoder's keep-alive (seconds or ``"5m"``); None leaves it.
        instruction: An LLM reranker's instruction (the recipe's ``<Instruct>``).

    Raises:
        FileNotFoundError: When nothing by that name exists locally.
        ValueError: A model that is no reranker, or an LLM reranker without its engine.
    """
    if chat_engine is not None:
        return LLMReranker(chat_engine, instruction=instruction or DEFAULT_INSTRUCTION)
    path = resolve_model_path(os.fspath(model))
    kind = reranker_kind(path)
    if kind == "cross-encoder":
        return get_rerank_engine(path, dtype=dtype, keep_alive=keep_alive)
    if kind == "llm":
        raise ValueError(
            f"{str(model)!r} is an LLM reranker, which runs on a chat engine: pass "
            "chat_engine=mlx_integrations.engine.pool.acquire(model) (the adapters "
            "MLXRerank do this for you)."
        )
    raise ValueError(
        f"{str(model)!r} is not a reranker: its config.json names no BERT-family "
        "*ForSequenceClassification (a cross-encoder such as ms-marco-MiniLM or "
        "bge-reranker) and its name no LLM reranker (Qwen3-Reranker). Embedding models "
        "go to MLXEmbeddings/MLXEmbedding, chat models to ChatMLX/MLXLLM."
    )
