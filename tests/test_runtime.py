"""The MLX runtime facts ``mlxi doctor`` reports, and float32 precision on GPUs."""

from __future__ import annotations

import os
import subprocess
import sys

import mlx_integrations  # noqa: F401  (BLAS preload before mlx.core)
from mlx_integrations.runtime import CACHE_CHECK_VARIABLE, TF32_VARIABLE, backend_info


def _after_import(env: dict[str, str], name: str = TF32_VARIABLE) -> str:
    code = f"import os, mlx_integrations; print(os.environ[{name!r}])"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_import_keeps_float32_products_out_of_tf32_unless_the_user_chose():
    env = {k: v for k, v in os.environ.items() if k != TF32_VARIABLE}
    assert _after_import(env) == "0"
    assert _after_import(env | {TF32_VARIABLE: "1"}) == "1"


def test_import_lets_mlx_s_cuda_caches_miss_without_failing_unless_the_user_chose():
    # tests/engine/test_cuda_caches.py shows what the default spares on CUDA.
    env = {k: v for k, v in os.environ.items() if k != CACHE_CHECK_VARIABLE}
    assert _after_import(env, CACHE_CHECK_VARIABLE) == "0"
    assert _after_import(env | {CACHE_CHECK_VARIABLE: "1"}, CACHE_CHECK_VARIABLE) == "1"


def test_backend_info_names_the_backend_and_the_gpu_when_there_is_one():
    info = backend_info()
    assert info["backend"] in {"cpu", "metal", "cuda"}
    # The suite runs with the package's default: MLX's CUDA caches may miss.
    assert info["cache_check"] is (False if info["backend"] == "cuda" else None)
    if info["backend"] == "cpu":
        assert info["gpu_name"] is None and info["tf32"] is None
    else:
        assert info["gpu_name"] and info["gpu_memory_gb"] and info["gpu_memory_gb"] > 0
        # The suite runs with the package's default: full float32 precision.
        assert info["tf32"] is (os.environ.get(TF32_VARIABLE) != "0")
