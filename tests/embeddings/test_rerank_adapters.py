"""MLXRerank for LangChain (document compressor) and LlamaIndex (node postprocessor),
and the rerank library function an HTTP endpoint calls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mlx_integrations  # noqa: F401  (BLAS preload before mlx.core)
from tests.support.cross_encoders import DOCUMENTS, QUERY, REFERENCE, write_minilm_cross_encoder


@pytest.fixture(scope="module")
def cross_encoder(minilm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_minilm_cross_encoder(minilm_path, tmp_path_factory.mktemp("ce") / "minilm-ce")


@pytest.fixture(scope="module")
def expected() -> list[float]:
    """sentence-transformers' scores of QUERY against each of DOCUMENTS."""
    minilm = json.loads(REFERENCE.read_text())["minilm"]
    return [s for (q, _), s in zip(minilm["pairs"], minilm["scores"], strict=True) if q == QUERY]


def test_rerank_ranks_strings_and_objects(cross_encoder: Path, expected: list[float]) -> None:
    from mlx_integrations.embeddings.rerank import load_reranker, rerank

    reranker = load_reranker(str(cross_encoder))
    docs: list[Any] = [DOCUMENTS[0], {"text": DOCUMENTS[1]}, *DOCUMENTS[2:]]
    ranking = rerank(reranker, QUERY, docs, top_n=3)
    results = ranking.results
    assert ranking.tokens > 128  # every pair counts, kept or not
    best = list(np.argsort(expected)[::-1][:3])
    assert [r.index for r in results] == best
    assert [r.relevance_score for r in results] == pytest.approx(
        [expected[i] for i in best], abs=2e-6
    )
    assert results[0].text == DOCUMENTS[best[0]]
    assert len(rerank(reranker, QUERY, docs).results) == len(docs)
    with pytest.raises(TypeError, match=r"documents\[1\] is a dict without a text"):
        rerank(reranker, QUERY, ["a", {"content": "b"}])
    with pytest.raises(ValueError, match="top_n must be a positive integer or None, not 0"):
        rerank(reranker, QUERY, ["a"], top_n=0)


def test_load_reranker_refuses_an_embedding_model(minilm_path: Path) -> None:
    from mlx_integrations.embeddings.rerank import load_reranker

    with pytest.raises(ValueError, match=r"is not a reranker.*MLXEmbeddings"):
        load_reranker(str(minilm_path))


def test_langchain_compressor_in_a_retriever(cross_encoder: Path, expected: list[float]) -> None:
    from langchain_classic.retrievers import ContextualCompressionRetriever
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever

    from mlx_integrations.langchain import MLXRerank

    docs = [Document(page_content=t, metadata={"n": i}) for i, t in enumerate(DOCUMENTS)]

    class Everything(BaseRetriever):
        def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Document]:
            return docs

    reranker = MLXRerank(model=str(cross_encoder), top_n=2)
    retriever = ContextualCompressionRetriever(
        base_compressor=reranker, base_retriever=Everything()
    )
    found = retriever.invoke(QUERY)
    best = list(np.argsort(expected)[::-1][:2])
    assert [d.metadata["n"] for d in found] == best
    assert found[0].metadata["relevance_score"] == pytest.approx(expected[best[0]], abs=2e-6)
    assert "relevance_score" not in docs[best[0]].metadata  # the input is left alone


async def test_langchain_async_matches_sync(cross_encoder: Path) -> None:
    from langchain_core.documents import Document

    from mlx_integrations.langchain import MLXRerank

    reranker = MLXRerank(model=str(cross_encoder), top_n=None)
    docs = [Document(page_content=t) for t in DOCUMENTS]
    sync = reranker.compress_documents(docs, QUERY)
    done = await reranker.acompress_documents(docs, QUERY)
    assert [d.page_content for d in done] == [d.page_content for d in sync]
    assert len(done) == len(DOCUMENTS)


def test_adapters_share_one_engine_and_check_fields(cross_encoder: Path) -> None:
    from mlx_integrations.langchain import MLXRerank as LangChainRerank
    from mlx_integrations.llama_index import MLXRerank as LlamaIndexRerank

    a = LangChainRerank(model=str(cross_encoder))
    b = LlamaIndexRerank(str(cross_encoder), keep_alive="5m")
    assert a.reranker is b.reranker  # one copy of the weights
    assert b.reranker.keep_alive == 300
    with pytest.raises(ValueError, match="max_length 4096 exceeds the window"):
        LangChainRerank(model=str(cross_encoder), max_length=4096)
    with pytest.raises(ValueError, match="top_n"):
        LangChainRerank(model=str(cross_encoder), top_n=0)
    with pytest.raises(ValueError, match="keep_alive"):
        LlamaIndexRerank(str(cross_encoder), keep_alive="soon")
    with pytest.raises(ValueError, match="top_k"):
        LangChainRerank(model=str(cross_encoder), top_k=3)


def test_llama_index_postprocessor_in_a_query_engine(
    cross_encoder: Path, expected: list[float]
) -> None:
    from llama_index.core import Document, VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.core.llms import MockLLM

    from mlx_integrations.llama_index import MLXRerank

    # The reranker reads what the embedder reads: metadata kept out of it is not scored.
    docs = [
        Document(text=t, metadata={"n": i}, excluded_embed_metadata_keys=["n"])
        for i, t in enumerate(DOCUMENTS)
        if t
    ]
    index = VectorStoreIndex.from_documents(
        docs,
        embed_model=MockEmbedding(embed_dim=8),
    )
    reranker = MLXRerank(str(cross_encoder), top_n=2)
    engine = index.as_query_engine(
        similarity_top_k=10, node_postprocessors=[reranker], llm=MockLLM()
    )
    response = engine.query(QUERY)
    best = [i for i in np.argsort(expected)[::-1] if DOCUMENTS[i]][:2]
    assert [n.node.metadata["n"] for n in response.source_nodes] == best
    assert response.source_nodes[0].score == pytest.approx(expected[best[0]], abs=2e-6)
    assert reranker.to_dict()["class_name"] == "MLXRerank"


async def test_llama_index_async_and_query_str(cross_encoder: Path) -> None:
    from llama_index.core.schema import NodeWithScore, TextNode

    from mlx_integrations.llama_index import MLXRerank

    reranker = MLXRerank(str(cross_encoder), top_n=3)
    nodes = [NodeWithScore(node=TextNode(text=t), score=0.0) for t in DOCUMENTS]
    done = await reranker.apostprocess_nodes(nodes, query_str=QUERY)
    sync = reranker.postprocess_nodes(nodes, query_str=QUERY)
    assert [n.node.get_content() for n in done] == [n.node.get_content() for n in sync]
    assert len(done) == 3
    with pytest.raises(ValueError, match="needs the query"):
        reranker.postprocess_nodes(nodes)
