"""Models that manage themselves: keep-alive, a memory budget across models, pinning,
and admission of a request before its KV cache is built.

Unloads and evictions are checked in MLX's own memory figures (``get_stats()["memory"]``,
which reads ``mx.get_active_memory()``; on the CPU backend it reports the real bytes of
the arrays alive), not only in flags. Time is driven by a clock the test moves: the
expiry thread is woken and waited for, never raced against a sleep.
"""

from __future__ import annotations

import asyncio
import gc
import json
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlx_integrations.engine import (
    BatchedEngine,
    MemoryBudgetExceeded,
    ModelTooLarge,
    RequestTooLarge,
    SimpleEngine,
    pool,
)
from mlx_integrations.engine.stats import memory_stats
from mlx_integrations.runtime import backend_info, residency
from mlx_integrations.runtime.memory import weights_on_disk
from mlx_integrations.runtime.residency_manager import manager
from tests.support.tiny_models import build_tiny_model

MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def model_a(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model of about 3 MiB (hidden 128, 4 layers), with varied greedy replies."""
    folder = tmp_path_factory.mktemp("resident-a")
    return build_tiny_model(folder, hidden_size=128, num_hidden_layers=4, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def model_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another of the same shape and other weights."""
    folder = tmp_path_factory.mktemp("resident-b")
    return build_tiny_model(
        folder, hidden_size=128, num_hidden_layers=4, tie_word_embeddings=False, seed=1
    )


class Clock:
    """The residency manager's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        assert residency.wake(wait=30), "the expiry thread did not come back"


@pytest.fixture(autouse=True)
def only_our_models() -> Iterator[None]:
    """Other tests' idle models out of memory first (the budget counts every model of
    the process); the process-wide settings back to their defaults after."""
    for entry in list(manager.entries):
        owner = entry.owner
        if owner is not None and entry.state == "loaded":
            owner.unload_if_idle()
    yield
    residency.set_memory_budget(None, wait_s=30)
    residency.set_clock(None)
    residency.set_default_keep_alive(-1)
    manager.pinned_paths.clear()


@pytest.fixture
def clock() -> Clock:
    fake = Clock()
    residency.set_clock(fake)
    return fake


def active_mb(engine) -> float:
    return engine.get_stats()["memory"]["active_mb"]


async def greedy(engine, max_tokens: int = 12) -> list[int]:
    out = await engine.chat(MSGS, max_tokens=max_tokens, temperature=0.0)
    return out.tokens


# ----------------------------------------------------------------------- keep-alive


@pytest.mark.parametrize("cls", [SimpleEngine, BatchedEngine])
async def test_keep_alive_0_unloads_after_the_request_and_the_memory_goes_back(model_a, cls):
    engine = cls(model_a, keep_alive=0)
    unloads = threading.Event()
    engine.add_unload_listener(unloads.set)
    try:
        first = await greedy(engine)
        assert unloads.wait(30)  # the expiry thread, on its own: the request ended
        stats = engine.get_stats()
        assert not engine.is_loaded and stats["residency"]["state"] == "unloaded"
        assert stats["residency"]["memory_bytes"] == 0 and stats["residency"]["unloads"] == 1
        assert stats["memory"]["cache_mb"] == 0.0  # MLX's buffer pool went back too
        # The next call loads it again, unseen: the same greedy tokens.
        assert await greedy(engine) == first
        assert engine.get_stats()["residency"]["loads"] == 2
    finally:
        await engine.stop()


async def test_the_memory_figures_drop_by_the_weights(model_a):
    engine = SimpleEngine(model_a, keep_alive="5m")
    try:
        await greedy(engine)
        loaded = engine.get_stats()
        weights = loaded["residency"]["weights_bytes"]
        assert weights >= 0.9 * weights_on_disk(model_a)  # measured, not the file size
        assert engine.unload_if_idle()
        after = engine.get_stats()
        freed = (loaded["memory"]["active_mb"] - after["memory"]["active_mb"]) * MiB
        # Weights and the prefix cache's KV leave MLX's active memory.
        assert freed >= weights + 0.9 * loaded["residency"]["cache_bytes"]
        assert after["residency"]["memory_bytes"] == 0
    finally:
        await engine.stop()


def cuda_allocated(nbytes: int) -> int:
    """What MLX's CUDA allocator sets aside for an array of ``nbytes`` (its
    ``CudaAllocator::malloc_async``): 8 bytes at least, the next power of two under
    16 KiB, whole 16 KiB pages from there."""
    if nbytes <= 8:
        return 8 if nbytes else 0
    if nbytes < 16384:
        return 1 << (nbytes - 1).bit_length()
    return -(-nbytes // 16384) * 16384


def held_arrays(engine: BatchedEngine) -> list:
    """The arrays the engine's budget counts: the weights and the cached prefixes."""
    from mlx.utils import tree_flatten

    weights = [a for _, a in tree_flatten(engine._model.parameters())]
    cached = [x for e in engine._prefix._entries for layer in e.cache for x in layer.state]
    return weights + [x for x in cached if hasattr(x, "nbytes")]


