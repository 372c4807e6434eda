"""Run a test's check in a process on MLX's own reference BLAS.

On Linux ``mlx_integrations`` preloads OpenBLAS (test processes run on it), whose
float32 kernels depend on the shape: the same row of ``x @ W.T`` rounds differently
with 16 rows than with 20 (0.3.21 on AVX-512, hidden 64: about 6e-7), so a step that
feeds several positions per row gives logits that differ from one-position steps in
the last bits, and greedy tokens stay equal only while no two top logits are that
close. The reference BLAS accumulates each output over K in order whatever the shape,
so there such equalities must hold bit for bit. The child runs on MLX's CPU device on a
GPU machine too: GPU kernels pick their tiling by shape as OpenBLAS does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def in_reference_blas(module: str, call: str) -> None:
    """Run ``call`` (an expression over the names of test module ``module``, e.g.
    ``"tests.engine.test_x"``) in a child process on the CPU with OpenBLAS off; fail
    with its error output if it raises."""
    root = Path(__file__).resolve().parents[2]
    code = (
        "from mlx_integrations.runtime import backend; assert backend._preloaded is None; "
        # Before mlx_lm makes its generation stream on the default device.
        "import mlx.core as mx; mx.set_default_device(mx.cpu); "
        f"from {module} import *; {call}"
    )
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "MLXI_BLAS": "off", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
