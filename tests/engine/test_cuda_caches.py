"""MLX's CUDA caches missing more often than their size, in a long-lived engine (CUDA only).

MLX keeps cuDNN attention plans in a cache per thread, keyed by the exact shapes of an
attention; with its thrashing check on, a cache that has missed more than twice its size
raises on every later miss. ``import mlx_integrations`` turns the check off unless
``MLX_ENABLE_CACHE_THRASHING_CHECK`` is set (``let_caches_miss``): an engine that meets
more attention shapes than that (every new prompt length, batch size or key length is
one) pays the set-up again and keeps serving. Run with the variable set to 1, these tests
fail (the engine's requests then raise "Cache thrashing is happening").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_integrations.engine import BatchedEngine, SimpleEngine
from mlx_integrations.engine.decoding import cuda_default_device
from tests.support.tiny_models import build_tiny_model

pytestmark = pytest.mark.skipif(
    not cuda_default_device(), reason="MLX's CUDA caches (the GPU runs on CUDA)"
)

LENGTHS = 12
"""Prompt lengths met, one attention shape each: three times the check's limit of 4."""


@pytest.fixture(scope="module")
def tiny_bf16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model in bfloat16, whose prefill attention runs on cuDNN."""
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny-bf16"), dtype="bfloat16", tie_word_embeddings=False
    )


@pytest.mark.parametrize("kind", [SimpleEngine, BatchedEngine])
async def test_an_engine_meeting_more_attention_shapes_than_mlx_caches_keeps_serving(
    tiny_bf16: Path, monkeypatch: pytest.MonkeyPatch, kind: type
) -> None:
    # Two plans a thread: the engine's owner thread is new, so its cache is made with
    # this size when it first attends.
    monkeypatch.setenv("MLX_CUDA_SDPA_CACHE_SIZE", "2")
    engine = kind(tiny_bf16, cache_memory_mb=0, prefill_buckets=False, warmup_shapes=False)
    try:
        await engine.start()
        for n in range(LENGTHS):
            prompt = " ".join(["word"] * (3 + 5 * n))
            out = await engine.generate(prompt, max_tokens=3, temperature=0.0)
            assert out.prompt_tokens > 0 and 1 <= out.completion_tokens <= 3, n
    finally:
        await engine.stop()
