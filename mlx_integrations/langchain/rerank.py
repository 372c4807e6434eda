"""LangChain document compressor that reranks with a local MLX reranker."""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from pydantic import Field

from mlx_integrations.embeddings.rerank import RerankResult
from mlx_integrations.settings.rerank import RerankSettings


class MLXRerank(RerankSettings, BaseDocumentCompressor):
    """Rerank retrieved documents with a local MLX reranker: no server, no torch.

    Runs cross-encoders (ms-marco-MiniLM, bge-reranker: BERT and XLM-RoBERTa heads) on
    their own MLX engine, or LLM rerankers (Qwen3-Reranker) scored by their "yes"/"no"
    logits on the shared chat engine. Keeps the ``top_n`` best documents, best first,
    each with its score in ``metadata["relevance_score"]``. Every object built on the
    same model shares one copy of the weights, under the process's keep-alive and
    memory budget.

    Setup:
        Install the package and put a reranker in the store:

        .. code-block:: bash

            pip install "mlx-integrations[cpu]"   # macOS wheels need no extra
            mlxi pull cross-encoder/ms-marco-MiniLM-L6-v2
            # or an LLM reranker: mlxi pull Qwen/Qwen3-Reranker-0.6B

    Instantiate:
        .. code-block:: python

            from mlx_integrations.langchain import MLXRerank

            reranker = MLXRerank(model="cross-encoder/ms-marco-MiniLM-L6-v2", top_n=4)

    Rerank:
        .. code-block:: python

            from langchain_core.documents import Document

            docs = [Document(page_content="Paris is in France."),
                    Document(page_content="MLX runs on Apple silicon.")]
            best = reranker.compress_documents(docs, "What runs on a Mac?")
            best[0].page_content, best[0].metadata["relevance_score"]

    Retriever:
        .. code-block:: python

            from langchain_classic.retrievers import ContextualCompressionRetriever

            retriever = ContextualCompressionRetriever(
                base_compressor=reranker, base_retriever=store.as_retriever(k=20)
            )
            retriever.invoke("What runs on a Mac?")  # the 4 best of 20

    Async:
        .. code-block:: python

            best = await reranker.acompress_documents(docs, "What runs on a Mac?")

    Chat model as reranker:
        ``kind="llm"`` scores with any chat model's "yes"/"no" logits, in the
        Qwen3-Reranker prompt; ``engine=`` reuses a chat engine already made
        (``ChatMLX(...).engine``).
    """

    top_n: int | None = Field(default=3, gt=0)
    """How many documents to keep (None: all, reordered)."""

    def compress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
    ) -> Sequence[Document]:
        """Keep the ``top_n`` documents most relevant to the query, best first.

        Args:
            documents: The retrieved documents.
            query: The query.
            callbacks: Not used.

        Returns:
            Copies of the best documents with ``metadata["relevance_score"]``.
        """
        return _ranked(documents, self.rank(query, _contents(documents), self.top_n))

    async def acompress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
    ) -> Sequence[Document]:
        """:meth:`compress_documents` without blocking the event loop."""
        return _ranked(documents, await self.arank(query, _contents(documents), self.top_n))


def _contents(documents: Sequence[Document]) -> list[str]:
    for i, doc in enumerate(documents):
        if not isinstance(doc, Document):
            raise TypeError(f"documents[{i}] is a {type(doc).__name__}, not a Document.")
    return [doc.page_content for doc in documents]


def _ranked(documents: Sequence[Document], results: list[RerankResult]) -> list[Document]:
    out = []
    for result in results:
        doc = documents[result.index]
        metadata = {**doc.metadata, "relevance_score": result.relevance_score}
        out.append(doc.model_copy(update={"metadata": metadata}))
    return out


__all__ = ["MLXRerank"]
