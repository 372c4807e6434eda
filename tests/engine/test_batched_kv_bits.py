"""A quantized KV cache (``kv_bits``) in BatchedEngine: exact against SimpleEngine.

Greedy replies must be token for token those of ``SimpleEngine(kv_bits=same)``, for a
request alone, requests sharing a batch (prompts of different lengths, so rows are
left-padded), a request joining a running batch and a batch shrinking to one. The
quantized replies differ from unquantized ones on these prompts (checked below), so an
engine that ignored ``kv_bits`` would fail these tests.

The model has attention heads of 64 values (hidden 128, two heads) that every
``kv_group_size`` divides, and its own output head, so greedy replies vary.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mlx_integrations.engine import BatchedEngine, SimpleEngine
from mlx_integrations.engine.batched.kv_cache import (
    BatchQuantizedKVCache,
    MergeableQuantizedKVCache,
)
from mlx_integrations.runtime import quantized_attention_error
from tests.support.kv_bytes import check_quantized_shares
from tests.support.prompts import CHAT_PROMPTS
from tests.support.tiny_models import build_tiny_model

pytestmark = pytest.mark.skipif(
    quantized_attention_error("float32", 64, 8, 64) is not None,
    reason="this MLX backend has no kernel for attention over a quantized KV cache",
)

PROMPTS = [*CHAT_PROMPTS, [{"role": "user", "content": "Hi"}]]
HISTORY = [
    *PROMPTS[0],
    {"role": "assistant", "content": "It is sunny and 21 degrees."},
    {"role": "user", "content": "And in Rome?"},
]
BITS = [4, 8]


@pytest.fixture(scope="module")
def model64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(
        tmp_path_factory.mktemp("heads64"),
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )


@pytest.fixture(scope="module")
def references(model64: Path):
    """SimpleEngine per bit width (and unquantized), no prefix cache: the baselines."""
    engines = {
        bits: SimpleEngine(model64, kv_bits=bits, cache_memory_mb=0) for bits in [*BITS, None]
    }
    yield engines
    for eng in engines.values():
        asyncio.run(eng.stop())


def call(messages, n: int = 24, **more):
    return dict(messages=messages, max_tokens=n, temperature=0, **more)


async def expected(references, bits, calls) -> list[list[int]]:
    return [(await references[bits].chat(**c)).tokens for c in calls]


@pytest.fixture
def batch_rows(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(rows, most left padding) of every forward pass through a quantized batch cache."""
    seen: list[tuple[int, int]] = []
    update = BatchQuantizedKVCache.update_and_fetch

    def spy(self, keys, values):
        seen.append((keys.shape[0], max(self.left_padding.tolist(), default=0)))
        return update(self, keys, values)

    monkeypatch.setattr(BatchQuantizedKVCache, "update_and_fetch", spy)
    return seen


async def test_quantized_replies_differ_from_unquantized_ones(references):
    # What makes the checks below able to fail: kv_bits changes these greedy replies.
    calls = [call(m) for m in PROMPTS]
    plain = await expected(references, None, calls)
    for bits in BITS:
        quantized = await expected(references, bits, calls)
        assert sum(a != b for a, b in zip(plain, quantized, strict=True)) >= 2, bits


@pytest.mark.parametrize("bits", BITS)
async def test_a_lone_request_equals_simple_engine(model64, references, bits, batch_rows):
    from mlx_lm.models.cache import QuantizedKVCache

    eng = BatchedEngine(model64, kv_bits=bits)
    try:
        calls = [call(m) for m in PROMPTS]
        outs = [(await eng.chat(**c)).tokens for c in calls]
        assert outs == await expected(references, bits, calls)
        stats = eng.get_stats()
        assert stats["solo_requests"] == len(calls) and stats["steps_executed"] == 0
        assert not batch_rows
        # The prefix cache holds quantized KV at the engine's bit width.
        layers = [c for e in eng._prefix._entries for c in e.cache]
        assert layers and all(isinstance(c, QuantizedKVCache) and c.bits == bits for c in layers)
    finally:
        await eng.stop()


