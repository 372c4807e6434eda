"""``/v1/rerank``, ``/rerank`` and ``/v2/rerank`` in Jina's and Cohere's shapes: raw HTTP
and Cohere's Python SDK against a cross-encoder (scores equal sentence-transformers'),
an LLM reranker, and the models that cannot rerank."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlx_integrations.serve.config import ModelConfig, ServeConfig
from mlx_integrations.serve.registry import folder_kind
from mlx_integrations.serve.server import BackgroundServer
from tests.serve.conftest import engine_of
from tests.support.cross_encoders import REFERENCE, write_minilm_cross_encoder
from tests.support.tiny_models import build_tiny_model

SCORE_ATOL = 2e-6  # float32 in two libraries, as tests/embeddings/test_rerank_engine.py


@pytest.fixture(scope="module")
def minilm() -> Path:
    from tests.support.minilm import ensure_minilm

    return ensure_minilm()


@pytest.fixture(scope="module")
def cross_encoder(minilm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_minilm_cross_encoder(minilm, tmp_path_factory.mktemp("ce") / "minilm-ce")


@pytest.fixture(scope="module")
def llm_reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A causal LM named as a reranker, with "yes" and "no" as tokens (Qwen3-Reranker's
    recipe on a tiny random model)."""
    folder = tmp_path_factory.mktemp("models") / "tiny-qwen3-reranker"
    build_tiny_model(folder, arch="qwen2", special_tokens=("yes", "no"))
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["Qwen2ForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def server(
    cross_encoder: Path, llm_reranker: Path, minilm: Path, tiny_llama: Path
) -> Iterator[BackgroundServer]:
    config = ServeConfig(
        models=[
            ModelConfig("ce", source=str(cross_encoder), preload=True),
            ModelConfig("qwen-rr", source=str(llm_reranker)),
            ModelConfig("minilm", source=str(minilm)),
            ModelConfig("tiny", source=str(tiny_llama)),
        ],
        only_listed=True,
    )
    background = BackgroundServer(config)
    background.start()
    yield background
    background.stop()


@pytest.fixture(scope="module")
def reference() -> tuple[str, list[str], list[float]]:
    """One query's documents and sentence-transformers' CrossEncoder scores of them."""
    data = json.loads(REFERENCE.read_text())["minilm"]
    query = data["pairs"][0][0]
    pairs = [(d, s) for (q, d), s in zip(data["pairs"], data["scores"], strict=True) if q == query]
    return query, [d for d, _ in pairs], [s for _, s in pairs]


