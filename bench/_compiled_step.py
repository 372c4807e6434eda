"""An experiment for the GPU profile: a decode step as one ``mx.compile``-d function.

A decode step of mlx-lm's loop rebuilds the model's graph in Python (some 700 array
operations for a 24-layer model) and MLX launches a kernel for nearly each one. Here
the step (embedding, every layer, the head and the log-softmax) is one compiled
function over mlx-lm's own KV buffers, written in place at the position
(``mx.slice_update``) and attended over whole under a mask that hides the positions
past it; the function is traced again only when a buffer grows.

On an H200 (2026-12-03) it decoded no faster than mlx-lm's loop (the time is not in
Python), and on CUDA its fused bf16 kernels round differently, so greedy replies can
differ from mlx-lm's: the engines do not use it. bench_gpu.py's profile times it
beside the eager step.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Generator
from typing import Any

logger = logging.getLogger(__name__)

_GROW = 256
"""Positions added to a full buffer (mlx-lm's ``KVCache.step``)."""

# Each loaded model's compiled step, or None once its step could not be traced; keyed
# by id (modules are dicts, not hashable) and dropped with the model.
_steps: dict[int, Callable[..., Any] | None] = {}


def _remember(model: Any, step: Callable[..., Any] | None) -> None:
    if id(model) not in _steps:
        weakref.finalize(model, _steps.pop, id(model), None)
    _steps[id(model)] = step


class _SlotCache:
    """One layer's cache inside the compiled step: fixed buffers, position as an array."""

    def __init__(self, keys: Any, values: Any, offset: Any):
        self.keys = keys
        self.values = values
        self.offset = offset

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Any, Any]:
        import mlx.core as mx

        start = self.offset.reshape(1)
        self.keys = mx.slice_update(self.keys, keys, start, axes=(2,))
        self.values = mx.slice_update(self.values, values, start, axes=(2,))
        return self.keys, self.values

    def make_mask(self, n: int, *, return_array: bool = False, window_size: Any = None) -> Any:
        import mlx.core as mx

        if n != 1 or window_size is not None:
            raise NotImplementedError("the compiled step decodes one token, no window")
        # Position ``offset`` holds the new token: it and every one before it are seen.
        return (mx.arange(self.keys.shape[2]) <= self.offset)[None]


def supports(model: Any, cache: list[Any]) -> bool:
    """Whether ``cache`` (after prefill) can be decoded by the compiled step."""
    from mlx_lm.models.cache import KVCache

    return (
        (id(model) not in _steps or _steps[id(model)] is not None)
        and bool(cache)
        and all(type(c) is KVCache and c.keys is not None for c in cache)
    )


def _step_function(model: Any) -> Callable[..., Any]:
    fn = _steps.get(id(model))
    if fn is None:
        import mlx.core as mx

        def step(token: Any, offset: Any, keys: list[Any], values: list[Any]) -> Any:
            slots = [_SlotCache(k, v, offset) for k, v in zip(keys, values, strict=True)]
            logits = model(token.reshape(1, 1), cache=slots)[:, -1, :]
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            return logprobs, [s.keys for s in slots], [s.values for s in slots]

        fn = mx.compile(step)
        _remember(model, fn)
    return fn


class CompiledDecoder:
    """Feeds tokens one at a time through the compiled step, over ``cache``'s buffers.

    Owner thread only. ``close`` hands the buffers back to ``cache`` with the count of
    tokens fed, so the cache is an ordinary ``KVCache`` again.
    """

    def __init__(self, model: Any, cache: list[Any]):
        self._cache = cache
        self._step = _step_function(model)
        self._model = model
        self.offset = int(cache[0].offset)
        self._keys = [c.keys for c in cache]
        self._values = [c.values for c in cache]

    def feed(self, token: Any) -> Any:
        """Log-probabilities (lazy, shape ``(1, vocab)``) after ``token``, of shape ``(1,)``."""
        import mlx.core as mx

        if self.offset >= self._keys[0].shape[2]:
            self._keys = [_grown(k) for k in self._keys]
            self._values = [_grown(v) for v in self._values]
        offset = mx.array(self.offset, dtype=mx.int32)
        logprobs, self._keys, self._values = self._step(token, offset, self._keys, self._values)
        self.offset += 1
        return logprobs

    def close(self) -> None:
        for c, k, v in zip(self._cache, self._keys, self._values, strict=True):
            c.keys, c.values, c.offset = k, v, self.offset


def _grown(buffer: Any) -> Any:
    import mlx.core as mx

    b, h, _, d = buffer.shape
    return mx.concatenate([buffer, mx.zeros((b, h, _GROW, d), buffer.dtype)], axis=2)


def compiled_steps(
    model: Any,
    last_token: int,
    cache: list[Any],
    *,
    max_tokens: int,
    sampler: Callable[[Any], Any],
) -> Generator[int, None, None]:
    """Decode ``max_tokens`` tokens after ``last_token``, the prompt's last, not in ``cache``.

    As in mlx-lm's ``generate_step``, the step that feeds a token is queued before the
    token is handed out (its evaluation overlaps the caller's work), so the cache holds
    every token handed out.
    The caller checks :func:`supports` first. A model whose first step cannot be traced
    raises ``NotImplementedError`` before any token, with ``cache`` as it was.
    """
    import mlx.core as mx
    from mlx_lm.generate import generation_stream

    decoder = CompiledDecoder(model, cache)
    try:
        with mx.stream(generation_stream):
            try:
                y = sampler(decoder.feed(mx.array([last_token], mx.uint32)))
            except Exception as exc:
                # Nothing was written: the buffers are replaced only when a step returns.
                _remember(model, None)
                logger.debug("The model's decode step cannot be compiled", exc_info=True)
                raise NotImplementedError(f"the decode step cannot be compiled: {exc}") from exc
            mx.async_eval(y)
            for n in range(max_tokens):
                next_y = sampler(decoder.feed(y))
                mx.async_eval(next_y)
                token = int(y.item())
                if n % 256 == 255:
                    mx.clear_cache()
                yield token
                y = next_y
    finally:
        decoder.close()
