"""How many bytes a request's KV cache takes, from the model's config, before it runs.

Keys and values: layers x KV heads x head size x tokens, each value in the model's
activation dtype, or with ``kv_bits`` packed in ``bits/8`` bytes plus a scale and a
bias per group of ``kv_group_size`` values. mlx-lm's ``KVCache`` (and its quantized
and batched forms) grows its buffers in steps of 256 tokens, so a cache holding
``n`` tokens has room for ``n`` rounded up to the next multiple of 256.

The estimate assumes every layer attends over the whole context: for a model with
sliding-window or state-space layers it is an upper bound. Activations of a prefill
step (a few MiB at most for ``prefill_step_size`` tokens) are not counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

KV_STEP = 256
"""mlx-lm's ``KVCache.step``: buffers grow by this many tokens at a time."""


@dataclass(frozen=True)
class KVShape:
    """What one token costs in a model's KV cache."""

    layers: int
    kv_heads: int
    key_dim: int
    value_dim: int
    itemsize: int
    """Bytes of one value in the activation dtype (4 for float32, 2 for float16)."""
    bits: int | None = None
    """Bits per value of a quantized cache (``kv_bits``), None for a plain one."""
    group_size: int = 64

    def bytes_per_token(self) -> float:
        """Bytes of keys and values for one token over every layer."""
        return self.layers * self.kv_heads * (self._row(self.key_dim) + self._row(self.value_dim))

    def cache_bytes(self, tokens: int) -> int:
        """Bytes of a cache holding ``tokens`` tokens, in mlx-lm's 256-token steps."""
        if tokens <= 0:
            return 0
        capacity = math.ceil(tokens / KV_STEP) * KV_STEP
        return int(capacity * self.bytes_per_token())

    def _row(self, dim: int) -> float:
        if self.bits is None:
            return dim * self.itemsize
        # Packed values in uint32 words, and a scale and a bias per group.
        return dim * self.bits / 8 + 2 * math.ceil(dim / self.group_size) * self.itemsize


def kv_shape(
    config: Mapping[str, Any], itemsize: int, bits: int | None = None, group_size: int = 64
) -> KVShape | None:
    """The KV shape of a model from its config.json (a vision model's text part too).

    Returns:
        None when the config does not give the layer count and head sizes.
    """
    text = config.get("text_config")
    merged = {**config, **text} if isinstance(text, Mapping) else dict(config)
    layers = merged.get("num_hidden_layers") or merged.get("n_layer")
    heads = merged.get("num_attention_heads") or merged.get("n_head")
    kv_heads = merged.get("num_key_value_heads") or heads
    head_dim = merged.get("head_dim")
    if head_dim is None and heads and merged.get("hidden_size"):
        head_dim = int(merged["hidden_size"]) // int(heads)
    value_dim = merged.get("v_head_dim") or head_dim
    sizes = (layers, kv_heads, head_dim, value_dim)
    if not all(isinstance(v, int) and v > 0 for v in sizes):
        return None
    return KVShape(
        layers=int(sizes[0]),  # type: ignore[arg-type]  # checked just above
        kv_heads=int(sizes[1]),  # type: ignore[arg-type]
        key_dim=int(sizes[2]),  # type: ignore[arg-type]
        value_dim=int(sizes[3]),  # type: ignore[arg-type]
        itemsize=int(itemsize),
        bits=bits,
        group_size=group_size,
    )


def activation_itemsize(model: Any) -> int:
    """Bytes of one value in the model's activations: the dtype of its first floating
    point parameter (a quantized model's scales), 2 when it has none."""
    import mlx.core as mx

    for _, value in _leaves(model):
        if isinstance(value, mx.array) and mx.issubdtype(value.dtype, mx.floating):
            return int(value.dtype.size)
    return 2


def parameter_bytes(*models: Any) -> int:
    """Bytes of the parameters of ``models`` (None entries skipped): their weights."""
    total = 0
    for model in models:
        if model is not None:
            total += sum(v.nbytes for _, v in _leaves(model))
    return total


def _leaves(model: Any) -> list[tuple[str, Any]]:
    from mlx.utils import tree_flatten

    return cast("list[tuple[str, Any]]", tree_flatten(model.parameters()))
