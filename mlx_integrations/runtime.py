"""The MLX runtime as this machine offers it: BLAS preloading and backend facts."""

from __future__ import annotations

import ctypes
import os
import sys
from typing import TypedDict

# Names tried in order; the first one the dynamic loader finds wins.
_OPENBLAS_NAMES = ("libopenblas.so.0", "libopenblas.so", "libopenblasp-r0.so")

_preloaded: str | None = None


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


class BackendInfo(TypedDict):
    """What ``mlxi doctor`` reports about MLX on this machine."""

    mlx_version: str
    mlx_lm_version: str
    backend: str
    device: str
    metal_available: bool
    cuda_available: bool
    cpu_blas: str | None


def backend_info() -> BackendInfo:
    """Describe the MLX install: versions, backend, default device, BLAS."""
    from importlib.metadata import version

    import mlx.core as mx

    mlx_lm_version = version("mlx-lm")

    metal = bool(mx.metal.is_available())
    cuda = bool(getattr(mx, "cuda", None) and mx.cuda.is_available())
    backend = "metal" if metal else "cuda" if cuda else "cpu"
    device = mx.default_device()
    return BackendInfo(
        mlx_version=version("mlx"),
        mlx_lm_version=mlx_lm_version,
        backend=backend,
        device=str(device),
        metal_available=metal,
        cuda_available=cuda,
        cpu_blas=_preloaded,
    )
