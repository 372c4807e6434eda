"""Requests that arrive together, prefilled in one padded batch of few shapes.

mlx-lm's batch generator prefills requests that join together in one batch as long
as its longest prompt, with as many rows as requests, after the longest cached
prefix among them: on CUDA every new shape of that batch costs a set-up (attention
graphs, CUDA graphs) that can outweigh the prefill itself, and a server meets a new
one with almost every group. Where the engine pads prefill pieces (``prefill_buckets``),
:func:`prefill_together` prefills such a group itself, every length a bucket: the
cached prefixes padded in front to one bucket (masked, as the generator masks its
left padding), the prompts' rest padded at their end to another (a causal mask keeps
every real token from seeing it), and the rows padded to a power of two with copies of
the last one. Each request then takes out of the batch's cache only its own tokens'
keys and values, as if prefilled alone, and joins the generator with them and its last
token, as a lone newcomer does (:func:`.solo.prefill_joining`).
"""

from __future__ import annotations

from typing import Any

from mlx_integrations.engine.cache.prefix_cache import cache_offset
from mlx_integrations.engine.decoding import PrefillShapes

Arrival = tuple[list[Any] | None, list[int]]
"""A request's cached prefix (None: none) and the tokens to prefill after it."""


def group_rows(n: int) -> int:
    """The rows a group of ``n`` prompts is prefilled with: the next power of two."""
    return 1 << (n - 1).bit_length()


def joins_together(cache: list[Any] | None, tokens: list[int], shapes: PrefillShapes) -> bool:
    """Whether a request (its cached prefix, its tokens to prefill but the last) can be
    prefilled in a padded group: each part fits the longest bucket, and a cached prefix
    is a plain KV cache."""
    if not shapes.buckets or not 0 < len(tokens) <= shapes.buckets[-1]:
        return False
    return cache is None or (shapes.pads(cache) and cache_offset(cache) <= shapes.buckets[-1])


def prefill_together(
    model: Any, arrivals: list[Arrival], shapes: PrefillShapes
) -> list[list[Any]] | None:
    """Prefill ``arrivals`` (see :func:`joins_together`) in one padded batch.

    Returns:
        One KV cache per arrival (plain ``KVCache`` layers holding its prefix and
        tokens alone), or None where the model's cache cannot be padded (sliding
        windows, state-space layers) or the padded lengths would pass the context
        window: the generator prefills them then.
    """
    import mlx.core as mx
    from mlx_lm.generate import generation_stream
    from mlx_lm.models.cache import make_prompt_cache

    if not shapes.pads(make_prompt_cache(model)):
        return None
    held = max(cache_offset(cache) if cache else 0 for cache, _ in arrivals)
    prefix = _bucket(held, shapes) if held else 0
    length = _bucket(max(len(tokens) for _, tokens in arrivals), shapes)
    if shapes.positions is not None and prefix + length > shapes.positions:
        return None
    rows = arrivals + arrivals[-1:] * (group_rows(len(arrivals)) - len(arrivals))
    pieces = [tokens + tokens[-1:] * (length - len(tokens)) for _, tokens in rows]
    right = [length - len(tokens) for _, tokens in rows]
    with mx.stream(generation_stream):
        caches = [cache or make_prompt_cache(model) for cache, _ in rows]
        batch = [_merged(list(layers), prefix) for layers in zip(*caches, strict=True)]
        for layer in batch:
            layer.prepare(right_padding=right)
        model(mx.array(pieces, mx.uint32), cache=batch)
        for layer in batch:
            layer.finalize()  # the end padding moves to the front, which extract skips
        out = [[layer.extract(i) for layer in batch] for i in range(len(arrivals))]
        mx.eval([layer.state for row in out for layer in row])
        del batch, caches
        mx.clear_cache()
    return out


def _bucket(n: int, shapes: PrefillShapes) -> int:
    return next(size for size in shapes.buckets if size >= n)


def _merged(layers: list[Any], prefix: int) -> Any:
    """One layer's batch cache of the rows' prefixes, right-aligned at ``prefix``
    positions (mlx-lm's merge aligns them at the longest; the rest is padding)."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    merged = BatchKVCache.merge(layers)
    if merged.keys is None:
        return merged
    keys, values, offset, left, held = merged.state
    more = [(0, 0), (0, 0), (prefix - held, 0), (0, 0)]
    merged.state = (mx.pad(keys, more), mx.pad(values, more), offset, left + prefix - held, prefix)
    return merged
