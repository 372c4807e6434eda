"""Prompt lookup in BatchedEngine's shared batch over a quantized KV cache (``kv_bits``).

A wide step feeds every row its pending token and drafts; each row then drops the
positions it rejected from ``BatchQuantizedKVCache``, whose packed values, scales and
biases are cut and rolled together. Greedy replies must equal those of the same engine
with prompt lookup off, token for token. That holds bit for bit on MLX's reference BLAS
(checked in a subprocess, at 4 and 8 bits): a key quantizes to the same levels whether
its position was fed alone or beside drafts. Under the OpenBLAS that this process runs
on, the key and value projections of a wide step round differently in the last bits
(about 6e-7, see tests/engine/test_batched_speculation.py), and a value that sits on a
quantization boundary can then take the next level: at 4 bits that moves attention by a
whole level's step and can change a near-tied greedy token, so here the check is at
8 bits, where these prompts keep their tokens.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mlx_integrations.engine import BatchedEngine
from mlx_integrations.engine.batched.kv_cache import BatchQuantizedKVCache
from mlx_integrations.runtime import quantized_attention_error
from tests.support.batch_drafting import record_wide_steps
from tests.support.reference_blas import in_reference_blas
from tests.support.tiny_models import build_tiny_model

pytestmark = pytest.mark.skipif(
    quantized_attention_error("float32", 64, 8, 64) is not None,
    reason="this MLX backend has no kernel for attention over a quantized KV cache",
)

# Replies that copy their prompt: drafts are found and accepted.
PROMPTS = [
    [{"role": "user", "content": "What is the weather in Paris? It is sunny in Paris."}],
    [{"role": "user", "content": "The capital of France is Paris. The capital of Italy is"}],
    [{"role": "user", "content": "Repeat after me: the quick brown fox jumps over the dog."}],
    [{"role": "user", "content": "one two three four one two three four one two"}],
]


@pytest.fixture(scope="module")
def model64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Attention heads of 64 values (every kv_group_size divides them), own output head."""
    return build_tiny_model(
        tmp_path_factory.mktemp("heads64-lookup"),
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )


async def replies(target: str | Path, bits: int, lookup: int, max_tokens: int):
    """The replies of PROMPTS twice over, sent at once, and the engine's stats."""
    eng = BatchedEngine(target, kv_bits=bits, prompt_lookup=lookup, cache_memory_mb=0)
    try:
        calls = [eng.chat(m, max_tokens=max_tokens, temperature=0) for m in PROMPTS * 2]
        outs = await asyncio.gather(*calls)
        return outs, eng.get_stats()
    finally:
        await eng.stop()


def check_exact(target: str, bits: int) -> None:
    """Lookup on and off give the same greedy tokens; wide steps ran on quantized rows."""
    from mlx_integrations.engine.batched import speculation as batch_spec
    from mlx_integrations.engine.speculative.pace import StepPace

    StepPace.wide = lambda self: True  # type: ignore[method-assign]
    roll_back, kinds = batch_spec.roll_back_rows, set()

    def seen(cache, drop):
        kinds.update(type(layer) for layer in cache)
        roll_back(cache, drop)

    batch_spec.roll_back_rows = seen  # type: ignore[assignment]
    (refs, _), (outs, stats) = [asyncio.run(replies(target, bits, n, 64)) for n in (0, 4)]
    assert [o.tokens for o in outs] == [r.tokens for r in refs]
    assert sum(o.mtp_accepted for o in outs) > 0
    assert kinds == {BatchQuantizedKVCache}
    assert stats["speculation_off_requests"] == 0


@pytest.mark.parametrize("bits", [4, 8])
def test_on_the_reference_blas_a_quantized_batch_is_exact(model64: Path, bits: int) -> None:
    in_reference_blas(__name__, f"check_exact({str(model64)!r}, {bits})")


async def test_rows_draft_in_a_quantized_batch(model64: Path, monkeypatch) -> None:
    wide = record_wide_steps(monkeypatch)
    refs, plain = await replies(model64, 8, 0, 48)
    outs, stats = await replies(model64, 8, 4, 48)
    assert [o.tokens for o in outs] == [r.tokens for r in refs]
    assert sum(wide.accepted) > 0 and stats["speculative"]["accepted_tokens"] > 0
    assert stats["speculation_off_requests"] == 0
    assert stats["steps_executed"] < plain["steps_executed"]  # drafts kept in batch steps
