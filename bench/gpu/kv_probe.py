"""Which quantized KV caches MLX's backend can attend over: the probe behind ``kv_bits``.

mlx-lm's ``QuantizedKVCache`` hands attention a slice of its preallocated buffers, and
``quantized_scaled_dot_product_attention`` runs two ``mx.quantized_matmul`` calls on
it. For each activation dtype, bit width and (head size, group size), this fills such a
cache the way a request does (an 18-token prompt, then one decode step) and attends
over it: as the cache returns it ("sliced"), as a contiguous copy ("contiguous"), and,
for float32, with the cache and the queries in bfloat16 ("bf16"). Each case prints one
JSON line, with the error MLX raised if any, as it finishes::

    python3 bench/gpu/kv_probe.py            # about 40 cases
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mlx_integrations  # noqa: F401  (float32 precision before mlx.core)


def attend(dtype: Any, bits: int, head: int, group: int, layout: str) -> dict[str, Any]:
    """Prompt then one decode step over a quantized cache; the steps that ran."""
    import mlx.core as mx
    from mlx_lm.models.base import quantized_scaled_dot_product_attention
    from mlx_lm.models.cache import QuantizedKVCache

    heads, kv_heads = 4, 2
    store = mx.bfloat16 if layout == "bf16" else dtype
    cache = QuantizedKVCache(group_size=group, bits=bits)
    done = []
    for phase, length in (("prompt", 18), ("decode", 1)):
        q = mx.random.normal((1, heads, length, head)).astype(store)
        k = mx.random.normal((1, kv_heads, length, head)).astype(store)
        v = mx.random.normal((1, kv_heads, length, head)).astype(store)
        keys, values = cache.update_and_fetch(k, v)
        if layout == "contiguous":
            keys = tuple(mx.contiguous(x) for x in keys)
            values = tuple(mx.contiguous(x) for x in values)
        mask = "causal" if length > 1 else None
        out = quantized_scaled_dot_product_attention(
            q, keys, values, scale=head**-0.5, mask=mask, group_size=group, bits=bits
        )
        mx.eval(out.astype(dtype))
        done.append(phase)
    return {"ran": done}


def main() -> None:
    import mlx.core as mx

    print(json.dumps({"mlx": mx.__version__, "device": str(mx.default_device())}), flush=True)
    for dtype in (mx.float32, mx.bfloat16, mx.float16):
        layouts = ["sliced", "contiguous"] + (["bf16"] if dtype == mx.float32 else [])
        for bits in (8, 4):
            for head, group in ((64, 64), (32, 32), (128, 64)):
                for layout in layouts:
                    case = {"dtype": str(dtype), "bits": bits, "head": head, "group": group}
                    case["layout"] = layout
                    start = time.perf_counter()
                    try:
                        case |= {"ok": True} | attend(dtype, bits, head, group, layout)
                    except Exception as exc:  # each failure is a finding
                        case |= {"ok": False, "error": str(exc)[:240]}
                    case["s"] = round(time.perf_counter() - start, 2)
                    print(json.dumps(case), flush=True)


if __name__ == "__main__":
    main()
