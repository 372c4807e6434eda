"""keep_alive on the adapters, Ollama's way: it sets the engine's, the model unloads when
idle past it, and the next call loads it again, unseen but for the time it takes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mlx_integrations.engine import pool
from mlx_integrations.runtime import residency


@pytest.fixture(autouse=True)
def defaults_after() -> Iterator[None]:
    yield
    residency.set_clock(None)


def test_chatmlx_keep_alive_0_unloads_after_each_call(tiny_llama: Path):
    from mlx_integrations.langchain import ChatMLX

    # An engine of its own (no other test's adapter shares it), so that only these calls
    # load and unload it.
    own = {"max_num_seqs": 3}
    llm = ChatMLX(
        model=str(tiny_llama), keep_alive=0, max_tokens=6, temperature=0, engine_options=own
    )
    engine = llm.engine
    try:
        assert engine.keep_alive == 0
        first = llm.invoke("Hello").content
        assert residency.wake(wait=30) and not engine.is_loaded
        loads = engine.get_stats()["residency"]["loads"]
        assert llm.invoke("Hello").content == first  # loaded again, the same reply
        assert engine.get_stats()["residency"]["loads"] == loads + 1
        assert residency.wake(wait=30) and not engine.is_loaded
    finally:
        engine.keep_alive = None  # the process default again


def test_the_last_adapter_with_a_keep_alive_sets_the_shared_engines(tiny_llama: Path):
    from llama_index.core.base.llms.types import ChatMessage

    from mlx_integrations.langchain import ChatMLX
    from mlx_integrations.llama_index import MLXLLM

    now = [0.0]
    residency.set_clock(lambda: now[0])
    chat = ChatMLX(model=str(tiny_llama), engine_type="simple", max_tokens=3, temperature=0)
    llm = MLXLLM(model=str(tiny_llama), engine_type="simple", keep_alive="2m", max_tokens=3)
    try:
        assert chat.engine is llm.engine and chat.engine.keep_alive == 120
        llm.chat([ChatMessage(role="user", content="Hi")])
        [info] = [
            m
            for m in pool.resident_models()
            if m["path"] == str(tiny_llama) and m["keep_alive_s"] == 120
        ]
        assert info["kind"] == "chat" and info["memory_bytes"] > 0
        assert info["expires_in_s"] == pytest.approx(120)
        now[0] += 121
        assert residency.wake(wait=30) and not chat.engine.is_loaded
        assert chat.invoke("Hi").content is not None  # loads again
    finally:
        chat.engine.keep_alive = None


@pytest.mark.parametrize("adapter", ["ChatMLX", "MLXLLM"])
def test_a_bad_keep_alive_is_refused_when_the_adapter_is_made(tiny_llama: Path, adapter):
    if adapter == "ChatMLX":
        from mlx_integrations.langchain import ChatMLX as cls
    else:
        from mlx_integrations.llama_index import MLXLLM as cls
    with pytest.raises(ValueError, match=r"keep_alive='five minutes' is not a duration; use"):
        cls(model=str(tiny_llama), keep_alive="five minutes")


def test_embedding_adapters_take_a_keep_alive(minilm_path: Path):
    from mlx_integrations.langchain import MLXEmbeddings

    embeddings = MLXEmbeddings(model_name=str(minilm_path), keep_alive=0)
    engine = embeddings._get_engine()
    try:
        assert engine.keep_alive == 0
        first = embeddings.embed_query("Paris")
        assert residency.wake(wait=30) and not engine.is_loaded
        again = embeddings.embed_query("Paris")
        assert max(abs(x - y) for x, y in zip(first, again, strict=True)) < 1e-6
    finally:
        engine.keep_alive = None
    with pytest.raises(ValueError, match="is not a duration"):
        MLXEmbeddings(model_name=str(minilm_path), keep_alive="soon")


@pytest.fixture(scope="module")
def minilm_path() -> Path:
    from tests.support.minilm import ensure_minilm

    return ensure_minilm()
