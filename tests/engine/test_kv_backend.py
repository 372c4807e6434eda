"""``kv_bits`` where MLX cannot attend over a quantized KV cache (its CUDA backend)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_integrations import runtime
from mlx_integrations.engine import BatchedEngine, SimpleEngine
from tests.support.tiny_models import build_tiny_model

MISSING = runtime.quantized_attention_error("float32", 64, 8, 64)
"""MLX's error on this backend for the model below at ``kv_bits=8``; None where it works."""


@pytest.fixture(scope="module")
def heads64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Attention heads of 64 values, which the default kv_group_size divides.
    folder = tmp_path_factory.mktemp("heads64")
    return build_tiny_model(folder, hidden_size=128, num_attention_heads=2)


@pytest.mark.parametrize("kind", [SimpleEngine, BatchedEngine])
async def test_a_backend_without_the_kernel_refuses_kv_bits_at_load(heads64, monkeypatch, kind):
    asked = []

    def missing(*args: object) -> str:
        asked.append(args)
        return "[quantized_matmul] No implementation for problem shape: 18x18x64x2"

    monkeypatch.setattr(
        "mlx_integrations.engine.cache.kv_quantization.quantized_attention_error", missing
    )
    engine = kind(heads64, kv_bits=8)
    pattern = (
        r"kv_bits=8 on this machine.*float32, heads of 64 values.*No implementation.*kv_bits=None"
    )
    with pytest.raises(ValueError, match=pattern):
        engine.prepare_for_start()
    assert asked == [("float32", 64, 8, 64)]
    monkeypatch.undo()
    plain = kind(heads64)
    try:
        assert (await plain.generate("Hello", max_tokens=3)).completion_tokens == 3
    finally:
        await plain.stop()


@pytest.mark.skipif(MISSING is None, reason="this backend attends over a quantized KV cache")
@pytest.mark.parametrize("kind", [SimpleEngine, BatchedEngine])
def test_mlx_cuda_refuses_kv_bits_naming_the_fix(heads64, kind):
    with pytest.raises(ValueError, match=r"MLX's CUDA backend.*use kv_bits=None"):
        kind(heads64, kv_bits=8).prepare_for_start()
