"""A quantized KV cache for ``BatchedEngine``'s shared batch (``kv_bits``).

mlx-lm's ``BatchGenerator`` batches a request's per-layer caches through the layer
type's ``merge`` (``KVCache.merge`` builds a ``BatchKVCache``); ``QuantizedKVCache`` has
none. Here :class:`MergeableQuantizedKVCache` is mlx-lm's ``QuantizedKVCache`` with a
``merge``, and :class:`BatchQuantizedKVCache` does for it what ``BatchKVCache`` does for
``KVCache``: rows left-padded to a common length, per-row offsets, the padding mask,
prefill with right padding rolled to the left, filter, extend, extract. A quantized
cache is three arrays per keys and per values (packed values, scales, biases), each
laid out ``(batch, heads, tokens, ...)`` like a plain cache's keys, so the batch cache
keeps them as three ``BatchKVCache`` planes that move together: every padding,
rolling and slicing step is mlx-lm's own. ``update_and_fetch`` quantizes the new keys
and values (``mx.quantize``, as ``QuantizedKVCache`` does) and returns the quantized
tuples; the cache has ``bits`` and ``group_size``, so mlx-lm's attention takes its
quantized path (``quantized_scaled_dot_product_attention``).

Every row of a shared batch is quantized, so ``BatchedEngine`` quantizes a request's
cache from its first token (``quantized_kv_start=0``, see
:func:`~mlx_integrations.engine.cache.kv_quantization.check_batched_kv_options`).

:func:`roll_back_rows` drops each row's last positions from a batch cache of either
kind (what speculation in the batch rejected).
"""

from __future__ import annotations

from typing import Any

from mlx_lm.models.cache import BatchKVCache, KVCache, QuantizedKVCache, _BaseCache


class MergeableQuantizedKVCache(QuantizedKVCache):
    """mlx-lm's ``QuantizedKVCache`` that can join a ``BatchGenerator`` batch."""

    @classmethod
    def merge(cls, caches: list[Any]) -> BatchQuantizedKVCache:
        return BatchQuantizedKVCache.merge(caches)


class BatchQuantizedKVCache(_BaseCache):
    """Left-padded quantized KV of a batch of sequences (``BatchKVCache``'s layout).

    Args:
        left_padding: Padding tokens before each row's first token.
        group_size: Values sharing one scale and bias.
        bits: Bits per value.
    """

    def __init__(self, left_padding: list[int], group_size: int = 64, bits: int = 8):
        # Packed values, scales, biases: BatchKVCache's keys and values hold each part.
        self._planes = [BatchKVCache(left_padding) for _ in range(3)]
        self.group_size = group_size
        self.bits = bits

    # The first plane's bookkeeping is every plane's.
    @property
    def offset(self) -> Any:
        return self._planes[0].offset

    @property
    def left_padding(self) -> Any:
        return self._planes[0].left_padding

    @property
    def keys(self) -> tuple[Any, ...] | None:
        if self._planes[0].keys is None:
            return None
        return tuple(p.keys for p in self._planes)

    @property
    def values(self) -> tuple[Any, ...] | None:
        if self._planes[0].values is None:
            return None
        return tuple(p.values for p in self._planes)

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        import mlx.core as mx

        qk = mx.quantize(keys, group_size=self.group_size, bits=self.bits)
        qv = mx.quantize(values, group_size=self.group_size, bits=self.bits)
        fetched = [p.update_and_fetch(k, v) for p, k, v in zip(self._planes, qk, qv, strict=True)]
        return tuple(k for k, _ in fetched), tuple(v for _, v in fetched)

    def prepare(self, **kwargs: Any) -> None:
        for p in self._planes:
            p.prepare(**kwargs)

    def finalize(self) -> None:
        for p in self._planes:
            p.finalize()

    def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> Any:
        return self._planes[0].make_mask(N, return_array=return_array, **kwargs)

    def filter(self, batch_indices: Any) -> None:
        for p in self._planes:
            p.filter(batch_indices)

    def extend(self, other: BatchQuantizedKVCache) -> None:
        _check_same_format(self, other)
        for p, o in zip(self._planes, other._planes, strict=True):
            p.extend(o)

    def extract(self, idx: int) -> MergeableQuantizedKVCache:
        """Row ``idx`` as a cache of its own, its padding dropped."""
        rows = [p.extract(idx) for p in self._planes]
        keys, values = tuple(r.keys for r in rows), tuple(r.values for r in rows)
        state = (keys, values, rows[0].offset, self.group_size, self.bits)
        return MergeableQuantizedKVCache.from_state(state)

    @classmethod
    def merge(cls, caches: list[Any]) -> BatchQuantizedKVCache:
        """One batch cache from per-sequence ``QuantizedKVCache`` or ``KVCache`` layers.

        ``KVCache`` rows are quantized at the format of the quantized ones.

        Raises:
            ValueError: Rows quantized at different bits or group sizes, or no quantized
                row to take the format from.
        """
        quantized = [c for c in caches if isinstance(c, QuantizedKVCache)]
        if not quantized:
            raise ValueError("BatchQuantizedKVCache.merge needs a QuantizedKVCache row")
        group_size, bits = quantized[0].group_size, quantized[0].bits
        batch = cls([0] * len(caches), group_size=group_size, bits=bits)
        for c in quantized:
            _check_same_format(batch, c)
        rows = [c.to_quantized(group_size, bits) if isinstance(c, KVCache) else c for c in caches]
        # Each part as a KVCache row, merged (padded to one length) by BatchKVCache.
        batch._planes = [BatchKVCache.merge([_plane(c, i) for c in rows]) for i in range(3)]
        return batch

    def trim(self, n: int) -> int:
        trimmed = 0
        for p in self._planes:
            trimmed = p.trim(n)
        return trimmed

    def is_trimmable(self) -> bool:
        return True

    def size(self) -> int:
        return self._planes[0].size()

    def empty(self) -> bool:
        return self._planes[0].empty()

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self._planes)

    @property
    def state(self) -> tuple[Any, ...]:
        first = self._planes[0]
        return self.keys, self.values, first.offset, first.left_padding, first._idx

    @state.setter
    def state(self, v: tuple[Any, ...]) -> None:
        keys, values, offset, left_padding, idx = v
        self._planes = [BatchKVCache([]) for _ in range(3)]
        for i, p in enumerate(self._planes):
            part_k = None if keys is None else keys[i]
            part_v = None if values is None else values[i]
            p.state = (part_k, part_v, offset, left_padding, idx)

    @property
    def meta_state(self) -> tuple[str, str]:
        return str(self.group_size), str(self.bits)

    @meta_state.setter
    def meta_state(self, v: tuple[str, str]) -> None:
        self.group_size, self.bits = map(int, v)


