"""A quantized KV cache (``kv_bits``) in SimpleEngine: replies, prefix reuse, bytes, options.

BatchedEngine's are in ``test_batched_kv_bits.py``.

The models have attention heads of 64 values (hidden 128, two heads), which every
supported ``kv_group_size`` divides, and their own output head
(``tie_word_embeddings=False``) so that greedy replies vary.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mlx_integrations.engine import SimpleEngine
from mlx_integrations.engine.options import EngineOptions
from mlx_integrations.runtime import quantized_attention_error
from tests.support.kv_bytes import check_quantized_shares
from tests.support.pool_keys import assert_pool_keys_by
from tests.support.prompts import CHAT_PROMPTS
from tests.support.tiny_models import build_tiny_model

pytestmark = [
    pytest.mark.skipif(
        quantized_attention_error("float32", 64, 8, 64) is not None,
        reason="this MLX backend has no kernel for attention over a quantized KV cache",
    ),
    # Which steps draft must not depend on the machine's speed (see conftest).
    pytest.mark.usefixtures("lookup_rounds"),
]

PROMPTS = CHAT_PROMPTS
HISTORY = [
    *PROMPTS[0],
    {"role": "assistant", "content": "It is sunny and 21 degrees."},
    {"role": "user", "content": "And in Rome?"},
]


@pytest.fixture(scope="module")
def model64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(
        tmp_path_factory.mktemp("heads64"),
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )


def agreed(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two replies."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


async def test_greedy_replies_at_8_bits_stay_close_to_unquantized(model64):
    plain = SimpleEngine(model64, cache_memory_mb=0)
    quantized = SimpleEngine(model64, kv_bits=8, cache_memory_mb=0)
    try:
        agreement = []
        for messages in PROMPTS:
            ref = await plain.chat(messages, max_tokens=32, temperature=0)
            out = await quantized.chat(messages, max_tokens=32, temperature=0)
            agreement.append(agreed(ref.tokens, out.tokens))
        # Random tiny models have near ties, which 8-bit rounding can flip: over seeds
        # 0-4 at least two of three replies agree on their first 8 tokens (most on 32).
        assert sum(n >= 8 for n in agreement) >= 2, agreement
    finally:
        await plain.stop()
        await quantized.stop()


async def test_next_turn_reuses_the_quantized_prefix_cache(model64):
    reusing = SimpleEngine(model64, kv_bits=8)
    fresh = SimpleEngine(model64, kv_bits=8, cache_memory_mb=0)
    try:
        first = await reusing.chat(PROMPTS[0], max_tokens=16, temperature=0)
        second = await reusing.chat(HISTORY, max_tokens=16, temperature=0)
        baseline = await fresh.chat(HISTORY, max_tokens=16, temperature=0)
        assert first.cached_tokens == 0 and baseline.cached_tokens == 0
        assert second.cached_tokens >= first.prompt_tokens - 1
        assert second.tokens == baseline.tokens
        # A prompt sharing only the first turn takes a trimmed copy of the entry.
        branch = [*PROMPTS[0], {"role": "assistant", "content": "Rain."}]
        branch.append({"role": "user", "content": "Why?"})
        copied = await reusing.chat(branch, max_tokens=16, temperature=0)
        assert 0 < copied.cached_tokens < second.prompt_tokens
        assert copied.tokens == (await fresh.chat(branch, max_tokens=16, temperature=0)).tokens
        # The entry of the second turn survived the copy and is taken whole again.
        again = await reusing.chat(HISTORY, max_tokens=16, temperature=0)
        assert again.cached_tokens == again.prompt_tokens - 1
        assert again.tokens == second.tokens
    finally:
        await reusing.stop()
        await fresh.stop()


async def test_prefix_cache_counts_the_real_bytes_of_quantized_entries(model64):
    engines = {bits: SimpleEngine(model64, kv_bits=bits) for bits in (None, 8, 4)}
    try:
        held = {}
        for bits, eng in engines.items():
            await eng.chat(PROMPTS[1], max_tokens=8, temperature=0)
            stats = eng.get_cache_stats()
            assert stats["entry_count"] == 1
            held[bits] = stats["current_memory_mb"]
        check_quantized_shares(held)
    finally:
        for eng in engines.values():
            await eng.stop()


async def test_prompt_lookup_decodes_with_a_quantized_cache(model64):
    plain = SimpleEngine(model64, kv_bits=8, cache_memory_mb=0)
    lookup = SimpleEngine(model64, kv_bits=8, prompt_lookup=4)
    try:
        drafted = 0
        for messages in PROMPTS:
            ref = await plain.chat(messages, max_tokens=32, temperature=0)
            out = await lookup.chat(messages, max_tokens=32, temperature=0)
            drafted += out.mtp_drafts
            # Verifying several tokens per pass rounds differently from one at a time.
            assert agreed(ref.tokens, out.tokens) >= 4
        assert drafted > 0
        second = await lookup.chat(PROMPTS[1], max_tokens=8, temperature=0)
        assert second.cached_tokens > 0
    finally:
        await plain.stop()
        await lookup.stop()


async def test_a_draft_model_decodes_over_a_quantized_cache(model64):
    from mlx_lm.models.cache import QuantizedKVCache

    plain = SimpleEngine(model64, kv_bits=8, cache_memory_mb=0)
    drafting = SimpleEngine(model64, kv_bits=8, draft_model=str(model64))
    try:
        for messages in PROMPTS:
            ref = await plain.chat(messages, max_tokens=24, temperature=0)
            out = await drafting.chat(messages, max_tokens=24, temperature=0)
            # The draft is the model itself over an unquantized cache: it mostly agrees.
            assert out.mtp_drafts > 0 and out.mtp_accepted > out.mtp_drafts / 2
            assert agreed(ref.tokens, out.tokens) >= 4
        # The prefix cache holds the target's quantized KV, at its real size, and the
        # next turn reuses it (with the draft model's own cache beside it).
        stats = drafting.get_cache_stats()
        assert stats["entry_count"] == len(PROMPTS)
        entries = drafting._prefix._entries
        assert all(isinstance(c, QuantizedKVCache) for e in entries for c in e.cache)
        first = await drafting.chat(PROMPTS[0], max_tokens=16, temperature=0)
        second = await drafting.chat(HISTORY, max_tokens=16, temperature=0)
        assert second.cached_tokens >= first.prompt_tokens - 1
        assert second.mtp_drafts > 0 and second.mtp_accepted > second.mtp_drafts / 2
        baseline = await plain.chat(HISTORY, max_tokens=16, temperature=0)
        assert agreed(baseline.tokens, second.tokens) >= 4
    finally:
        await plain.stop()
        await drafting.stop()


async def test_quantized_engine_serves_after_a_cancelled_request(model64):
    eng = SimpleEngine(model64, kv_bits=4)
    try:
        got_one = asyncio.Event()

        async def consume():
            async for _ in eng.stream_chat(
                PROMPTS[0], max_tokens=5000, temperature=0, logit_bias={7: 100.0}
            ):
                got_one.set()

        task = asyncio.create_task(consume())
        # A request that fails before its first token ends the test instead of hanging it.
        await asyncio.wait(
            [task, asyncio.ensure_future(got_one.wait())], return_when=asyncio.FIRST_COMPLETED
        )
        if task.done():
            task.result()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        out = await asyncio.wait_for(eng.chat(PROMPTS[0], max_tokens=4, temperature=0), 60)
        assert out.finished and len(out.tokens) == 4
        assert eng.get_stats()["num_requests_aborted"] == 1
    finally:
        await eng.stop()


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"kv_bits": 5}, ValueError, r"kv_bits must be one of 2, 3, 4, 6, 8 .*got 5"),
        ({"kv_bits": 16}, ValueError, r"one of 2, 3, 4, 6, 8 .*got 16"),
        ({"kv_bits": "8"}, TypeError, r"kv_bits must be an integer \(2, 3, 4, 6, 8\).*'8'"),
        ({"kv_bits": True}, TypeError, r"kv_bits must be an integer.*True"),
        ({"kv_group_size": 48}, ValueError, r"kv_group_size must be one of 32, 64, 128.*48"),
        ({"kv_group_size": 64.0}, TypeError, r"kv_group_size must be an integer.*64\.0"),
        ({"quantized_kv_start": -1}, ValueError, r"quantized_kv_start must be >= 0.*-1"),
        ({"quantized_kv_start": None}, TypeError, r"quantized_kv_start must be an integer"),
        (
            {"kv_bits": 8, "draft_model": "some/draft", "quantized_kv_start": 16},
            ValueError,
            r"kv_bits=8 with draft_model='some/draft'.*quantized_kv_start must be 0, got 16",
        ),
    ],
)
def test_bad_kv_options_are_refused_at_construction(model64, options, error, message):
    with pytest.raises(error, match=message):
        EngineOptions(**options)
    with pytest.raises(error, match=message):
        SimpleEngine(model64, **options)


async def test_a_group_size_that_does_not_divide_the_heads_fails_at_load(model64, tmp_path):
    eng = SimpleEngine(model64, kv_bits=8, kv_group_size=128)
    with pytest.raises(
        ValueError, match=r"heads of 64 values.*kv_group_size=128.*kv_group_size=64"
    ):
        await eng.start()
    assert not eng.is_loaded
    await eng.stop()
    narrow = build_tiny_model(tmp_path / "heads16")  # hidden 64, four heads of 16
    eng = SimpleEngine(narrow, kv_bits=4)
    with pytest.raises(ValueError, match=r"heads of 16 values.*use kv_bits=None"):
        await eng.start()
    await eng.stop()


def test_the_pool_keys_engines_by_their_kv_options(model64):
    assert_pool_keys_by(model64, "kv_bits", 8, 4)