@pytest.mark.parametrize("bits", BITS)
async def test_requests_sharing_a_batch_equal_simple_engine(model64, references, bits, batch_rows):
    eng = BatchedEngine(model64, kv_bits=bits, cache_memory_mb=0)
    try:
        eos = next(iter(eng.tokenizer.eos_token_ids))
        calls = [call(m, logit_bias={eos: -1e9}) for m in PROMPTS]
        outs = await asyncio.gather(*[eng.chat(**c) for c in calls])
        assert [o.tokens for o in outs] == await expected(references, bits, calls)
        stats = eng.get_stats()
        assert stats["peak_batch_size"] == len(calls) and stats["solo_requests"] == 0
        # Prefilled and decoded as one batch of left-padded rows (prompt lengths differ).
        assert len({o.prompt_tokens for o in outs}) == len(calls)
        assert any(rows == len(calls) and pad > 0 for rows, pad in batch_rows)
    finally:
        await eng.stop()


@pytest.mark.parametrize("bits", BITS)
async def test_a_request_joins_a_running_batch_and_it_shrinks_to_one(
    model64, references, bits, batch_rows
):
    eng = BatchedEngine(model64, kv_bits=bits, cache_memory_mb=0)
    try:
        eos = next(iter(eng.tokenizer.eos_token_ids))
        # No logits processor (logit_bias is one), so it may decode alone.
        long_call = call(PROMPTS[1], 300)
        short_calls = [call(m, 8, logit_bias={eos: -1e9}) for m in (PROMPTS[0], PROMPTS[3])]
        chunks = []

        async def run_long():
            async for chunk in eng.stream_chat(**long_call):
                chunks.append(chunk)

        task = asyncio.create_task(run_long())
        while len(chunks) < 5 and not task.done():  # decoding alone
            await asyncio.sleep(0.002)
        if task.done():
            await task  # a failure shows here instead of a hang
        assert len(chunks) >= 5
        assert not batch_rows
        shorts = await asyncio.gather(*[eng.chat(**c) for c in short_calls])
        await task
        assert chunks[-1].completion_tokens == 300
        assert chunks[-1].tokens == (await expected(references, bits, [long_call]))[0]
        assert [s.tokens for s in shorts] == await expected(references, bits, short_calls)
        stats = eng.get_stats()
        # Alone, in the batch with its quantized cache, then alone again.
        assert stats["peak_batch_size"] == 3
        assert stats["solo_requests"] == 2
        assert any(rows == 3 for rows, _ in batch_rows)
    finally:
        await eng.stop()


@pytest.mark.parametrize("bits", BITS)
async def test_a_batch_shrinking_to_one_goes_on_alone(model64, references, bits):
    eng = BatchedEngine(model64, kv_bits=bits, cache_memory_mb=0)
    try:
        eos = next(iter(eng.tokenizer.eos_token_ids))
        calls = [call(PROMPTS[2], 40), call(PROMPTS[0], 4, logit_bias={eos: -1e9})]
        outs = await asyncio.gather(*[eng.chat(**c) for c in calls])
        assert [o.tokens for o in outs] == await expected(references, bits, calls)
        assert outs[0].completion_tokens == 40
        assert eng.get_stats()["peak_batch_size"] == 2
        assert eng.get_stats()["solo_requests"] == 1  # the long one, its cache extracted
    finally:
        await eng.stop()


@pytest.mark.parametrize("bits", BITS)
async def test_the_next_turn_reuses_the_quantized_prefix_cache(model64, references, bits):
    eng = BatchedEngine(model64, kv_bits=bits)
    try:
        first = await eng.chat(**call(PROMPTS[0], 16))
        # The next turn, alone, then beside another request in a batch.
        second = await eng.chat(**call(HISTORY, 16))
        assert second.cached_tokens >= first.prompt_tokens - 1
        baseline = (await expected(references, bits, [call(HISTORY, 16)]))[0]
        assert second.tokens == baseline
        again, other = await asyncio.gather(
            eng.chat(**call(HISTORY, 16)), eng.chat(**call(PROMPTS[1], 16))
        )
        assert again.cached_tokens == again.prompt_tokens - 1
        assert eng.get_stats()["peak_batch_size"] == 2
        assert again.tokens == baseline
        assert other.tokens == (await expected(references, bits, [call(PROMPTS[1], 16)]))[0]
    finally:
        await eng.stop()


