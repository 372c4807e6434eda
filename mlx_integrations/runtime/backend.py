"""The MLX runtime as this machine offers it: BLAS preloading, float32 precision, caches that
may miss, backend facts."""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from typing import Any, TypedDict

# Names tried in order; the first one the dynamic loader finds wins.
_OPENBLAS_NAMES = ("libopenblas.so.0", "libopenblas.so", "libopenblasp-r0.so")

_preloaded: str | None = None

TF32_VARIABLE = "MLX_ENABLE_TF32"
"""MLX's switch for TF32 float32 matrix products (on by default where the GPU has them)."""


def preload_cpu_blas() -> str | None:
    """Load an optimized BLAS into the global symbol scope before MLX starts.

    MLX's Linux CPU wheel links a reference BLAS; float32 matmuls run about 30x faster
    when OpenBLAS provides ``cblas_sgemm`` instead. This only works before
    ``mlx.core`` is imported, so it runs when ``mlx_integrations`` is imported.
    Set ``MLXI_BLAS=off`` to skip it, or ``MLXI_BLAS=/path/libopenblas.so`` to choose.

    Returns:
        The library that was loaded, or None.
    """
    global _preloaded
    if _preloaded is not None:
        return _preloaded
    if not sys.platform.startswith("linux") or "mlx.core" in sys.modules:
        return None
    choice = os.environ.get("MLXI_BLAS", "")
    if choice.lower() in {"off", "0", "none"}:
        return None
    names = (choice,) if choice else _OPENBLAS_NAMES
    for name in names:
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        _preloaded = name
        return name
    return None


def keep_float32_precise() -> bool:
    """Keep float32 matrix products in full precision unless the user chose otherwise.

    MLX runs float32 matrix products in TF32 (a 10-bit mantissa) on GPUs that have it
    (NVIDIA since Ampere, Apple's M5), which moves embeddings by up to 2e-3 relative to
    the reference model. Models in bfloat16 or float16 are not affected. This sets
    ``MLX_ENABLE_TF32=0`` when the variable is unset, so it must run before MLX's
    first float32 product; ``mlx_integrations`` calls it when imported. Set
    ``MLX_ENABLE_TF32=1`` for TF32's speed.

    Returns:
        True when float32 products are asked to stay precise.
    """
    os.environ.setdefault(TF32_VARIABLE, "0")
    return os.environ[TF32_VARIABLE].strip() == "0"


CACHE_CHECK_VARIABLE = "MLX_ENABLE_CACHE_THRASHING_CHECK"
"""MLX's switch for failing on cache misses once its CUDA caches have missed too often."""


def let_caches_miss() -> bool:
    """Let MLX's CUDA caches miss without failing, unless the user chose otherwise.

    MLX's CUDA backend keeps least-recently-used caches of what it sets up once and
    reuses: CUDA graphs (keyed by the work's topology, 400 a stream), cuDNN attention
    plans (keyed by the exact shapes of queries, keys and mask, 256 a thread) and
    others. With its thrashing check, on by default, a cache that has missed more than
    twice its size in the life of its stream or thread raises on every later miss: a
    long-lived engine whose thread has set up 512 attention plans (new prompt lengths,
    batch sizes, key lengths, or shapes evicted and met again) would fail every request
    that needs one more. A miss costs only that set-up again. This sets
    ``MLX_ENABLE_CACHE_THRASHING_CHECK=0`` when the variable is unset; MLX reads it as
    it makes each cache (MLX's start for its first thread, a new stream, a thread's
    first attention), so it must run before MLX first runs on the GPU:
    ``mlx_integrations`` calls it when imported. Off CUDA the variable is not read.

    Returns:
        True when MLX's caches may miss without failing.
    """
    os.environ.setdefault(CACHE_CHECK_VARIABLE, "0")
    return not _cache_check_on()


def _cache_check_on() -> bool:
    """MLX's cache-thrashing check as MLX reads its variable: on unless set to 0 (or to
    something that is not a number)."""
    value = os.environ.get(CACHE_CHECK_VARIABLE, "1").strip()
    return value.isdigit() and int(value) != 0