async def test_what_the_budget_counts_is_what_mlx_holds_after_a_batch(model_a):
    """Caches taken out of a batch hold their own bytes, not the batch's buffers."""
    gc.collect()
    # MLX's figure is the process's: arrays that earlier tests of this worker left
    # alive are counted out.
    before = memory_stats()["active_mb"]
    engine = BatchedEngine(model_a)
    try:
        for n in (4, 3):
            prompts = [f"{'Paris ' * (i + 1)}weather?" for i in range(n)]
            await asyncio.gather(
                *[engine.generate(p, max_tokens=30, temperature=0.7) for p in prompts]
            )
            gc.collect()
            counted = engine.get_stats()["residency"]["memory_bytes"]
            assert engine.get_cache_stats()["entry_count"] >= n  # their KV is cached
            # A GPU allocator rounds each small buffer up (this tiny model's KV arrays are
            # a few KB each); the CPU's does not. CUDA's rule is known: MLX's active memory
            # is then the counted arrays rounded as it rounds them (3.42 MB against 3.41
            # on an H100, 3.17 counted). Counting the batch's buffers as well would be
            # twice as much.
            # The budget counts the weights and the cached prefixes, each at its size.
            assert counted == sum(a.nbytes for a in held_arrays(engine))
            backend = backend_info()["backend"]
            if backend == "cuda":
                counted = sum(cuda_allocated(a.nbytes) for a in held_arrays(engine))
            rel = 0.2 if backend not in ("cpu", "cuda") else 0.01
            # A GPU frees a buffer once the work that used it is done, which may come a
            # moment after the replies (the batch had launched its next step): wait.
            for _ in range(100):
                held = (active_mb(engine) - before) * MiB
                if held == pytest.approx(counted, rel=rel):
                    break
                await asyncio.sleep(0.05)
            assert held == pytest.approx(counted, rel=rel)
    finally:
        await engine.stop()


async def test_a_short_keep_alive_unloads_once_it_has_passed(model_a, clock):
    engine = SimpleEngine(model_a, keep_alive="90s")
    try:
        first = await greedy(engine)
        stats = engine.get_stats()["residency"]
        assert stats["keep_alive_s"] == 90 and stats["expires_in_s"] == pytest.approx(90)
        clock.advance(89)
        assert engine.is_loaded  # not a moment before
        assert engine.get_stats()["residency"]["expires_in_s"] == pytest.approx(1)
        clock.advance(2)
        assert not engine.is_loaded
        assert await greedy(engine) == first
        # A request resets the count: from its end, 90 s again.
        clock.advance(60)
        await greedy(engine)
        clock.advance(60)
        assert engine.is_loaded
    finally:
        await engine.stop()


async def test_keep_alive_forever_by_default_and_the_process_default(model_a, clock):
    engine = SimpleEngine(model_a)
    try:
        await greedy(engine)
        assert engine.get_stats()["residency"]["keep_alive_s"] is None  # forever
        clock.advance(10**6)
        assert engine.is_loaded
        residency.set_default_keep_alive("10m")  # engines given none follow it
        assert engine.keep_alive == 600
        clock.advance(601)
        assert not engine.is_loaded
    finally:
        await engine.stop()


@pytest.mark.parametrize("cls", [SimpleEngine, BatchedEngine])
async def test_a_request_in_flight_is_never_unloaded(model_a, cls, clock):
    engine = cls(model_a, keep_alive=0)
    try:
        whole = await greedy(engine, max_tokens=24)
        stream = engine.stream_chat(MSGS, max_tokens=24, temperature=0.0)
        tokens: list[int] = []
        async for out in stream:
            tokens = out.tokens
            if len(tokens) == 3:
                assert not engine.unload_if_idle()  # the request holds it
                clock.advance(3600)
                assert engine.is_loaded
        assert tokens == whole  # nothing lost under it
        clock.advance(0)
        assert not engine.is_loaded  # and gone once it ended
    finally:
        await engine.stop()


