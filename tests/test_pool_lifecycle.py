"""The engine pool through the adapters: a failed load keeps nothing and is retried;
unloading and shutdown have async forms that leave the event loop free."""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path

import pytest

from mlx_integrations.engine import pool


def owner_threads(folder: Path) -> list[threading.Thread]:
    """Live owner threads of the engines made for ``folder`` (named after it)."""
    prefix = f"mlxi-owner-{folder.name}"
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def pooled(engine) -> bool:
    return any(e is engine for e, _ in pool.shared_engines())


@pytest.fixture
def corrupt_model(tiny_llama: Path, tmp_path: Path, request: pytest.FixtureRequest):
    """A copy of the tiny model whose weights lack a tensor (the header is valid, so only
    loading finds it); ``restore()`` puts the full weights back."""
    import mlx.core as mx

    folder = tmp_path / f"corrupt-{request.node.name.split('[')[0][-20:]}"
    shutil.copytree(tiny_llama, folder)
    weights = mx.load(str(tiny_llama / "model.safetensors"))
    del weights["model.norm.weight"]
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})

    def restore() -> None:
        shutil.copy(tiny_llama / "model.safetensors", folder / "model.safetensors")

    return folder, restore


def _chatmlx(folder: Path):
    from mlx_integrations.langchain import ChatMLX

    llm = ChatMLX(model=str(folder), max_tokens=2, temperature=0)
    return llm, lambda: llm.invoke("Hi").content


def _mlxllm(folder: Path):
    from llama_index.core.base.llms.types import ChatMessage

    from mlx_integrations.llama_index import MLXLLM

    llm = MLXLLM(model=str(folder), max_tokens=2, temperature=0)
    return llm, lambda: llm.chat([ChatMessage(role="user", content="Hi")]).message.content


@pytest.mark.parametrize("make", [_chatmlx, _mlxllm], ids=["ChatMLX", "MLXLLM"])
def test_failed_load_releases_everything_and_is_retried(corrupt_model, make):
    folder, restore = corrupt_model
    assert owner_threads(folder) == []
    llm, call = make(folder)
    engine = llm.engine
    assert pooled(engine)
    for _ in range(2):  # the second call loads again (and fails again), never a stale error
        with pytest.raises(ValueError, match=r"model\.norm\.weight"):
            call()
        assert owner_threads(folder) == []  # the owner thread is given back
        assert not pooled(engine)  # out of the pool at once, no unload_idle() needed
        assert engine._lease is None and not engine.is_loaded
    # Another adapter for the model gets a fresh engine, not the failed one.
    other, _ = make(folder)
    assert other.engine is not engine and pooled(other.engine)
    restore()
    assert isinstance(call(), str)  # the same adapter retries the load, which now works
    assert len(owner_threads(folder)) == 1
    assert engine.is_loaded
    asyncio.run(engine.stop())


async def test_async_unload_idle_and_shutdown(tiny_llama, monkeypatch):
    monkeypatch.setattr(pool, "_slots", {})  # this test's engines only
    idle = pool.acquire(tiny_llama, cache_memory_mb=3)
    used = pool.acquire(tiny_llama, cache_memory_mb=5)
    await idle.start()
    await used.start()
    pool.release(idle)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    try:
        await asyncio.sleep(0)
        before = ticks
        assert await pool.aunload_idle() == 1
        assert ticks > before  # the loop ran other tasks while the model was freed
        assert not idle.is_loaded and used.is_loaded
        assert [e for e, _ in pool.shared_engines()] == [used]
        before = ticks
        await pool.ashutdown()
        assert ticks > before
        assert not used.is_loaded and pool.shared_engines() == []
    finally:
        ticker.cancel()


def test_an_adapter_collected_while_the_pool_is_busy_is_released(tiny_llama):
    """The garbage collector may free an adapter (and so call pool.release) on a thread
    that holds the pool's lock, as acquire() does while it makes an engine."""
    import gc

    from mlx_integrations.langchain import ChatMLX

    box: list = [ChatMLX(model=str(tiny_llama), engine_options={"cache_memory_mb": 9})]
    box.append(box)  # a cycle: only a collection frees the adapter
    engine = box[0].engine
    users = dict((id(e), n) for e, n in pool.shared_engines())[id(engine)]
    done = threading.Event()

    def collect_inside_the_pool() -> None:
        nonlocal box
        with pool._lock:
            box = []
            gc.collect()
        done.set()

    worker = threading.Thread(target=collect_inside_the_pool, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert done.is_set(), "pool.release() from the collector waited for its own thread"
    assert dict((id(e), n) for e, n in pool.shared_engines())[id(engine)] == users - 1
