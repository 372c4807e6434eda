"""The KV cache estimate that admission uses, against the bytes MLX really holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlx_integrations.engine.cache.kv_estimate import KV_STEP, KVShape, kv_shape
from mlx_integrations.runtime import quantized_attention_error
from tests.support.tiny_models import build_tiny_model


@pytest.fixture(scope="module")
def heads_of_32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model with a head size of 32, which a quantized KV cache's groups divide."""
    return build_tiny_model(tmp_path_factory.mktemp("heads-32"), hidden_size=128)


def prefilled_cache_bytes(folder: Path, tokens: int, kv_bits: int | None) -> tuple[int, int]:
    """(bytes of the cache arrays after a prefill of ``tokens`` tokens, bytes per value)."""
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.models.cache import make_prompt_cache

    from mlx_integrations.engine.cache.kv_estimate import activation_itemsize
    from mlx_integrations.engine.cache.prefix_cache import cache_nbytes

    model = mlx_lm.load(str(folder))[0]
    cache = make_prompt_cache(model)
    if kv_bits is not None:
        cache = [layer.to_quantized(group_size=32, bits=kv_bits) for layer in cache]
    prompt = mx.array([[i % 200 + 5 for i in range(tokens)]])
    for start in range(0, tokens, 512):  # in prefill pieces, as the engines do
        model(prompt[:, start : start + 512], cache=cache)
        mx.eval([c.state for c in cache])
    return cache_nbytes(cache), activation_itemsize(model)


@pytest.mark.parametrize("tokens", [1, 255, 300, 700, 1500])
@pytest.mark.parametrize("kv_bits", [None, 8, 4])
def test_the_estimate_matches_the_cache_after_a_prefill(heads_of_32, tokens, kv_bits):
    if kv_bits is not None and quantized_attention_error("float32", 32, kv_bits, 32):
        pytest.skip("this MLX backend has no kernel for attention over a quantized KV cache")
    config = json.loads((heads_of_32 / "config.json").read_text())
    measured, itemsize = prefilled_cache_bytes(heads_of_32, tokens, kv_bits)
    shape = kv_shape(config, itemsize, kv_bits, group_size=32)
    assert shape is not None
    estimate = shape.cache_bytes(tokens)
    # mlx-lm grows the buffers 256 tokens at a time: the estimate counts whole steps.
    assert estimate == pytest.approx(measured, rel=0.03), (estimate, measured)
    assert shape.cache_bytes(tokens) == shape.cache_bytes(-(-tokens // KV_STEP) * KV_STEP)


def test_the_engine_estimates_with_the_models_dtype_and_its_kv_bits(heads_of_32):
    import asyncio

    from mlx_integrations.engine import SimpleEngine

    async def estimate(**options: object) -> int | None:
        engine = SimpleEngine(heads_of_32, **options)
        assert engine.kv_cache_bytes(10) is None  # not before a load
        await engine.start()
        try:
            return engine.kv_cache_bytes(256)
        finally:
            await engine.stop()

    # 2 layers x 2 KV heads x (32 + 32) values x 4 bytes (float32) x 256 tokens.
    assert asyncio.run(estimate()) == 2 * 2 * 64 * 4 * 256
    if quantized_attention_error("float32", 32, 8, 32):
        return  # this backend refuses kv_bits at load (tests/engine/test_kv_backend.py)
    # 8 bits: 32 bytes a row of keys or values, and a float32 scale and bias per group.
    assert asyncio.run(estimate(kv_bits=8, kv_group_size=32)) == 2 * 2 * 2 * (32 + 8) * 256


def test_a_config_without_head_sizes_gives_no_estimate():
    assert kv_shape({"model_type": "mystery"}, 2) is None
    shape = kv_shape({"text_config": {"num_hidden_layers": 2, "num_attention_heads": 4,
                                      "hidden_size": 64}}, 2)  # fmt: skip
    assert shape == KVShape(layers=2, kv_heads=4, key_dim=16, value_dim=16, itemsize=2)
