"""MLXEmbeddings: the LangChain Embeddings contract, faithfulness and retrieval."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_tests.integration_tests import EmbeddingsIntegrationTests
from pydantic import ValidationError

from mlx_integrations.embeddings.engine import EmbeddingTruncationWarning
from mlx_integrations.langchain import MLXEmbeddings
from tests.embeddings.conftest import ModelVariant
from tests.embeddings.corpus import PASSAGES, QUESTIONS
from tests.embeddings.test_engine import MAX_COSINE_DISTANCE, cosine_distances


@pytest.fixture(scope="module")
def embeddings(minilm_path: Path) -> MLXEmbeddings:
    return MLXEmbeddings(model_name=str(minilm_path))


class TestMLXEmbeddingsStandard(EmbeddingsIntegrationTests):
    """LangChain's own test suite for Embeddings implementations."""

    @property
    def embeddings_class(self) -> type[MLXEmbeddings]:
        return MLXEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        from tests.support.minilm import ensure_minilm

        return {"model_name": str(ensure_minilm())}


def test_public_names() -> None:
    import mlx_integrations.langchain as pkg
    from mlx_integrations.langchain import embeddings as module

    assert "MLXEmbeddings" in pkg.__all__
    assert module.__all__ == ["MLXEmbeddings"]


def test_every_field_is_documented() -> None:
    for name, info in MLXEmbeddings.model_fields.items():
        assert info.description, f"field {name} has no docstring"


def test_documents_and_query_match_sentence_transformers(
    embeddings: MLXEmbeddings, minilm_reference: dict[str, Any]
) -> None:
    sentences = minilm_reference["sentences"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EmbeddingTruncationWarning)
        docs = embeddings.embed_documents(sentences)
    assert cosine_distances(docs, minilm_reference["mean_normalized"]).max() < MAX_COSINE_DISTANCE
    query = embeddings.embed_query(sentences[2])
    assert cosine_distances([query], [minilm_reference["mean_normalized"][2]])[0] < 1e-4


async def test_native_async_matches_sync(embeddings: MLXEmbeddings) -> None:
    texts = ["The cat sits on the mat.", "How do I reset my password?"]
    docs, query = await asyncio.gather(
        embeddings.aembed_documents(texts), embeddings.aembed_query(texts[1])
    )
    np.testing.assert_allclose(docs, embeddings.embed_documents(texts), atol=1e-5)
    np.testing.assert_allclose(query, docs[1], atol=1e-5)


def test_instances_share_one_engine(minilm_path: Path, embeddings: MLXEmbeddings) -> None:
    other = MLXEmbeddings(model_name=str(minilm_path), batch_size=4)
    assert other._engine is embeddings._engine


def test_options_reach_the_engine(minilm_path: Path, embeddings: MLXEmbeddings) -> None:
    cls = MLXEmbeddings(model_name=str(minilm_path), pooling="cls", normalize=False)
    vec = np.asarray(cls.embed_query("a sentence"))
    default = np.asarray(embeddings.embed_query("a sentence"))
    assert abs(np.linalg.norm(vec) - 1.0) > 1e-2  # not normalised
    assert cosine_distances([vec], [default])[0] > 1e-3  # a different pooling


def test_prompts_from_fields_and_from_model_config(
    model_variant: ModelVariant, embeddings: MLXEmbeddings
) -> None:
    prompted = MLXEmbeddings(
        model_name=embeddings.model_name, query_prompt="query: ", document_prompt="passage: "
    )
    np.testing.assert_allclose(
        prompted.embed_query("rivers"), embeddings.embed_query("query: rivers"), atol=1e-6
    )
    np.testing.assert_allclose(
        prompted.embed_documents(["rivers"])[0],
        embeddings.embed_documents(["passage: rivers"])[0],
        atol=1e-6,
    )
    folder = model_variant(
        {"config_sentence_transformers.json": {"prompts": {"query": "query: ", "document": ""}}}
    )
    from_config = MLXEmbeddings(model_name=str(folder))
    np.testing.assert_allclose(
        from_config.embed_query("rivers"), embeddings.embed_query("query: rivers"), atol=1e-6
    )
    # An explicit empty prompt overrides the model's.
    no_prompt = MLXEmbeddings(model_name=str(folder), query_prompt="")
    np.testing.assert_allclose(
        no_prompt.embed_query("rivers"), embeddings.embed_query("rivers"), atol=1e-6
    )


def test_long_document_warns(embeddings: MLXEmbeddings) -> None:
    with pytest.warns(EmbeddingTruncationWarning):
        embeddings.embed_documents(["word " * 400])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"model_name": "/no/such/folder"}, FileNotFoundError, "is not a folder"),
        ({"batch_size": 0}, ValidationError, "greater than 0"),
        ({"pooling": "sum"}, ValidationError, "pooling"),
        ({"max_length": 4096}, ValidationError, "exceeds the limit"),
        ({"nonsense": 1}, ValidationError, r"got unknown field\(s\) \[.nonsense.\]"),
    ],
)
def test_bad_settings_fail_at_construction(
    minilm_path: Path, kwargs: dict[str, Any], error: type, match: str
) -> None:
    params = {"model_name": str(minilm_path), **kwargs}
    with pytest.raises(error, match=match):
        MLXEmbeddings(**params)


def test_bad_query_type_is_rejected(embeddings: MLXEmbeddings) -> None:
    with pytest.raises(TypeError, match="text must be a str"):
        embeddings.embed_query(["a list"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="wrap a single text"):
        embeddings.embed_documents("a string")  # type: ignore[arg-type]


def test_importing_the_module_loads_no_mlx_and_no_torch() -> None:
    code = (
        "import sys, mlx_integrations.langchain.embeddings\n"
        "from mlx_integrations.langchain import MLXEmbeddings\n"
        "heavy = [m for m in ('mlx.core', 'torch', 'transformers') if m in sys.modules]\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_in_memory_vector_store_retrieves_the_right_passage(embeddings: MLXEmbeddings) -> None:
    store = InMemoryVectorStore(embedding=embeddings)
    store.add_documents(
        [Document(page_content=text, metadata={"key": key}) for key, text in PASSAGES.items()]
    )
    hits = {q: store.similarity_search(q, k=1)[0].metadata["key"] for q, _ in QUESTIONS}
    assert hits == {q: key for q, key in QUESTIONS}


async def test_in_memory_vector_store_async(embeddings: MLXEmbeddings) -> None:
    store = await InMemoryVectorStore.afrom_texts(
        list(PASSAGES.values()), embedding=embeddings, metadatas=[{"key": k} for k in PASSAGES]
    )
    question, key = QUESTIONS[3]
    docs = await store.asimilarity_search(question, k=2)
    assert docs[0].metadata["key"] == key