async def test_a_request_during_an_unload_waits_for_it_then_loads_again(model_a):
    engine = SimpleEngine(model_a, keep_alive="5m")
    try:
        first = await greedy(engine)
        owner_free = threading.Event()
        engine._executor.submit(owner_free.wait)  # the unload queues behind this
        unloader = threading.Thread(target=engine.unload_if_idle)
        unloader.start()
        while engine.get_stats()["residency"]["state"] != "unloading":
            await asyncio.sleep(0.01)
        request = asyncio.ensure_future(greedy(engine))
        await asyncio.sleep(0.05)
        assert not request.done()  # waiting for the unload
        owner_free.set()
        assert await request == first
        unloader.join()
        assert engine.get_stats()["residency"]["loads"] == 2
    finally:
        await engine.stop()


def test_a_distributed_engine_refuses_a_keep_alive(model_a):
    from mlx_integrations.engine import DistributedEngine

    with pytest.raises(ValueError, match="stays loaded until stop"):
        DistributedEngine(model_a, keep_alive="5m")


def test_a_bad_keep_alive_is_refused_with_the_forms_it_takes(model_a):
    with pytest.raises(ValueError, match=r"keep_alive='5 minutes' is not a duration; use sec"):
        SimpleEngine(model_a, keep_alive="5 minutes")


# ------------------------------------------------------------------ memory budget


async def test_the_budget_unloads_the_least_recently_used_idle_model(model_a, model_b):
    a, b = SimpleEngine(model_a), SimpleEngine(model_b)
    try:
        first = await greedy(a)
        a_bytes = a.get_stats()["residency"]["memory_bytes"]
        residency.set_memory_budget(int(1.5 * a_bytes))  # one model and its cache, not two
        before = active_mb(a)
        await greedy(b)
        assert not a.is_loaded and b.is_loaded
        assert a.get_stats()["residency"]["evictions"] == 1
        # In memory: b instead of a, never both.
        assert (active_mb(b) - before) * MiB < 0.5 * a_bytes
        assert residency.memory_in_use() <= residency.memory_budget()
        assert [m["path"] for m in pool.resident_models()] == [str(b.model_path)]
        # a comes back, and b (now the least recently used) makes room for it.
        assert await greedy(a) == first
        assert not b.is_loaded and b.get_stats()["residency"]["evictions"] == 1
    finally:
        await a.stop()
        await b.stop()


async def test_a_model_larger_than_the_budget_is_refused_before_it_is_read(model_a, tmp_path):
    residency.set_memory_budget("1MiB")
    engine = SimpleEngine(model_a)
    with pytest.raises(ModelTooLarge, match=r"raise the budget, or use a smaller or quantized"):
        await engine.start()
    stats = engine.get_stats()["residency"]
    assert stats["loads"] == 0 and stats["state"] == "unloaded" and engine._executor is None
    # A huge model: its size comes from the weight files' sizes, nothing is read.
    big = tmp_path / "big"
    big.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (big / name).write_bytes((model_a / name).read_bytes())
    header = json.dumps({"w": {"dtype": "F32", "shape": [2**28], "data_offsets": [0, 2**30]}})
    with open(big / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header.encode())
        f.truncate(8 + len(header) + 2**30)  # sparse: 1 GiB that takes no disk
    residency.set_memory_budget("512MiB")
    with pytest.raises(ModelTooLarge, match=r"'.*big' needs about 1024.0 MiB .* of 512.0 MiB"):
        await SimpleEngine(big).start()


async def test_a_pinned_model_stays_and_the_newcomer_is_refused(model_a, model_b):
    a, b = SimpleEngine(model_a, keep_alive=0), SimpleEngine(model_b)
    try:
        pool.pin(str(model_a))
        await greedy(a)
        assert residency.wake(wait=30) and a.is_loaded  # keep_alive=0, but pinned
        residency.set_memory_budget(int(1.5 * a.get_stats()["residency"]["memory_bytes"]))
        with pytest.raises(MemoryBudgetExceeded, match=r"resident-a.*pinned\)"):
            await b.start()
        assert a.is_loaded and not b.is_loaded
        pool.unpin(str(model_a))
        await greedy(b)  # now a may go
        assert not a.is_loaded
    finally:
        await a.stop()
        await b.stop()