async def test_the_cache_budget_counts_quantized_bytes(model64):
    engines = {bits: BatchedEngine(model64, kv_bits=bits) for bits in (None, 8, 4)}
    try:
        held = {}
        for bits, eng in engines.items():
            # Without EOS every reply has 8 tokens, so the entries hold the same tokens.
            eos = next(iter(eng.tokenizer.eos_token_ids))
            calls = [call(m, 8, logit_bias={eos: -1e9}) for m in PROMPTS[:2]]
            await asyncio.gather(*[eng.chat(**c) for c in calls])
            stats = eng.get_cache_stats()
            assert stats["entry_count"] == 2
            held[bits] = stats["current_memory_mb"]
        check_quantized_shares(held)
    finally:
        for eng in engines.values():
            await eng.stop()
    # A budget between an entry's quantized and unquantized size keeps only quantized ones.
    budget = held[4] * 1.5
    assert budget < held[None] / 2  # smaller than either unquantized entry
    tight = {
        bits: BatchedEngine(model64, kv_bits=bits, cache_memory_mb=budget) for bits in (None, 4)
    }
    try:
        for eng in tight.values():
            await asyncio.gather(*[eng.chat(**c) for c in calls])
        assert tight[None].get_cache_stats()["entry_count"] == 0
        assert tight[4].get_cache_stats()["entry_count"] == 2
    finally:
        for eng in tight.values():
            await eng.stop()


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"kv_bits": 5}, ValueError, r"kv_bits must be one of 2, 3, 4, 6, 8 .*got 5"),
        ({"kv_bits": "8"}, TypeError, r"kv_bits must be an integer"),
        ({"kv_bits": 4, "kv_group_size": 48}, ValueError, r"kv_group_size must be one of"),
        (
            {"kv_bits": 4, "quantized_kv_start": 16},
            ValueError,
            r"BatchedEngine quantizes .* from its first token.*kv_bits=4.*"
            r"quantized_kv_start must be 0, got 16.*SimpleEngine",
        ),
    ],
)
def test_bad_kv_options_are_refused(model64, options, error, message):
    with pytest.raises(error, match=message):
        BatchedEngine(model64, **options)


async def test_a_group_size_that_does_not_divide_the_heads_fails_at_load(model64):
    eng = BatchedEngine(model64, kv_bits=8, kv_group_size=128)
    with pytest.raises(ValueError, match=r"heads of 64 values.*kv_group_size=64"):
        await eng.start()
    assert not eng.is_loaded
    await eng.stop()


