"""LlamaIndex node postprocessor that reranks with a local MLX reranker."""

from __future__ import annotations

from typing import Any

from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle
from pydantic import Field

from mlx_integrations.embeddings.rerank import RerankResult
from mlx_integrations.settings.rerank import RerankSettings


class MLXRerank(RerankSettings, BaseNodePostprocessor):
    """Rerank retrieved nodes with a local MLX reranker, for LlamaIndex: no torch.

    Runs the same rerankers as LangChain's ``MLXRerank``: cross-encoders
    (ms-marco-MiniLM, bge-reranker) on their own MLX engine, or LLM rerankers
    (Qwen3-Reranker) by their "yes"/"no" logits on the shared chat engine. Keeps the
    ``top_n`` best nodes, best first, with the reranker's score as the node's score.

    Setup:
        ``pip install "mlx-integrations[cpu]"`` (macOS wheels need no extra), then put
        a reranker in the store:

        .. code-block:: bash

            mlxi pull cross-encoder/ms-marco-MiniLM-L6-v2

    Instantiate:
        .. code-block:: python

            from mlx_integrations.llama_index import MLXRerank

            reranker = MLXRerank(model="cross-encoder/ms-marco-MiniLM-L6-v2", top_n=4)

    Query engine:
        .. code-block:: python

            query_engine = index.as_query_engine(
                similarity_top_k=20, node_postprocessors=[reranker], llm=llm
            )
            query_engine.query("What runs on a Mac?")  # answered from the 4 best of 20

    Async:
        .. code-block:: python

            nodes = await reranker.apostprocess_nodes(nodes, query_str="What runs on a Mac?")
    """

    top_n: int | None = Field(default=2, gt=0)
    """How many nodes to keep (None: all, reordered)."""

    def __init__(self, model: str, **kwargs: Any) -> None:
        """Load the reranker (or reuse the process's copy of it).

        Args:
            model: A model folder, a store name or alias, or a pulled Hub id.
            **kwargs: Any other field of this class.

        Raises:
            FileNotFoundError: When nothing by that name exists locally.
            ValueError: For a model that is no reranker, or a ``max_length`` above
                its window.
        """
        super().__init__(model=model, **kwargs)

    @classmethod
    def class_name(cls) -> str:
        """The name LlamaIndex records for this class."""
        return "MLXRerank"

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if not nodes:
            return []
        query = _query(query_bundle)
        return _ranked(nodes, self.rank(query, _contents(nodes), self.top_n))

    async def _apostprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if not nodes:
            return []
        query = _query(query_bundle)
        return _ranked(nodes, await self.arank(query, _contents(nodes), self.top_n))


def _query(query_bundle: QueryBundle | None) -> str:
    if query_bundle is None:
        raise ValueError(
            "MLXRerank needs the query: call postprocess_nodes(nodes, query_str=...) "
            "or use it in a query engine's node_postprocessors."
        )
    return query_bundle.query_str


def _contents(nodes: list[NodeWithScore]) -> list[str]:
    return [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes]


def _ranked(nodes: list[NodeWithScore], results: list[RerankResult]) -> list[NodeWithScore]:
    return [NodeWithScore(node=nodes[r.index].node, score=r.relevance_score) for r in results]


__all__ = ["MLXRerank"]