def _plane(cache: QuantizedKVCache, part: int) -> KVCache:
    """One part (0 packed values, 1 scales, 2 biases) of a quantized row, as a KVCache."""
    row = KVCache()
    if cache.keys is not None:
        row.keys, row.values = cache.keys[part], cache.values[part]
        row.offset = cache.offset
    return row


def _check_same_format(a: Any, b: Any) -> None:
    if (a.group_size, a.bits) != (b.group_size, b.bits):
        raise ValueError(
            f"cannot batch KV quantized at bits={b.bits}, group_size={b.group_size} with "
            f"bits={a.bits}, group_size={a.group_size}"
        )


def request_cache(
    model: Any, cache: list[Any] | None, kv_bits: int | None, group_size: int
) -> list[Any]:
    """A request's KV cache (a fresh one for None); with ``kv_bits``, quantized.

    ``KVCache`` layers become :class:`MergeableQuantizedKVCache` (mlx-lm's
    ``to_quantized``, from the first token, so the cache can join a batch); layers of
    other types (rotating, recurrent) stay as they are, as in ``SimpleEngine``.
    """
    from mlx_lm.models.cache import make_prompt_cache

    from mlx_integrations.engine.cache.kv_quantization import maybe_quantize

    if cache is None:
        cache = make_prompt_cache(model)
    maybe_quantize(cache, kv_bits, group_size, 0)
    for i, layer in enumerate(cache):
        if type(layer) is QuantizedKVCache:
            cache[i] = MergeableQuantizedKVCache.from_state(layer.state)
    return cache


def roll_back_rows(cache: list[Any], drop: list[int]) -> None:
    """Drop the last ``drop[row]`` positions of each row of a batch KV cache.

    Each row's drops beyond the common ones become left padding; once every row has
    some (the row that kept the most changes from step to step), the padding all rows
    share is cut off, as mlx-lm's ``filter`` does when rows leave, so the cache stays
    as long as its longest row.
    """
    common = min(drop)
    rest = [n - common for n in drop]
    for layer in cache:
        if common:
            layer.trim(common)
        if max(rest) > 0:
            layer.prepare(right_padding=rest)
            layer.finalize()
    shared = min(cache[0].left_padding.tolist()) if cache and max(rest) > 0 else 0
    if shared > 0:
        for layer in cache:
            for plane in getattr(layer, "_planes", [layer]):  # a quantized layer's parts
                plane.keys = plane.keys[..., shared:, :]
                plane.values = plane.values[..., shared:, :]
                plane._idx -= shared
                plane.left_padding = plane.left_padding - shared
