"""Whether MLX's quantized matrix product agrees with the product over the dequantized
weights on this machine's default device, across activation dtypes, sizes and bits.
Prints one JSON line per case: the largest error relative to the reference's scale.
On CUDA each new case compiles its kernels first (about 12 s a case on an H100), so
the float32 cases, which come first, are the ones a short run sees."""

import itertools
import json

import mlx.core as mx
import numpy as np

rng = np.random.default_rng(0)
for dtype, k, m, bits, gs in itertools.product(
    (mx.float32, mx.bfloat16, mx.float16), (64, 128, 512), (1, 3, 16, 64), (4, 8), (32, 64)
):
    w = mx.array(rng.standard_normal((256, k)).astype(np.float32))
    x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(dtype)
    q, s, b = mx.quantize(w.astype(dtype), group_size=gs, bits=bits)
    got = mx.quantized_matmul(x, q, s, b, transpose=True, group_size=gs, bits=bits)
    wd = mx.dequantize(q, s, b, group_size=gs, bits=bits, stream=mx.cpu)
    ref = x.astype(mx.float32) @ wd.astype(mx.float32).T
    err = float(mx.abs(got.astype(mx.float32) - ref).max().item())
    scale = float(mx.abs(ref).max().item())
    print(
        json.dumps(
            {
                "dtype": str(dtype).split(".")[-1],
                "k": k,
                "m": m,
                "bits": bits,
                "group": gs,
                "rel_err": round(err / scale, 5),
            }
        ),
        flush=True,
    )
