"""The fields and reranker access that LangChain's and LlamaIndex's ``MLXRerank`` share.

An adapter subclasses :class:`RerankSettings` before its framework's base class; an LLM
reranker runs on the model's shared chat engine, from the engine pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from mlx_integrations.embeddings.encoder_engine import EncoderDtype
from mlx_integrations.embeddings.llm_rerank import DEFAULT_INSTRUCTION, LLMReranker
from mlx_integrations.embeddings.rerank import (
    Reranker,
    RerankResult,
    arerank,
    rerank,
    reranker_kind,
)
from mlx_integrations.embeddings.rerank_engine import (
    DEFAULT_RERANK_BATCH_SIZE,
    RerankEngine,
    RerankScores,
    get_rerank_engine,
)
from mlx_integrations.engine.base import BaseEngine
from mlx_integrations.models.resolve import resolve_model_path
from mlx_integrations.runtime.memory import parse_keep_alive

RerankKind = Literal["auto", "cross-encoder", "llm"]


class RerankSettings(BaseModel):
    """Fields and reranker of ``MLXRerank`` (LangChain and LlamaIndex).

    The model loads, or the process's copy of it is reused, when the adapter is made.
    """

    model_config = ConfigDict(
        protected_namespaces=(),
        use_attribute_docstrings=True,
        arbitrary_types_allowed=True,
        extra="forbid",
    )

    model: str
    """A model folder, a store name or alias, or a Hub id pulled with ``mlxi pull``."""

    kind: RerankKind = "auto"
    """``cross-encoder``, ``llm`` (scored by its "yes"/"no" logits, as Qwen3-Reranker;
    any chat model can be used so) or ``auto``: what the model's folder says."""

    batch_size: int = Field(default=DEFAULT_RERANK_BATCH_SIZE, gt=0)
    """How many (query, document) pairs a cross-encoder runs at once."""

    max_length: int | None = Field(default=None, ge=4)
    """Truncate each pair to this many tokens; None uses the cross-encoder's window."""

    instruction: str = DEFAULT_INSTRUCTION
    """An LLM reranker's task instruction (the recipe's ``<Instruct>``)."""

    dtype: EncoderDtype = "float32"
    """A cross-encoder's floating point type."""

    keep_alive: float | str | None = None
    """How long the model stays in memory after a call, as Ollama's ``keep_alive``:
    seconds or a duration (``"5m"``); 0 unloads it after each call, -1 keeps it
    loaded. It is the shared engine's setting; None leaves it as it is."""

    engine: BaseEngine | None = Field(default=None, exclude=True)
    """A chat engine to rerank with as an LLM reranker (instead of ``model``'s)."""

    _reranker: Reranker | None = PrivateAttr(default=None)

    @field_validator("keep_alive", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is not None:
            parse_keep_alive(value)  # a bad one is refused here, with what to give
        return value

    @model_validator(mode="after")
    def _load(self) -> Self:
        reranker = self.reranker
        if isinstance(reranker, RerankEngine) and self.max_length is not None:
            limit = reranker.info.max_length
            if self.max_length > limit:
                raise ValueError(
                    f"max_length {self.max_length} exceeds the window of {self.model!r} "
                    f"({limit} tokens); use at most {limit}."
                )
        return self

    @property
    def reranker(self) -> Reranker:
        """The cross-encoder engine or LLM reranker this adapter scores with."""
        current = self._reranker
        if isinstance(current, RerankEngine) and not current.closed:
            return current
        if current is not None and not isinstance(current, RerankEngine):
            return current
        self._reranker = self._make_reranker()
        return self._reranker

    def _pooled_chat_engine(self, model: str) -> BaseEngine:
        """The shared chat engine of ``model`` (made on first use), for an LLM reranker."""
        from mlx_integrations.engine import pool

        engine, _ = pool.engine_for(
            self,
            model,
            None,
            engine_type=pool.default_engine_type(model, {}),
            options={},
            adapter=type(self).__name__,
            keep_alive=self.keep_alive,
        )
        return engine

    def _make_reranker(self) -> Reranker:
        if self.engine is not None:
            return LLMReranker(self.engine, instruction=self.instruction)
        kind = self.kind
        if kind == "auto":
            found = reranker_kind(resolve_model_path(self.model))
            if found is None:
                raise ValueError(
                    f"{self.model!r} is not a reranker: its config.json names no BERT-family "
                    "*ForSequenceClassification (ms-marco-MiniLM, bge-reranker) and its name "
                    "no LLM reranker (Qwen3-Reranker). To rerank with a chat model by its "
                    "'yes'/'no' logits, pass kind='llm'."
                )
            kind = found
        if kind == "llm":
            chat = self._pooled_chat_engine(self.model)
            return LLMReranker(chat, instruction=self.instruction)
        return get_rerank_engine(self.model, dtype=self.dtype, keep_alive=self.keep_alive)

    def _scores(self, query: str, texts: Sequence[str]) -> RerankScores:
        reranker = self.reranker
        if isinstance(reranker, RerankEngine):
            return reranker.score(query, texts, **self._options())
        return reranker.score(query, texts)

    async def _ascores(self, query: str, texts: Sequence[str]) -> RerankScores:
        reranker = self.reranker
        if isinstance(reranker, RerankEngine):
            return await reranker.ascore(query, texts, **self._options())
        return await reranker.ascore(query, texts)

    def _options(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "max_length": self.max_length}

    def rank(self, query: str, documents: Sequence[Any], top_n: int | None) -> list[RerankResult]:
        """The ``top_n`` best documents (strings or objects with a ``text``), best first."""
        return rerank(_Bound(self), query, documents, top_n=top_n).results

    async def arank(
        self, query: str, documents: Sequence[Any], top_n: int | None
    ) -> list[RerankResult]:
        """:meth:`rank` without blocking the event loop."""
        return (await arerank(_Bound(self), query, documents, top_n=top_n)).results


class _Bound:
    """A settings object's reranker with its batch size and window (a :class:`Reranker`)."""

    def __init__(self, settings: RerankSettings):
        self.settings = settings

    def score(self, query: str, documents: Sequence[str]) -> RerankScores:
        return self.settings._scores(query, documents)

    async def ascore(self, query: str, documents: Sequence[str]) -> RerankScores:
        return await self.settings._ascores(query, documents)
