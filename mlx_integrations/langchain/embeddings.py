"""LangChain embeddings on a local MLX sentence-embedding model."""

from __future__ import annotations

from typing import Any, Literal, Self

from langchain_core.embeddings import Embeddings
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from mlx_integrations.engine.embedding import (
    DEFAULT_BATCH_SIZE,
    EmbeddingDtype,
    EmbeddingEngine,
    EmbeddingModelInfo,
    PoolingMode,
    get_embedding_engine,
)


class MLXEmbeddings(BaseModel, Embeddings):
    """Sentence embeddings from a local MLX model: no server, no torch, no network.

    Runs BERT-family sentence-transformers models (all-MiniLM-L6-v2, bge, e5, gte, ...)
    with the pooling and normalisation their own config asks for. Every object built
    on the same model shares one copy of the weights, loaded on one owner thread.

    Setup:
        Install the package and get a model folder, for example with the ``mlxi`` CLI:

        .. code-block:: bash

            pip install "mlx-integrations[cpu]"   # macOS wheels need no extra
            mlxi pull sentence-transformers/all-MiniLM-L6-v2

    Instantiate:
        .. code-block:: python

            from mlx_integrations.langchain import MLXEmbeddings

            embed = MLXEmbeddings(model_name="sentence-transformers/all-MiniLM-L6-v2")
            # or a folder: MLXEmbeddings(model_name="/path/to/all-MiniLM-L6-v2")

    Embed:
        .. code-block:: python

            vectors = embed.embed_documents(["MLX runs on Apple silicon.", "Paris is in France."])
            query = embed.embed_query("Which framework runs on Macs?")
            len(vectors), len(query)  # (2, 384)

    Async:
        .. code-block:: python

            vectors = await embed.aembed_documents(["a text", "another text"])
            query = await embed.aembed_query("a question")

    Vector store:
        .. code-block:: python

            from langchain_core.vectorstores import InMemoryVectorStore

            store = InMemoryVectorStore.from_texts(
                ["MLX is an array framework for Apple silicon.", "Paris is in France."],
                embedding=embed,
            )
            store.similarity_search("What runs on a Mac?", k=1)[0].page_content
            # 'MLX is an array framework for Apple silicon.'

    Query and document prompts:
        e5-style models expect ``"query: "`` and ``"passage: "`` before the text. Models
        whose ``config_sentence_transformers.json`` names prompts get them by default;
        otherwise set ``query_prompt`` and ``document_prompt``.
    """

    model_config = ConfigDict(
        extra="forbid", protected_namespaces=(), use_attribute_docstrings=True
    )

    model_name: str
    """A model folder, a store name or alias, or a Hub id pulled with ``mlxi pull``."""

    batch_size: int = Field(default=DEFAULT_BATCH_SIZE, gt=0)
    """How many texts go through the model at once."""

    normalize: bool | None = None
    """Scale vectors to unit length; None follows the model's config."""

    pooling: PoolingMode | None = None
    """``cls``, ``mean``, ``max`` or ``mean_sqrt_len``; None follows the model's config."""

    max_length: int | None = Field(default=None, ge=2)
    """Truncate inputs to this many tokens; None uses the model's limit."""

    query_prompt: str | None = None
    """Text put before each query; None uses the model's ``query`` prompt, if any."""

    document_prompt: str | None = None
    """Text put before each document; None uses the model's document prompt, if any."""

    dtype: EmbeddingDtype = "float32"
    """Floating point type of the forward pass (``float16`` halves memory on a GPU)."""

    _engine: EmbeddingEngine | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _load_engine(self) -> Self:
        self._get_engine().check_max_length(self.max_length, self.model_name)
        return self

    @property
    def info(self) -> EmbeddingModelInfo:
        """The model's folder, dimension, token limit, pooling and prompts."""
        return self._get_engine().info

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed documents for a vector store.

        Args:
            texts: The documents.

        Returns:
            One vector per document, in order.
        """
        engine = self._get_engine()
        return engine.embed(texts, prompt=self._prompt(engine, "document"), **self._options())

    def embed_query(self, text: str) -> list[float]:
        """Embed a query for a similarity search.

        Args:
            text: The query.

        Returns:
            Its vector.
        """
        _check_text(text)
        engine = self._get_engine()
        return engine.embed([text], prompt=self._prompt(engine, "query"), **self._options())[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed documents without blocking the event loop; see :meth:`embed_documents`."""
        engine = self._get_engine()
        return await engine.aembed(
            texts, prompt=self._prompt(engine, "document"), **self._options()
        )

    async def aembed_query(self, text: str) -> list[float]:
        """Embed a query without blocking the event loop; see :meth:`embed_query`."""
        _check_text(text)
        engine = self._get_engine()
        vectors = await engine.aembed(
            [text], prompt=self._prompt(engine, "query"), **self._options()
        )
        return vectors[0]

    def _get_engine(self) -> EmbeddingEngine:
        # Reload through the pool if the shared engine was closed meanwhile.
        if self._engine is None or self._engine.closed:
            self._engine = get_embedding_engine(self.model_name, dtype=self.dtype)
        return self._engine

    def _prompt(self, engine: EmbeddingEngine, role: Literal["query", "document"]) -> str:
        own = self.query_prompt if role == "query" else self.document_prompt
        return engine.info.prompt_for(role) if own is None else own

    def _options(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "pooling": self.pooling,
            "normalize": self.normalize,
            "max_length": self.max_length,
        }


def _check_text(text: object) -> None:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, not {type(text).__name__}.")


__all__ = ["MLXEmbeddings"]
