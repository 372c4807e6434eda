"""MLX as this package runs it: the backend's setup, owner threads, and the sync bridge.

- :mod:`.backend`: BLAS preloading on Linux, float32 kept out of TF32, MLX's CUDA caches
  left to miss without failing, backend facts;
- :mod:`.owner`: the one thread per model that loads it and runs every MLX step;
- :mod:`.sync`: driving any async engine from synchronous code;
- :mod:`.memory`: sizes, durations and the device's memory (``MLXI_MAX_MEMORY``,
  ``keep_alive``);
- :mod:`.residency` and :mod:`.residency_manager`: which models stay loaded in the
  process (keep-alive, the memory budget, pinning, admission of requests).

This is the floor under the engines and the embeddings: it knows no model and imports
nothing else of the package. Importing it imports no MLX.
"""

from mlx_integrations.runtime.backend import (
    CACHE_CHECK_VARIABLE,
    TF32_VARIABLE,
    BackendInfo,
    backend_info,
    keep_float32_precise,
    let_caches_miss,
    preload_cpu_blas,
    quantized_attention_error,
)

__all__ = [
    "CACHE_CHECK_VARIABLE",
    "TF32_VARIABLE",
    "BackendInfo",
    "backend_info",
    "keep_float32_precise",
    "let_caches_miss",
    "preload_cpu_blas",
    "quantized_attention_error",
]
