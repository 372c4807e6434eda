"""The compiled decode step gives mlx-lm's tokens and leaves an ordinary KV cache."""

from __future__ import annotations

import pytest

import mlx_integrations  # noqa: F401  (BLAS preload before mlx.core)
from mlx_integrations.engine import compiled_decode
from mlx_integrations.engine.speculative import prefill


@pytest.fixture(scope="module")
def loaded(tiny_qwen2):
    from mlx_lm import load

    return load(str(tiny_qwen2))


def _reference(model, prompt, max_tokens, sampler):
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    steps = generate_step(
        mx.array(prompt), model, max_tokens=max_tokens, sampler=sampler, prompt_cache=cache
    )
    return [int(t) for t, _ in steps], cache


def _compiled(model, prompt, max_tokens, sampler):
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    prefill(model, cache, prompt[:-1], 2048)
    assert compiled_decode.supports(model, cache)
    steps = compiled_decode.compiled_steps(
        model, prompt[-1], cache, max_tokens=max_tokens, sampler=sampler
    )
    return list(steps), cache


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_tokens_and_cache_equal_mlx_lm_across_a_buffer_growth(loaded, temperature):
    import mlx.core as mx
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = loaded
    prompt = tokenizer.encode("Tell me a story about a fox and a crow. " * 4)
    sampler = make_sampler(temperature)
    max_tokens = 300  # the 256-position KV buffer grows once on the way
    mx.random.seed(7)
    ref, ref_cache = _reference(model, prompt, max_tokens, sampler)
    mx.random.seed(7)
    ours, cache = _compiled(model, prompt, max_tokens, sampler)
    assert ours == ref
    assert cache[0].offset == ref_cache[0].offset == len(prompt) + max_tokens
    for a, b in zip(cache, ref_cache, strict=True):
        n = a.offset
        assert mx.array_equal(a.keys[..., :n, :], b.keys[..., :n, :]).item()
        assert mx.array_equal(a.values[..., :n, :], b.values[..., :n, :]).item()


def test_stopping_early_leaves_the_tokens_handed_out_in_the_cache(loaded):
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = loaded
    prompt = tokenizer.encode("Hello there")
    ref, _ = _reference(model, prompt, 5, make_sampler(0.0))
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    prefill(model, cache, prompt[:-1], 2048)
    steps = compiled_decode.compiled_steps(
        model, prompt[-1], cache, max_tokens=50, sampler=make_sampler(0.0)
    )
    got = [next(steps) for _ in range(5)]
    steps.close()
    assert got == ref
    # As with mlx-lm's loop, the step feeding the last token handed out was queued.
    assert cache[0].offset == len(prompt) + 5


def test_only_plain_filled_caches_qualify(loaded):
    from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

    model, _ = loaded
    empty = make_prompt_cache(model)
    assert not compiled_decode.supports(model, empty)
    rotating = [RotatingKVCache(max_size=64) for _ in model.layers]
    prefill(model, rotating, [1, 2, 3], 2048)
    assert not compiled_decode.supports(model, rotating)
