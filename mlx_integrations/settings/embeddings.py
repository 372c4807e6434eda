"""The settings and engine handling that the LangChain and LlamaIndex embedding adapters share."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from mlx_integrations.embeddings.engine import (
    EmbeddingDtype,
    EmbeddingEngine,
    EmbeddingModelInfo,
    EmbedOptions,
    PoolingMode,
    get_embedding_engine,
)
from mlx_integrations.runtime.memory import parse_keep_alive
from mlx_integrations.settings.fields import model_field_names, reject_unknown_fields

Role = Literal["query", "document"]


class EmbeddingSettings(BaseModel):
    """Fields and engine access of ``MLXEmbeddings`` and ``MLXEmbedding``.

    An adapter subclasses this before its framework's base class and says, with
    :meth:`_batch_size` and :meth:`_own_prompt`, which of its fields hold the batch
    size and the query and document prompts (the frameworks name them differently).
    The model loads, or the process's copy of it is reused, when the adapter is made.
    """

    model_config = ConfigDict(protected_namespaces=(), use_attribute_docstrings=True)

    model_name: str
    """A model folder, a store name or alias, or a Hub id pulled with ``mlxi pull``."""

    normalize: bool | None = None
    """Scale vectors to unit length; None follows the model's config."""

    pooling: PoolingMode | None = None
    """``cls``, ``mean``, ``max`` or ``mean_sqrt_len``; None follows the model's config."""

    max_length: int | None = Field(default=None, ge=2)
    """Truncate inputs to this many tokens; None uses the model's limit."""

    dtype: EmbeddingDtype = "float32"
    """Floating point type of the forward pass (``float16`` halves memory on a GPU)."""

    keep_alive: float | str | None = None
    """How long the model stays in memory after a call, as Ollama's ``keep_alive``:
    seconds or a duration (``"5m"``, ``"1h30m"``); 0 unloads it after each call, -1
    keeps it loaded; the next call loads it again. It is the shared engine's setting.
    None (the default) leaves it: for a new engine ``MLXI_KEEP_ALIVE``, else forever."""

    _engine: EmbeddingEngine | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown_fields(cls, data: Any) -> Any:
        # LlamaIndex's BaseEmbedding drops them silently; another library's name
        # (sentence-transformers' normalize_embeddings) gets a pointer.
        reject_unknown_fields(cls.__name__, data, model_field_names(cls))
        return data

    @field_validator("keep_alive", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is not None:
            parse_keep_alive(value)  # a bad one is refused here, with what to give
        return value

    @model_validator(mode="after")
    def _load_engine(self) -> Self:
        self._get_engine().check_max_length(self.max_length, self.model_name)
        return self

    @property
    def info(self) -> EmbeddingModelInfo:
        """The model's folder, dimension, token limit, pooling and prompts."""
        return self._get_engine().info

    @abstractmethod
    def _batch_size(self) -> int:
        """How many texts go through the model at once (the adapter's own field)."""

    @abstractmethod
    def _own_prompt(self, role: Role) -> str | None:
        """The adapter's prompt field for ``role``; None uses the model's prompt."""

    def _embed(self, texts: list[str], role: Role) -> list[list[float]]:
        engine = self._get_engine()
        return engine.embed(texts, **self._options(engine, role))

    async def _aembed(self, texts: list[str], role: Role) -> list[list[float]]:
        engine = self._get_engine()
        return await engine.aembed(texts, **self._options(engine, role))

    def _get_engine(self) -> EmbeddingEngine:
        # Reload through the pool if the shared engine was closed meanwhile.
        if self._engine is None or self._engine.closed:
            self._engine = get_embedding_engine(
                self.model_name, dtype=self.dtype, keep_alive=self.keep_alive
            )
        return self._engine

    def _options(self, engine: EmbeddingEngine, role: Role) -> EmbedOptions:
        own = self._own_prompt(role)
        return EmbedOptions(
            prompt=engine.info.prompt_for(role) if own is None else own,
            batch_size=self._batch_size(),
            pooling=self.pooling,
            normalize=self.normalize,
            max_length=self.max_length,
        )
