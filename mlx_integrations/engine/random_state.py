"""MLX's global random state, kept usable after a failed decode step."""

from __future__ import annotations

import os


def repair_random_state() -> bool:
    """Reseed MLX's global random state if a failed step left it unusable.

    mlx-lm compiles its sampling filters with ``outputs=mx.random.state``: one that
    raises while traced (``top_k`` out of range, a failing custom processor inside
    ``mx.compile``) leaves a placeholder there, and every later sampled request would
    fail with "Attempting to eval an array without a primitive". Called after every
    failed decode step, on the owner thread.

    Returns:
        True if the state was broken and has been reseeded.
    """
    import mlx.core as mx

    try:
        mx.eval(mx.random.state)
    except Exception:  # a placeholder array: start a fresh random sequence
        mx.random.seed(int.from_bytes(os.urandom(7), "little"))
        return True
    return False
