"""Local MLX models as first-class LangChain and LlamaIndex chat models.

Importing this package is cheap: it loads no MLX weights, no framework, and no torch.
On Linux it preloads a system OpenBLAS (when one is installed) before MLX is first
imported, since the CPU wheel of MLX otherwise uses a slow reference BLAS, and keeps
float32 matrix products out of TF32 on GPUs unless ``MLX_ENABLE_TF32`` says otherwise
(:func:`mlx_integrations.runtime.keep_float32_precise`), and lets MLX's CUDA caches miss
without failing a long-lived process unless ``MLX_ENABLE_CACHE_THRASHING_CHECK`` says
otherwise (:func:`mlx_integrations.runtime.let_caches_miss`).
"""

from mlx_integrations.runtime import keep_float32_precise, let_caches_miss, preload_cpu_blas

__version__ = "0.1.0"
__all__ = ["__version__"]

preload_cpu_blas()
keep_float32_precise()
let_caches_miss()