async def test_serving_goes_on_after_failed_and_cancelled_requests(model64, references):
    eng = BatchedEngine(model64, kv_bits=4)
    try:
        # A request failing inside a shared batch (its logits processor raises).
        def boom(tokens, logits):
            raise RuntimeError("processor exploded")

        results = await asyncio.gather(
            eng.chat(**call(PROMPTS[0], 8)),
            eng.chat(**call(PROMPTS[1], 8, logits_processors=[boom])),
            return_exceptions=True,
        )
        assert isinstance(results[1], RuntimeError)
        assert results[0].tokens == (await expected(references, 4, [call(PROMPTS[0], 8)]))[0]
        # A cancelled request running alone (no logits processor), on a quantized cache.
        got_one = asyncio.Event()

        async def consume():
            async for _ in eng.stream_chat(**call(PROMPTS[2], 5000)):
                got_one.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(got_one.wait(), 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        nxt = await asyncio.wait_for(eng.chat(**call(PROMPTS[3], 8)), 60)
        assert nxt.tokens == (await expected(references, 4, [call(PROMPTS[3], 8)]))[0]
        stats = eng.get_stats()
        assert stats["num_requests_failed"] == 1 and stats["num_requests_aborted"] == 1
        assert stats["solo_requests"] >= 2  # the cancelled one and the next
    finally:
        await eng.stop()


# ------------------------------------------------------------ the batch cache itself


def _rows(lengths: list[int], bits: int = 4, group_size: int = 64):
    """Quantized caches of random KV, one per length (one head, 128 values)."""
    import mlx.core as mx

    mx.random.seed(3)
    rows = []
    for n in lengths:
        c = MergeableQuantizedKVCache(group_size=group_size, bits=bits)
        if n:
            c.update_and_fetch(mx.random.normal((1, 1, n, 128)), mx.random.normal((1, 1, n, 128)))
        rows.append(c)
    return rows


def _same(a, b) -> bool:
    import mlx.core as mx

    ka, va = a.keys_and_values() if hasattr(a, "keys_and_values") else (a.keys, a.values)
    kb, vb = b.keys_and_values() if hasattr(b, "keys_and_values") else (b.keys, b.values)
    return a.offset == b.offset and all(
        x.shape == y.shape and mx.array_equal(x, y).item()
        for x, y in zip((*ka, *va), (*kb, *vb), strict=True)
    )


def test_merge_extract_filter_extend_and_trim_keep_each_row():
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache, KVCache

    rows = _rows([5, 2, 7])
    batch = rows[0].merge(rows)
    assert isinstance(batch, BatchQuantizedKVCache) and (batch.bits, batch.group_size) == (4, 64)
    assert batch.left_padding.tolist() == [2, 5, 0] and batch.offset.tolist() == [5, 2, 7]
    assert batch.size() == 7 and not batch.empty()
    assert all(_same(batch.extract(i), r) for i, r in enumerate(rows))
    # The mask is BatchKVCache's for the same padding.
    plain = BatchKVCache([2, 5, 0])
    plain._idx = 7
    assert mx.array_equal(batch.make_mask(1), plain.make_mask(1)).item()
    # A new token for every row goes after each row's own tokens.
    step = mx.random.normal((3, 1, 1, 128))
    keys, _ = batch.update_and_fetch(step, step)
    assert len(keys) == 3 and keys[0].dtype == mx.uint32 and keys[0].shape[2] == 8
    for i, r in enumerate(rows):
        r.update_and_fetch(step[i : i + 1], step[i : i + 1])
    assert all(_same(batch.extract(i), r) for i, r in enumerate(rows))
    # Filter drops rows and the padding no row needs any more.
    batch.filter([0, 2])
    assert batch.left_padding.tolist() == [2, 0] and batch.size() == 8
    assert _same(batch.extract(0), rows[0]) and _same(batch.extract(1), rows[2])
    # Extend with a batch of a longer row and a fresh one (an unquantized KVCache row).
    other = BatchQuantizedKVCache.merge([*_rows([10]), KVCache()])
    batch.extend(other)
    assert batch.offset.tolist() == [6, 8, 10, 0] and batch.size() == 10
    assert _same(batch.extract(1), rows[2])
    assert batch.trim(3) == 3 and batch.offset.tolist() == [3, 5, 7, -3]
    rows[2].trim(3)
    assert _same(batch.extract(1), rows[2])
    # Bytes: the three parts (packed values, scales, biases) of keys and values.
    assert batch.nbytes == sum(x.nbytes for x in (*batch.keys, *batch.values))


def test_prefill_with_right_padding_rolls_rows_to_the_left_and_copies_keep_the_format():
    import mlx.core as mx
    from mlx_lm.models.cache import QuantizedKVCache

    from mlx_integrations.engine.cache.prefix_cache import copy_cache

    mx.random.seed(4)
    kv = mx.random.normal((2, 1, 6, 128))
    batch = BatchQuantizedKVCache.merge(_rows([0, 0], bits=8))
    batch.prepare(lengths=[6, 3], right_padding=[0, 3])
    batch.update_and_fetch(kv, kv)
    batch.finalize()
    assert batch.left_padding.tolist() == [0, 3] and batch.offset.tolist() == [6, 3]
    for i, n in enumerate((6, 3)):
        ref = QuantizedKVCache(group_size=64, bits=8)
        ref.update_and_fetch(kv[i : i + 1, :, :n], kv[i : i + 1, :, :n])
        assert _same(batch.extract(i), ref)
    row = batch.extract(1)
    (copy,) = copy_cache([row])
    assert type(copy) is MergeableQuantizedKVCache and _same(copy, row)
    with pytest.raises(ValueError, match=r"bits=4.*bits=8"):
        batch.extend(BatchQuantizedKVCache.merge(_rows([2], bits=4)))


def test_the_pool_and_adapters_make_batched_engines_with_kv_bits(model64):
    from mlx_integrations.engine import pool
    from mlx_integrations.langchain import ChatMLX

    options = {"kv_bits": 4}
    llm = ChatMLX(model=str(model64), engine_type="batched", engine_options=options, temperature=0)
    try:
        outs = asyncio.run(llm.abatch(["one", "two", "three"], max_tokens=8))
        assert all(o.usage_metadata["output_tokens"] >= 1 for o in outs)
        stats = llm.get_stats()
        assert stats["engine_type"] == "batched" and stats["peak_batch_size"] >= 2
        engine = pool.acquire(model64, engine_type="batched", **options)
        try:  # the adapter's engine: pooled under its kv_bits
            assert engine.get_stats()["peak_batch_size"] == stats["peak_batch_size"]
            assert engine._options.kv_bits == 4
        finally:
            pool.release(engine)
    finally:
        pool.unload_idle()
