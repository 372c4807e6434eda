"""An embedding model manages its residency as the chat engines do: it unloads when
idle past its keep-alive, loads again at the next call, and takes part in the budget."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mlx_integrations.embeddings.engine import EmbeddingEngine
from mlx_integrations.runtime import residency
from mlx_integrations.runtime.memory import weights_on_disk
from mlx_integrations.runtime.residency_manager import manager

TEXTS = ["MLX runs on Apple silicon.", "The capital of France is Paris."]


@pytest.fixture(autouse=True)
def defaults_after() -> Iterator[None]:
    yield
    residency.set_memory_budget(None, wait_s=30)
    residency.set_clock(None)


def same(a: list[list[float]], b: list[list[float]]) -> bool:
    import numpy as np

    return bool(np.allclose(np.array(a), np.array(b), atol=1e-6))


def active_bytes() -> int:
    import mlx.core as mx

    return mx.get_active_memory()


def test_keep_alive_0_unloads_after_each_call_and_the_next_loads_again(minilm_path: Path):
    engine = EmbeddingEngine(minilm_path, keep_alive="5m")
    try:
        first = engine.embed(TEXTS)
        loaded = engine.residency_stats()
        assert loaded["weights_bytes"] > 20 * 2**20  # MiniLM: 22.7M float32 parameters
        before = active_bytes()
        engine.keep_alive = 0  # idle since the call: unloaded at once
        assert residency.wake(wait=30) and not engine.is_loaded
        assert before - active_bytes() >= 0.9 * loaded["weights_bytes"]
        assert engine.residency_stats()["state"] == "unloaded"
        assert same(engine.embed(TEXTS), first)  # loaded again for the call
        assert residency.wake(wait=30) and not engine.is_loaded  # and unloaded after it
        assert engine.residency_stats()["loads"] == 2
    finally:
        engine.close()


def test_a_short_keep_alive_counts_from_the_last_call(minilm_path: Path):
    now = [50.0]
    residency.set_clock(lambda: now[0])
    engine = EmbeddingEngine(minilm_path, keep_alive="2m")
    try:
        engine.embed(TEXTS)
        assert engine.residency_stats()["expires_in_s"] == pytest.approx(120)
        now[0] += 119
        assert residency.wake(wait=30) and engine.is_loaded
        now[0] += 2
        assert residency.wake(wait=30) and not engine.is_loaded
    finally:
        engine.close()


def test_an_embedder_and_a_chat_model_share_the_budget(minilm_path: Path, tmp_path: Path):
    import asyncio

    from mlx_integrations.engine import SimpleEngine
    from tests.support.tiny_models import build_tiny_model

    chat_model = build_tiny_model(tmp_path / "chat", hidden_size=128, num_hidden_layers=4)

    for entry in list(manager.entries):  # other tests' idle models out first
        if entry.owner is not None and entry.state == "loaded":
            entry.owner.unload_if_idle()
    embedder = EmbeddingEngine(minilm_path)
    chat = SimpleEngine(chat_model)
    try:
        vectors = embedder.embed(TEXTS)
        # Room for the embedder or the chat model, not both.
        room = weights_on_disk(minilm_path) + weights_on_disk(chat_model) // 2
        residency.set_memory_budget(room)
        asyncio.run(chat.generate("Hello", max_tokens=2, temperature=0.0))
        assert chat.is_loaded and not embedder.is_loaded  # least recently used, idle
        assert embedder.residency_stats()["evictions"] == 1
        assert same(embedder.embed(TEXTS), vectors)
        assert not chat.is_loaded and embedder.is_loaded
    finally:
        embedder.close()
        asyncio.run(chat.stop())
