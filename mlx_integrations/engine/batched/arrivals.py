"""Requests that arrive together: their batch prefill padded to few shapes.

mlx-lm's batch generator prefills requests that join together in one batch as long
as its longest prompt (each shorter one padded at its end and masked), with as many
rows as requests: on CUDA every new shape of that batch costs a set-up (attention
graphs, CUDA graphs) that can outweigh the prefill itself, and a server meets a new
one with almost every group. Where the engine pads prefill pieces (``prefill_buckets``),
:func:`placeholder_prompts` gives the group placeholder rows for the generator to
prefill with it: one as long as the next bucket, so that every real prompt is padded to
that length, and more up to one of a few row counts (powers of two and one and a half
times them) while the batch has room (the generator has :data:`SPARE` places beyond
``max_num_seqs``, so a group that fills the batch still gets the first). They are
taken out of the generator before they decode (the engine removes them after the step
that prefilled them, :func:`drop_placeholders`), so the real rows are computed exactly as
in any mlx-lm batch.
"""

from __future__ import annotations

from typing import Any

from mlx_integrations.engine.decoding import PrefillShapes

PLACEHOLDER = 0
"""The token placeholder rows are made of (any token: they are never decoded)."""

SPARE = 1
"""Places the engine's generator has beyond ``max_num_seqs``: a group that fills the
batch still gets the placeholder that pads its prefill to a bucket's length."""


def placeholder_prompts(
    rests: list[tuple[int, int]], room: int, shapes: PrefillShapes, model: Any = None
) -> list[list[int]]:
    """Placeholder rows for a group whose requests hold ``rests`` (tokens cached, tokens
    to prefill before their last one; all going into one prefill batch), with ``room``
    places left in the batch. None where pieces are not padded, a rest is over one
    piece, a padded row would pass the model's positions, or ``model``'s cache is not a
    plain KV cache (a sliding window or a state-space layer).

    A placeholder's last token is held back as a real prompt's is, so its prefill
    length is its length less one.
    """
    longest = max((n for _, n in rests), default=0)
    if not shapes.buckets or room < 1 or not 0 < longest <= shapes.buckets[-1]:
        return []
    # Whole steps after a prefix (the bucket's near the model's positions); padding at a
    # row's end must not reach past the positions the model has.
    length = shapes.fitted(max(held for held, _ in rests), longest)
    if length is None:
        return []
    if model is not None and not _plain_kv(model, shapes):
        return []
    rows = [[PLACEHOLDER] * (length + 1)] if length > longest else []  # room >= 1 holds it
    total = len(rests) + len(rows)
    rows += [[PLACEHOLDER] * 2] * max(0, min(group_rows(total), room + len(rests)) - total)
    return rows


def group_rows(n: int) -> int:
    """The rows a group of ``n`` is padded to: 1, 2, 3, 4, 6, 8, 12, 16... (powers of
    two and one and a half times them), at most a third more than ``n``."""
    size = 1 << (n - 1).bit_length()
    return size * 3 // 4 if size >= 4 and size * 3 // 4 >= n else size


def group_row_counts(places: int) -> list[int]:
    """The row counts the prefill of a group (two requests or more, with their
    placeholders) takes in a generator of ``places`` places holding no other row, from
    the largest: ``group_rows`` of each size the group can reach, at most ``places``."""
    return sorted({min(group_rows(n), places) for n in range(2, places + 1)}, reverse=True)


def _plain_kv(model: Any, shapes: PrefillShapes) -> bool:
    from mlx_lm.models.cache import make_prompt_cache

    return shapes.pads(make_prompt_cache(model))


def drop_placeholders(generator: Any, uids: list[int]) -> None:
    """Take a group's placeholder rows (``uids``) out of the prompt batch that has just
    prefilled them, before it decodes, leaving the batch mlx-lm's ``remove`` followed by
    :func:`realign` would: the real rows, less the left padding none of them needs, in
    buffers of whole steps of mlx-lm's cache.

    mlx-lm's ``remove`` gathers the rows kept (a new index array and a copy of each
    layer's keys and values) and reads each layer's left padding back from the device
    before it slices off the padding no row kept needs (which :func:`realign` then grows
    back to whole steps): on CUDA, 9 to 20 ms a group. Placeholders are the last rows of
    the batch (inserted after their group), so here the rows kept are a slice: the left
    padding is read once, and each layer's keys and values lose the placeholders' rows
    and the common padding with at most one copy each (grown back to whole steps). Any
    other case (no placeholders, placeholders not last, a cache that is not a plain
    ``BatchKVCache``) goes through ``remove`` and :func:`realign`.
    """
    from mlx_lm.models.cache import BatchKVCache

    batch: Any = generator._prompt_batch
    layers = batch.prompt_cache
    kept = len(batch.uids) - len(uids)
    if (
        not uids
        or kept < 1
        or batch.uids[kept:] != list(uids)
        or not layers
        or any(type(layer) is not BatchKVCache or layer.keys is None for layer in layers)
    ):
        generator.remove(uids)
        realign(generator)
        return
    import mlx.core as mx

    # mlx-lm's own bookkeeping (the batch's lists, the rows it is processing), its cache
    # left out: the layers are cut here.
    batch.prompt_cache = []
    try:
        generator.remove(uids)
    finally:
        batch.prompt_cache = layers
    # Plain KV layers (checked above) all hold the same positions, so one layer's left
    # padding is every layer's; the prefill evaluated it.
    shift = min(layers[0].left_padding.tolist()[:kept])
    for layer in layers:
        length = layer.keys.shape[2] - shift
        short = -length % layer.step
        cut = []
        for x in (layer.keys, layer.values):
            x = x[:kept, :, shift:, :]
            if short:
                x = _grown(x, short)
            elif shift:
                x = mx.contiguous(x)
            cut.append(x)
        layer.keys, layer.values = cut
        layer.offset = layer.offset[:kept]
        layer.left_padding = layer.left_padding[:kept] - shift
        layer._idx -= shift


def realign(generator: Any) -> None:
    """Grow the batch's KV buffers back to whole steps of mlx-lm's cache once
    placeholders have left (taken out of the prefilled batch, before it decodes).

    The placeholder is the group's longest row: when it leaves, mlx-lm's
    ``BatchKVCache.filter`` drops the left padding no remaining row needs by slicing the
    buffers, which then hold a few positions less than a whole number of steps, and the
    batch decodes over that layout (and grows it in steps from there) until it ends. The
    buffers are padded at their end back to whole steps; what the rows hold is the same.
    """
    from mlx_lm.models.cache import BatchKVCache

    # Placeholders leave the prompt batch (they are removed right after the step that
    # prefilled them); the batch already decoding is not touched.
    batch = getattr(generator, "_prompt_batch", None)
    for layer in getattr(batch, "prompt_cache", None) or ():
        if type(layer) is not BatchKVCache or layer.keys is None:
            continue  # a sliding window or a quantized batch: left as it is
        short = -layer.keys.shape[2] % layer.step
        if short:
            layer.keys, layer.values = _grown(layer.keys, short), _grown(layer.values, short)


def _grown(x: Any, positions: int) -> Any:
    """KV buffer ``x`` (rows, heads, positions, dims) with ``positions`` zeros at its end."""
    import mlx.core as mx

    pad = mx.zeros((*x.shape[:2], positions, x.shape[3]), x.dtype)
    return mx.concatenate([x, pad], axis=2)
