"""An embedding model given to a chat adapter is refused at once, naming the embedding
adapters to use instead (mlx-lm would fail later with "Model type bert not supported.")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tiny_roberta import write_tiny_xlmr


@pytest.fixture(scope="module")
def minilm_path() -> Path:
    from tests.support.minilm import ensure_minilm

    return ensure_minilm()


def chatmlx(path: Path) -> object:
    from mlx_integrations.langchain import ChatMLX

    return ChatMLX(model=str(path))


def mlxllm(path: Path) -> object:
    from mlx_integrations.llama_index import MLXLLM

    return MLXLLM(model=str(path))


def simple_engine(path: Path) -> object:
    from mlx_integrations.engine import SimpleEngine

    return SimpleEngine(path)  # what `mlxi run` makes


@pytest.mark.parametrize("make", [chatmlx, mlxllm, simple_engine])
def test_minilm_is_refused_with_the_embedding_adapters_named(minilm_path: Path, make):
    with pytest.raises(ValueError) as info:
        make(minilm_path)
    message = str(info.value)
    assert f"{str(minilm_path)!r} holds an embedding model (model_type 'bert' and a " in message
    assert "sentence-transformers modules.json), not a chat model" in message
    assert f"MLXEmbeddings(model_name={str(minilm_path)!r})" in message
    assert "from mlx_integrations.llama_index import MLXEmbedding;" in message


def test_the_advice_works(minilm_path: Path):
    with pytest.raises(ValueError) as info:
        chatmlx(minilm_path)
    snippet = str(info.value).split("`")[1]  # the LangChain line the message gives
    statement, expression = snippet.split("; ")
    scope: dict[str, object] = {}
    exec(statement, scope)
    embedder = eval(expression, scope)
    assert len(embedder.embed_query("hello")) == 384


def test_a_bare_roberta_encoder_is_refused_too(tmp_path: Path):
    folder = write_tiny_xlmr(tmp_path / "xlmr")  # config.json and weights, no modules.json
    with pytest.raises(ValueError, match=r"holds an embedding model \(model_type 'xlm-roberta'\)"):
        mlxllm(folder)
