"""A quantized KV cache for ``SimpleEngine``: options, checks, and the in-place conversion.

With ``kv_bits`` set, each layer's ``KVCache`` becomes mlx-lm's ``QuantizedKVCache``
once it holds ``quantized_kv_start`` tokens: keys and values are stored as packed
integers with one scale and one bias per ``kv_group_size`` values, and attention runs
on them directly (``mx.quantized_matmul``). At 4 bits a float16 cache takes about
0.28x its bytes, at 8 bits about 0.53x; replies drift from unquantized ones, by
little at 8 bits.
"""

from __future__ import annotations

from typing import Any, cast

from mlx_integrations.chat.fields import RequestError, RequestTypeError
from mlx_integrations.runtime import quantized_attention_error

KV_BITS = (2, 3, 4, 6, 8)
"""Bit widths mlx-lm's ``QuantizedKVCache`` (``mx.quantize``) supports."""

KV_GROUP_SIZES = (32, 64, 128)
"""Group sizes ``mx.quantize`` supports: values sharing one scale and bias."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_kv_options(kv_bits: Any, kv_group_size: Any, quantized_kv_start: Any) -> None:
    """Check the KV cache quantization options of an engine.

    Raises:
        TypeError: A value of the wrong type. ValueError: A value mlx-lm does not support.
    """
    allowed_bits = ", ".join(map(str, KV_BITS))
    if kv_bits is not None:
        if not _is_int(kv_bits):
            raise RequestTypeError(
                f"kv_bits must be an integer ({allowed_bits}) or None, got {kv_bits!r}", "kv_bits"
            )
        if kv_bits not in KV_BITS:
            raise RequestError(
                f"kv_bits must be one of {allowed_bits} (or None for an unquantized "
                f"cache), got {kv_bits}",
                "kv_bits",
            )
    allowed_groups = ", ".join(map(str, KV_GROUP_SIZES))
    if not _is_int(kv_group_size):
        raise RequestTypeError(
            f"kv_group_size must be an integer ({allowed_groups}), got {kv_group_size!r}",
            "kv_group_size",
        )
    if kv_group_size not in KV_GROUP_SIZES:
        raise RequestError(
            f"kv_group_size must be one of {allowed_groups} (64 is usual), got {kv_group_size}",
            "kv_group_size",
        )
    if not _is_int(quantized_kv_start):
        raise RequestTypeError(
            f"quantized_kv_start must be an integer, got {quantized_kv_start!r}",
            "quantized_kv_start",
        )
    if quantized_kv_start < 0:
        raise RequestError(
            f"quantized_kv_start must be >= 0 (tokens kept unquantized; 0 quantizes "
            f"from the start), got {quantized_kv_start}",
            "quantized_kv_start",
        )


def check_kv_at_load(model: Any, kv_bits: int | None, group_size: int, name: str) -> None:
    """Refuse, at load, ``kv_bits`` that the model or the backend cannot serve.

    Raises:
        ValueError: ``group_size`` does not divide the attention heads (naming the head
            size and the group sizes that fit), or MLX cannot attend over a quantized
            KV cache here (its CUDA backend: naming the model's dtype and head size,
            MLX's own error, and the fix, ``kv_bits=None``).
    """
    if kv_bits is None:
        return
    head = _head_size(model)
    if head is None:
        return
    if head % group_size:
        fits = [g for g in KV_GROUP_SIZES if head % g == 0]
        fix = f"use kv_group_size={max(fits)}" if fits else "use kv_bits=None"
        raise ValueError(
            f"{name!r} has attention heads of {head} values, which kv_group_size="
            f"{group_size} does not divide; {fix}"
        )
    _check_quantized_attention(model, head, kv_bits, group_size, name)


def _head_size(model: Any) -> int | None:
    """Values per attention head, from the model's shape (None where it does not say)."""
    # mlx-lm models keep their shape in .args; mlx-vlm models in .config.text_config.
    args = getattr(model, "args", None) or getattr(
        getattr(model, "config", None), "text_config", None
    )
    head = getattr(args, "head_dim", None)
    heads, hidden = getattr(args, "num_attention_heads", None), getattr(args, "hidden_size", None)
    if head is None and isinstance(heads, int) and isinstance(hidden, int) and heads:
        head = hidden // heads
    return head if isinstance(head, int) else None


def maybe_quantize(cache: list[Any], kv_bits: int | None, group_size: int, start: int) -> None:
    """Quantize, in place, the layers of ``cache`` holding ``start`` tokens or more.

    mlx-lm's ``maybe_quantize_kv_cache``: a ``KVCache`` becomes a ``QuantizedKVCache``;
    layers already quantized, and every layer when ``kv_bits`` is None, are left alone.
    """
    from mlx_lm.generate import maybe_quantize_kv_cache

    maybe_quantize_kv_cache(cache, start, group_size, kv_bits)


def layer_nbytes(layer: Any) -> int:
    """Bytes held by one cache layer.

    A quantized layer counts its packed values, scales and biases; an empty one, none.
    """
    from mlx_lm.models.cache import QuantizedKVCache

    if isinstance(layer, QuantizedKVCache):
        if layer.keys is None:
            return 0
        parts = (*layer.keys, *layer.values)
        return int(sum(x.nbytes for x in parts if x is not None))
    return int(getattr(layer, "nbytes", 0))


def check_batched_kv_options(kv_bits: int | None, quantized_kv_start: int) -> None:
    """Refuse what a shared batch cannot match: a cache kept unquantized for a while.

    Raises:
        ValueError: ``kv_bits`` with ``quantized_kv_start`` above 0.
    """
    if kv_bits is not None and quantized_kv_start:
        # One attention call serves every row, quantized or not: a row below its start
        # would be quantized early in a batch, and its reply would depend on the others.
        raise ValueError(
            f"BatchedEngine quantizes a request's KV cache from its first token, as every "
            f"row of a shared batch is quantized: with kv_bits={kv_bits}, "
            f"quantized_kv_start must be 0, got {quantized_kv_start}; use "
            "quantized_kv_start=0, or SimpleEngine (engine_type='simple') to keep the "
            "first tokens unquantized"
        )


def _check_quantized_attention(
    model: Any, head: int, kv_bits: int, group_size: int, name: str
) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    leaves = cast("list[tuple[str, Any]]", tree_flatten(model.parameters()))
    floats = [v.dtype for _, v in leaves if mx.issubdtype(v.dtype, mx.floating)]
    if not floats:
        return
    dtype = str(floats[0]).removeprefix("mlx.core.")
    error = quantized_attention_error(dtype, head, kv_bits, group_size)
    if error is not None:
        raise ValueError(
            f"{name!r} cannot use kv_bits={kv_bits} on this machine: MLX's CUDA backend has "
            f"no kernel for attention over a quantized KV cache ({dtype}, heads of {head} "
            f"values; MLX says: {error}); use kv_bits=None here"
        )
