"""Serving a cached prefix in whole key steps.

Where an engine pads prefill pieces (CUDA by default), a cached prefix is served only up
to a multiple of the key step (``decoding.KEY_STEP``), in buffers exactly that long: the
attention's key lengths after a prefix are then whole steps plus a padded piece, which
repeat across requests, and MLX's CUDA backend sets each up once. Only plain KV caches
are cut; a sliding window, a quantized or a state-space cache is served whole.
"""

from __future__ import annotations

from typing import Any


def plain_kv(cache: list[Any]) -> bool:
    """Whether ``cache`` is a non-empty list of plain KV layers: no sliding window, no
    quantization, no state-space layers (what padding and cutting may touch)."""
    from mlx_lm.models.cache import KVCache

    return bool(cache) and all(type(layer) is KVCache for layer in cache)


def cut_length(cache: list[Any], n: int, step: int) -> int:
    """The prefix of ``n`` tokens served from ``cache``: cut to a multiple of ``step``
    for a plain KV cache, whole otherwise (a cache that cannot be cut)."""
    return n - n % step if step > 1 and plain_kv(cache) else n


def lay_out(cache: list[Any], n: int) -> None:
    """Hold the first ``n`` tokens of a plain KV cache in buffers exactly that long: the
    next piece written grows them to ``n`` plus whole steps of mlx-lm's cache, as it
    does a cache it filled itself, instead of writing into what a longer past left."""
    for layer in cache:
        layer.keys, layer.values = layer.keys[..., :n, :], layer.values[..., :n, :]
        layer.offset = n
