"""The cross-encoder engine: one relevance score per (query, document) pair, on MLX.

A :class:`RerankEngine` is an :class:`~mlx_integrations.embeddings.encoder_engine.EncoderEngine`
(its own owner thread, keep-alive, memory budget) for a cross-encoder folder: tokenizer
files and a ``*ForSequenceClassification`` ``config.json`` with safetensors weights.
Pairs are tokenized as sentence-transformers' ``CrossEncoder`` tokenizes them (the query
as the first segment, the document as the second, ``longest_first`` truncation to the
model's window), grouped by length and scored in batches.

:func:`get_rerank_engine` shares one engine per resolved model folder across the process.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlx_integrations.embeddings.encoder_engine import (
    EncoderDtype,
    EncoderEngine,
    auto_tokenizer,
    clear_encoder_engines,
    pad_right,
    shared,
    split_batches,
)
from mlx_integrations.embeddings.engine import plan_batches, resolve_embedding_model

if TYPE_CHECKING:
    from mlx_integrations.embeddings.cross_encoder import CrossEncoderModel

__all__ = [
    "DEFAULT_RERANK_BATCH_SIZE",
    "RerankEngine",
    "RerankModelInfo",
    "RerankScores",
    "clear_rerank_engines",
    "get_rerank_engine",
]

DEFAULT_RERANK_BATCH_SIZE = 32


@dataclass(frozen=True)
class RerankModelInfo:
    """What a :class:`RerankEngine` serves."""

    path: Path
    """The resolved model folder."""
    max_length: int
    """Pairs longer than this many tokens (special tokens included) are truncated."""
    activation: str
    """``sigmoid`` (scores in 0..1) or ``identity`` (raw logits)."""
    dtype: EncoderDtype
    """The floating point type of the forward pass."""


@dataclass(frozen=True)
class RerankScores:
    """The scores of one call, in the order of the documents given, and its size."""

    scores: list[float]
    """One relevance score per document; higher is more relevant."""
    tokens: int
    """Tokens read, over all pairs (after truncation)."""


class RerankEngine(EncoderEngine):
    """A cross-encoder on its own owner thread, callable from any thread or loop.

    Prefer :func:`get_rerank_engine`, which shares one engine per model folder.

    Examples:
        >>> from mlx_integrations.embeddings.rerank_engine import get_rerank_engine
        >>> engine = get_rerank_engine("/path/to/ms-marco-MiniLM-L-6-v2")  # doctest: +SKIP
        >>> engine.score("What runs on Macs?", ["MLX runs on Apple silicon.", "Paris."])
        ... # doctest: +SKIP
        RerankScores(scores=[0.93, 0.0004], tokens=23)
    """

    kind = "reranker"
    _model: CrossEncoderModel | None
    info: RerankModelInfo

    def score(
        self,
        query: str,
        documents: Sequence[str],
        *,
        batch_size: int = DEFAULT_RERANK_BATCH_SIZE,
        max_length: int | None = None,
    ) -> RerankScores:
        """Score each document against the query, blocking the calling thread only.

        Args:
            query: The query.
            documents: The documents' texts; the result has one score per document.
            batch_size: Pairs run through the model at once.
            max_length: A lower token limit than the model's, for the pair together.

        Raises:
            TypeError: A query or document that is not a string.
            ValueError: A bad batch size or max length.
        """
        args = self._check(query, documents, batch_size, max_length)
        return self._submit(self._run, *args).result()

    async def ascore(
        self,
        query: str,
        documents: Sequence[str],
        *,
        batch_size: int = DEFAULT_RERANK_BATCH_SIZE,
        max_length: int | None = None,
    ) -> RerankScores:
        """Score documents without blocking the event loop; arguments as in :meth:`score`."""
        args = self._check(query, documents, batch_size, max_length)
        return await asyncio.wrap_future(self._submit(self._run, *args))

    # -- caller side -------------------------------------------------------------------

    def _check(
        self, query: str, documents: Sequence[str], batch_size: int, max_length: int | None
    ) -> tuple[str, list[str], int, int]:
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, not {type(query).__name__}.")
        if isinstance(documents, str) or not isinstance(documents, Sequence):
            raise TypeError(
                f"documents must be a list of strings, not {type(documents).__name__}; "
                "wrap a single document in a list."
            )
        for i, doc in enumerate(documents):
            if not isinstance(doc, str):
                raise TypeError(f"documents[{i}] is a {type(doc).__name__}, not a str.")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}.")
        limit = self.info.max_length
        if max_length is not None:
            if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 4:
                raise ValueError(f"max_length must be an integer >= 4, not {max_length!r}.")
            if max_length > limit:
                raise ValueError(
                    f"max_length {max_length} exceeds the window of {self.path.name} "
                    f"({limit} tokens); use at most {limit}."
                )
            limit = max_length
        return query, list(documents), batch_size, limit

    # -- owner thread ------------------------------------------------------------------

    def _load_model(self) -> RerankModelInfo:
        import mlx.core as mx

        from mlx_integrations.embeddings.cross_encoder import load_cross_encoder

        self._model = load_cross_encoder(self.path, dtype=getattr(mx, self.dtype))
        self._tokenizer = auto_tokenizer().from_pretrained(str(self.path))
        config = self._model.config
        max_length = config.max_position_embeddings
        if config.positions_after_padding_id:  # positions pad+1 ... pad+n must exist
            max_length -= config.pad_token_id + 1
        model_max = getattr(self._tokenizer, "model_max_length", None)
        if isinstance(model_max, int) and 0 < model_max < max_length:
            max_length = model_max
        return RerankModelInfo(
            path=self.path,
            max_length=max_length,
            activation=self._model.head.activation,
            dtype=self.dtype,
        )

    def _run(self, query: str, documents: list[str], batch_size: int, limit: int) -> RerankScores:
        import numpy as np

        if not documents:
            return RerankScores([], 0)
        enc = self._tokenizer(
            [query] * len(documents), documents, truncation="longest_first", max_length=limit
        )
        ids: list[list[int]] = enc["input_ids"]
        types: list[list[int]] | None = enc.get("token_type_ids")
        lengths = [len(x) for x in ids]
        batches = split_batches(plan_batches(lengths, batch_size), lengths)

        def forward(batch: list[int]) -> Any:
            return self._score_batch(
                [ids[i] for i in batch], [types[i] for i in batch] if types else None
            )

        scores = np.zeros(len(documents), dtype=np.float32)
        for batch, values in zip(batches, self._forward_all(batches, forward), strict=True):
            scores[batch] = values
        return RerankScores(scores.tolist(), sum(lengths))

    def _score_batch(self, ids: list[list[int]], types: list[list[int]] | None) -> Any:
        assert self._model is not None
        return self._model.scores(*pad_right(ids, types, self._tokenizer.pad_token_id or 0))


def get_rerank_engine(
    model: str | os.PathLike[str], *, dtype: EncoderDtype = "float32", keep_alive: Any = None
) -> RerankEngine:
    """Return the process-wide cross-encoder engine for a model, loading it on first use.

    Args:
        model: A model folder, a store name or alias, or a Hub id pulled with ``mlxi pull``.
        dtype: The floating point type of the forward pass.
        keep_alive: Set the shared engine's keep-alive (seconds or ``"5m"``; 0: unload
            after each call; -1: keep loaded); None leaves it as it is.

    Raises:
        FileNotFoundError: When nothing by that name exists locally.
        ValueError: When the model is not a cross-encoder.
    """
    return shared(RerankEngine, resolve_embedding_model(model), dtype, keep_alive)


def clear_rerank_engines() -> int:
    """Close every pooled cross-encoder engine and free its weights; returns how many."""
    return clear_encoder_engines(RerankEngine)