async def test_a_load_waits_for_a_busy_model_to_go_idle(model_a, model_b):
    a, b = SimpleEngine(model_a), SimpleEngine(model_b)
    try:
        await greedy(a)
        residency.set_memory_budget(int(1.5 * a.get_stats()["residency"]["memory_bytes"]))
        stream = a.stream_chat(MSGS, max_tokens=30, temperature=0.0)
        await stream.__anext__()  # a is busy
        residency.set_memory_budget(residency.memory_budget(), wait_s=0)
        with pytest.raises(MemoryBudgetExceeded, match=r"resident-a.*in use\)"):
            b.prepare_for_start()
        residency.set_memory_budget(residency.memory_budget(), wait_s=60)
        loading = asyncio.ensure_future(b.start())
        while b.get_stats()["residency"]["state"] != "loading":
            await asyncio.sleep(0.01)
        async for _ in stream:  # a ends its request: b's load goes on
            pass
        await loading
        assert b.is_loaded and not a.is_loaded
    finally:
        await a.stop()
        await b.stop()


# --------------------------------------------------------------------- admission


@pytest.mark.parametrize("cls", [SimpleEngine, BatchedEngine])
async def test_a_request_too_large_is_refused_before_prefill_and_the_engine_serves_on(model_a, cls):
    engine = cls(model_a)
    try:
        first = await greedy(engine)
        held = engine.get_stats()["residency"]["memory_bytes"]
        residency.set_memory_budget(held + 2 * MiB)
        kv = engine.kv_cache_bytes(4000)
        assert kv is not None and kv > 2 * MiB  # 2 KiB a token here
        lookups = engine.get_cache_stats()
        with pytest.raises(RequestTooLarge, match=r"needs about 8\.0 MiB of KV cache") as info:
            await engine.chat(MSGS, max_tokens=3980, temperature=0.0)
        assert isinstance(info.value, MemoryError) and isinstance(info.value, ValueError)
        assert "lower max_tokens" in str(info.value)
        stats = engine.get_stats()
        assert stats["residency"]["memory_rejections"] == 1
        assert stats["num_requests_failed"] == 0  # never dispatched
        after = engine.get_cache_stats()  # nor looked up: no prefill began
        assert (after["hits"], after["misses"]) == (lookups["hits"], lookups["misses"])
        assert await greedy(engine) == first
    finally:
        await engine.stop()


@pytest.mark.parametrize("cls", [SimpleEngine, BatchedEngine])
async def test_a_batch_adds_up_its_requests_a_serial_engine_does_not(model_a, cls):
    engine = cls(model_a)
    try:
        await greedy(engine)
        engine.clear_runtime_caches()
        # Room for one request of 500 tokens beside the model, not for two at once.
        one = engine.kv_cache_bytes(500)
        assert one is not None
        budget = residency.memory_in_use() + int(1.5 * one)
        residency.set_memory_budget(budget, wait_s=0)
        stream = engine.stream_chat(MSGS, max_tokens=480, temperature=0.0)
        await stream.__anext__()
        second = asyncio.ensure_future(engine.chat(MSGS, max_tokens=480, temperature=0.0))
        if cls is SimpleEngine:  # one request runs at a time: it waits in line
            async for _ in stream:
                pass
            assert (await second).completion_tokens > 0
            return
        with pytest.raises(RequestTooLarge, match=r"only 0\.5 MiB"):
            await second  # a batch would hold both caches at once; no wait allowed
        # Allowed to wait, it runs once the first has ended and given its room back.
        residency.set_memory_budget(budget, wait_s=60)
        second = asyncio.ensure_future(engine.chat(MSGS, max_tokens=480, temperature=0.0))
        await asyncio.sleep(0.05)
        assert not second.done()
        async for _ in stream:
            pass
        assert (await second).completion_tokens > 0
        assert engine.get_stats()["residency"]["memory_rejections"] == 1
    finally:
        await engine.stop()


async def test_without_a_budget_the_device_limit_bounds_a_request(tmp_path):
    import mlx.core as mx

    folder = build_tiny_model(tmp_path / "long", max_position_embeddings=10**9)
    engine = SimpleEngine(folder)
    try:
        assert residency.memory_budget() is None
        tokens = mx.get_memory_limit() // 512 + 1  # 512 bytes a token: past the limit
        with pytest.raises(RequestTooLarge, match=r"the device's memory limit"):
            await engine.chat(MSGS, max_tokens=tokens, temperature=0.0)
        out = await engine.chat(MSGS, max_tokens=3, temperature=0.0)
        assert out.completion_tokens == 3
    finally:
        await engine.stop()