def post(server: BackgroundServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


def test_a_cross_encoders_scores_equal_sentence_transformers(server, reference):
    query, documents, scores = reference
    reply = post(server, "/v1/rerank", {"model": "ce", "query": query, "documents": documents})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model"] == "ce" and body["id"].startswith("rerank-")
    results = body["results"]
    assert sorted(r["index"] for r in results) == list(range(len(documents)))
    for result in results:
        assert result["relevance_score"] == pytest.approx(scores[result["index"]], abs=SCORE_ATOL)
        assert result["document"] == {"text": documents[result["index"]]}
    got = [r["relevance_score"] for r in results]
    assert got == sorted(got, reverse=True)  # best first
    assert body["usage"]["total_tokens"] > len(documents)
    assert body["meta"]["tokens"]["input_tokens"] == body["usage"]["total_tokens"]
    assert body["meta"]["api_version"]["version"] == "1"
    # /rerank is the same endpoint; top_n keeps the best.
    best = post(
        server, "/rerank", {"model": "ce", "query": query, "documents": documents, "top_n": 2}
    )
    assert [r["index"] for r in best.json()["results"]] == [r["index"] for r in results[:2]]


def test_documents_as_objects_and_the_fields_reported(server, reference):
    query, documents, _ = reference
    body = {
        "model": "ce",
        "query": query,
        "documents": [{"text": d, "title": f"doc {i}"} for i, d in enumerate(documents[:3])],
        "return_documents": False,
        "max_chunks_per_doc": 10,
        "rank_fields": ["text"],
        "max_tokens_per_doc": 512,
        "truncation": True,
    }
    reply = post(server, "/v1/rerank", body)
    assert reply.status_code == 200, reply.text
    assert all("document" not in r for r in reply.json()["results"])
    plain = post(server, "/v1/rerank", {"model": "ce", "query": query, "documents": documents[:3]})
    assert [r["relevance_score"] for r in reply.json()["results"]] == [
        r["relevance_score"] for r in plain.json()["results"]
    ]
    assert reply.headers["x-mlxi-ignored-fields"].split(",") == [
        "documents[0].title",
        "documents[1].title",
        "documents[2].title",
        "max_chunks_per_doc",
        "rank_fields",
        "max_tokens_per_doc",
        "truncation",
    ]


def test_v2_returns_no_documents_unless_asked(server, reference):
    query, documents, _ = reference
    body = {"model": "ce", "query": query, "documents": documents}
    v2 = post(server, "/v2/rerank", body).json()
    assert all("document" not in r for r in v2["results"])
    assert v2["meta"]["api_version"]["version"] == "2"
    asked = post(server, "/v2/rerank", {**body, "return_documents": True}).json()
    assert all(r["document"]["text"] == documents[r["index"]] for r in asked["results"])


def test_cohere_sdk(server, reference):
    cohere = pytest.importorskip("cohere")
    query, documents, scores = reference
    v2 = cohere.ClientV2(api_key="unused", base_url=server.url)
    ranked = v2.rerank(model="ce", query=query, documents=documents, top_n=3)
    assert len(ranked.results) == 3
    for result in ranked.results:
        assert result.relevance_score == pytest.approx(scores[result.index], abs=SCORE_ATOL)
    assert ranked.results[0].relevance_score == pytest.approx(max(scores), abs=SCORE_ATOL)
    v1 = cohere.Client(api_key="unused", base_url=server.url)
    with_docs = v1.rerank(model="ce", query=query, documents=documents, return_documents=True)
    assert [r.index for r in with_docs.results][:3] == [r.index for r in ranked.results]
    assert all(r.document.text == documents[r.index] for r in with_docs.results)


def test_an_llm_reranker_on_its_chat_engine(server, llm_reranker: Path):
    from mlx_integrations.embeddings.llm_rerank import LLMReranker

    assert folder_kind(llm_reranker) == "chat"  # a causal LM: it chats as well
    query = "What is the capital of France?"
    documents = ["The capital of France is Paris.", "Hello! How can I help?", "Rome."]
    reply = post(server, "/v1/rerank", {"model": "qwen-rr", "query": query, "documents": documents})
    assert reply.status_code == 200, reply.text
    expected = LLMReranker(engine_of(server, "qwen-rr")).score(query, documents).scores
    for result in reply.json()["results"]:
        assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=1e-5)
    chat = post(
        server,
        "/v1/chat/completions",
        {"model": "qwen-rr", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    )
    assert chat.status_code == 200


def test_models_that_cannot_rerank_say_what_to_do(server, cross_encoder: Path):
    assert folder_kind(cross_encoder) == "reranker"
    base = {"query": "q", "documents": ["a", "b"]}
    embedder = post(server, "/v1/rerank", {**base, "model": "minilm"})
    assert embedder.status_code == 400 and embedder.json()["error"]["param"] == "model"
    assert "POST /v1/embeddings" in embedder.json()["error"]["message"]
    chat = post(
        server,
        "/v1/chat/completions",
        {"model": "ce", "messages": [{"role": "user", "content": "Hi"}]},
    )
    assert chat.status_code == 400
    assert "is a reranker (a cross-encoder); send it to POST /v1/rerank" in chat.text
    vectors = post(server, "/v1/embeddings", {"model": "ce", "input": "Hi"})
    assert vectors.status_code == 400 and "POST /v1/rerank" in vectors.text


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"documents": []}, "documents"),
        ({"top_n": 0}, "top_n"),
        ({"documents": [{"title": "no text"}]}, "documents[0].text"),
        ({"query": None}, "query"),
    ],
)
def test_bad_fields_are_a_400_naming_them(server, fields: dict[str, Any], param: str):
    reply = post(server, "/v1/rerank", {"model": "ce", "query": "q", "documents": ["a"], **fields})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == param


def test_served_rerankers_show_in_the_figures(server):
    text = httpx.get(f"{server.url}/metrics").text
    assert 'mlxi_model_loaded{model="ce"} 1' in text
