"""``/v1/embeddings`` through the ``openai`` SDK and LangChain's OpenAIEmbeddings."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from mlx_integrations.embeddings import get_embedding_engine
from mlx_integrations.serve.config import ModelConfig, ServeConfig
from mlx_integrations.serve.server import BackgroundServer

TEXTS = ["MLX runs on Apple silicon.", "So does this sentence."]


@pytest.fixture(scope="module")
def minilm() -> Path:
    from tests.support.minilm import ensure_minilm

    return ensure_minilm()


@pytest.fixture(scope="module")
def client(minilm: Path, tiny_llama: Path) -> Iterator[openai.OpenAI]:
    config = ServeConfig(
        models=[
            ModelConfig("minilm", source=str(minilm), preload=True),
            ModelConfig("tiny", source=str(tiny_llama)),
        ]
    )
    with BackgroundServer(config) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_vectors_are_the_engines(client: openai.OpenAI, minilm: Path):
    # The SDK asks for base64 by default and decodes it; floats are asked for here too.
    packed = client.embeddings.create(model="minilm", input=TEXTS)
    floats = client.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    local = get_embedding_engine(minilm).embed(TEXTS)
    for reply in (packed, floats):
        assert [d.index for d in reply.data] == [0, 1]
        for got, want in zip(reply.data, local, strict=True):
            assert len(got.embedding) == 384
            assert max(abs(a - b) for a, b in zip(got.embedding, want, strict=True)) < 1e-5
    assert packed.usage.prompt_tokens > len(TEXTS)
    assert math.isclose(sum(v * v for v in floats.data[0].embedding), 1.0, rel_tol=1e-4)


def test_langchain_openai_embeddings(client: openai.OpenAI):
    from langchain_openai import OpenAIEmbeddings

    embedder = OpenAIEmbeddings(
        base_url=str(client.base_url),
        api_key="unused",
        model="minilm",  # type: ignore[arg-type]
        check_embedding_ctx_length=False,
    )
    vectors = embedder.embed_documents(TEXTS)
    assert len(vectors) == 2 and len(vectors[0]) == 384


def test_the_wrong_kind_of_model_is_a_400(client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError, match="is a chat model; send it to POST /v1/chat"):
        client.embeddings.create(model="tiny", input=TEXTS)
    with pytest.raises(openai.BadRequestError, match="embedding model and generates no text"):
        client.chat.completions.create(model="minilm", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="minilm", input=[[1, 2, 3]])
    assert "check_embedding_ctx_length=False" in caught.value.message
    with pytest.raises(openai.BadRequestError) as dims:
        client.embeddings.create(model="minilm", input=TEXTS, dimensions=64)
    assert dims.value.body["param"] == "dimensions"  # type: ignore[index]
