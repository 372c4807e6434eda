"""MLXEmbedding: the LlamaIndex BaseEmbedding contract, faithfulness and retrieval."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from pydantic import ValidationError

from mlx_integrations.embeddings.engine import EmbeddingTruncationWarning
from mlx_integrations.llama_index import MLXEmbedding
from tests.embeddings.conftest import ModelVariant
from tests.embeddings.corpus import PASSAGES, QUESTIONS
from tests.embeddings.test_engine import MAX_COSINE_DISTANCE, cosine_distances


@pytest.fixture(scope="module")
def embed_model(minilm_path: Path) -> MLXEmbedding:
    return MLXEmbedding(model_name=str(minilm_path))


def test_public_names_and_class_name(embed_model: MLXEmbedding) -> None:
    import mlx_integrations.llama_index as pkg
    from mlx_integrations.llama_index import embedding as module

    assert "MLXEmbedding" in pkg.__all__
    assert module.__all__ == ["MLXEmbedding"]
    assert isinstance(embed_model, BaseEmbedding)
    assert MLXEmbedding.class_name() == "MLXEmbedding"
    assert embed_model.to_dict()["class_name"] == "MLXEmbedding"


def test_every_own_field_is_documented() -> None:
    own = set(MLXEmbedding.model_fields) - set(BaseEmbedding.model_fields) | {
        "model_name",
        "embed_batch_size",
    }
    for name in own:
        assert MLXEmbedding.model_fields[name].description, f"field {name} has no docstring"


def test_text_and_query_embeddings_match_sentence_transformers(
    embed_model: MLXEmbedding, minilm_reference: dict[str, Any]
) -> None:
    sentences = minilm_reference["sentences"]
    reference = minilm_reference["mean_normalized"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EmbeddingTruncationWarning)
        batch = embed_model.get_text_embedding_batch(sentences)
    assert cosine_distances(batch, reference).max() < MAX_COSINE_DISTANCE
    single = embed_model.get_text_embedding(sentences[5])
    query = embed_model.get_query_embedding(sentences[5])
    assert cosine_distances([single, query], [reference[5]] * 2).max() < MAX_COSINE_DISTANCE


async def test_async_methods_match_sync(embed_model: MLXEmbedding) -> None:
    texts = ["The cat sits on the mat.", "A man is playing a guitar on stage.", "Yes."]
    batch = await embed_model.aget_text_embedding_batch(texts)
    one = await embed_model.aget_text_embedding(texts[1])
    query = await embed_model.aget_query_embedding(texts[2])
    expected = embed_model.get_text_embedding_batch(texts)
    np.testing.assert_allclose(batch, expected, atol=1e-5)
    np.testing.assert_allclose(one, expected[1], atol=1e-5)
    np.testing.assert_allclose(query, expected[2], atol=1e-5)


def test_batches_larger_than_embed_batch_size(minilm_path: Path) -> None:
    small = MLXEmbedding(model_name=str(minilm_path), embed_batch_size=3)
    texts = [f"sentence {i} about item {i * 7}" for i in range(10)]
    vectors = small.get_text_embedding_batch(texts)
    assert len(vectors) == 10
    np.testing.assert_allclose(vectors, small._engine.embed(texts), atol=1e-5)  # type: ignore[union-attr]


def test_instructions_from_fields_and_from_model_config(
    model_variant: ModelVariant, embed_model: MLXEmbedding
) -> None:
    e5_style = MLXEmbedding(
        model_name=embed_model.model_name,
        query_instruction="query: ",
        text_instruction="passage: ",
    )
    np.testing.assert_allclose(
        e5_style.get_query_embedding("rivers"),
        embed_model.get_text_embedding("query: rivers"),
        atol=1e-6,
    )
    np.testing.assert_allclose(
        e5_style.get_text_embedding("rivers"),
        embed_model.get_text_embedding("passage: rivers"),
        atol=1e-6,
    )
    folder = model_variant(
        {"config_sentence_transformers.json": {"prompts": {"query": "query: ", "passage": "p: "}}}
    )
    from_config = MLXEmbedding(model_name=str(folder))
    np.testing.assert_allclose(
        from_config.get_text_embedding("rivers"),
        embed_model.get_text_embedding("p: rivers"),
        atol=1e-6,
    )


def test_shares_the_engine_with_langchain(minilm_path: Path, embed_model: MLXEmbedding) -> None:
    from mlx_integrations.langchain import MLXEmbeddings

    assert MLXEmbeddings(model_name=str(minilm_path))._engine is embed_model._engine


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"model_name": "/no/such/folder"}, FileNotFoundError, "is not a folder"),
        ({"embed_batch_size": 0}, ValidationError, "greater than 0"),
        ({"pooling": "sum"}, ValidationError, "pooling"),
        ({"max_length": 4096}, ValueError, "exceeds the limit"),
    ],
)
def test_bad_settings_fail_at_construction(
    minilm_path: Path, kwargs: dict[str, Any], error: type, match: str
) -> None:
    params = {"model_name": str(minilm_path), **kwargs}
    with pytest.raises(error, match=match):
        MLXEmbedding(**params)


def test_importing_the_module_loads_no_mlx_and_no_torch() -> None:
    code = (
        "import sys\n"
        "from mlx_integrations.llama_index import MLXEmbedding\n"
        "heavy = [m for m in ('mlx.core', 'torch', 'transformers') if m in sys.modules]\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _index(embed_model: MLXEmbedding) -> VectorStoreIndex:
    docs = [Document(text=text, metadata={"key": key}) for key, text in PASSAGES.items()]
    return VectorStoreIndex.from_documents(docs, embed_model=embed_model)


def test_vector_store_index_retrieves_the_right_passage(embed_model: MLXEmbedding) -> None:
    retriever = _index(embed_model).as_retriever(similarity_top_k=1)
    hits = {q: retriever.retrieve(q)[0].node.metadata["key"] for q, _ in QUESTIONS}
    assert hits == {q: key for q, key in QUESTIONS}


async def test_vector_store_index_async_retrieval(embed_model: MLXEmbedding) -> None:
    retriever = _index(embed_model).as_retriever(similarity_top_k=2)
    question, key = QUESTIONS[0]
    nodes = await retriever.aretrieve(question)
    assert nodes[0].node.metadata["key"] == key
    assert nodes[0].score > nodes[1].score


def test_works_as_the_global_embed_model(embed_model: MLXEmbedding) -> None:
    previous = Settings._embed_model
    Settings.embed_model = embed_model
    try:
        docs = [Document(text=text, metadata={"key": key}) for key, text in PASSAGES.items()]
        index = VectorStoreIndex.from_documents(docs)
        question, key = QUESTIONS[6]
        assert index.as_retriever(similarity_top_k=1).retrieve(question)[0].metadata["key"] == key
    finally:
        Settings._embed_model = previous