class BackendInfo(TypedDict):
    """What ``mlxi doctor`` reports about MLX on this machine."""

    mlx_version: str
    mlx_lm_version: str
    backend: str
    """``metal``, ``cuda`` or ``cpu``: where MLX runs by default."""
    device: str
    gpu_name: str | None
    """The GPU's name as the driver gives it; None on the CPU backend."""
    gpu_memory_gb: float | None
    """The GPU's memory in GB (10**9 bytes), as MLX reads it; None when unknown."""
    gpu_arch: str | None
    """``sm_90`` on an H100 or H200, ``applegpu_g15s`` and the like on a Mac."""
    tf32: bool | None
    """Whether float32 matrix products run in TF32 (probed on the GPU); None on the CPU."""
    cache_check: bool | None
    """Whether MLX's CUDA caches raise once they have missed twice their size
    (``MLX_ENABLE_CACHE_THRASHING_CHECK``, see :func:`let_caches_miss`); None off CUDA."""
    metal_available: bool
    cuda_available: bool
    cpu_blas: str | None


def backend_info() -> BackendInfo:
    """Describe the MLX install: versions, backend, GPU, TF32 state, BLAS."""
    from importlib.metadata import version

    import mlx.core as mx

    mlx_lm_version = version("mlx-lm")

    metal = bool(mx.metal.is_available())
    cuda = bool(getattr(mx, "cuda", None) and mx.cuda.is_available())
    backend = "metal" if metal else "cuda" if cuda else "cpu"
    gpu: dict[str, Any] = dict(mx.device_info(mx.gpu)) if metal or cuda else {}
    memory = gpu.get("total_memory", gpu.get("memory_size"))
    return BackendInfo(
        mlx_version=version("mlx"),
        mlx_lm_version=mlx_lm_version,
        backend=backend,
        device=str(mx.default_device()),
        gpu_name=str(gpu["device_name"]) if "device_name" in gpu else None,
        gpu_memory_gb=round(int(memory) / 1e9, 1) if isinstance(memory, int) else None,
        gpu_arch=str(gpu["architecture"]) if "architecture" in gpu else None,
        tf32=_tf32_in_use() if metal or cuda else None,
        cache_check=_cache_check_on() if cuda else None,
        metal_available=metal,
        cuda_available=cuda,
        cpu_blas=_preloaded,
    )


def _tf32_in_use() -> bool:
    """Multiply by the identity on the GPU: TF32 rounds 1 + 2**-12 down to 1."""
    import mlx.core as mx

    n = 256  # large enough for the GPU's general matrix product, not a vector kernel
    a = mx.full((n, n), 1.0 + 2.0**-12, dtype=mx.float32)
    product = mx.matmul(a, mx.eye(n, dtype=mx.float32), stream=mx.gpu)
    return bool(mx.all(product == 1.0).item())


@functools.cache
def quantized_attention_error(dtype: str, head_dim: int, bits: int, group_size: int) -> str | None:
    """MLX's error when this backend cannot attend over a quantized KV cache, else None.

    A quantized KV cache (``kv_bits``) is mlx-lm's ``QuantizedKVCache``, attended over
    with two ``mx.quantized_matmul`` calls. MLX's CUDA backend (0.32.4) has no kernel
    for them at the shapes such a cache gives (every head size, dtype and bit width
    tried on an H200 failed), so on CUDA this tries a prompt and
    one decode step with the model's ``dtype`` (an ``mlx.core`` dtype name), head size
    and options; Metal and the CPU have every kernel and are not probed. Run it on the
    thread that owns the model: it builds MLX arrays.
    """
    import mlx.core as mx

    if not (getattr(mx, "cuda", None) and mx.cuda.is_available()):
        return None
    from mlx_lm.models.base import quantized_scaled_dot_product_attention
    from mlx_lm.models.cache import QuantizedKVCache

    kind = getattr(mx, dtype)
    cache = QuantizedKVCache(group_size=group_size, bits=bits)
    try:
        for length in (18, 1):  # two query heads share one KV head, as in most models
            queries = mx.zeros((1, 2, length, head_dim), dtype=kind)
            keys, values = cache.update_and_fetch(queries[:, :1], queries[:, :1])
            mask: Any = "causal" if length > 1 else None
            mx.eval(
                quantized_scaled_dot_product_attention(
                    queries, keys, values, scale=1.0, mask=mask, group_size=group_size, bits=bits
                )
            )
    except RuntimeError as exc:
        return str(exc)
    return None
