"""A check that the engine pool keys its engines by one engine option."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def assert_pool_keys_by(model: Path, option: str, value: Any, other: Any) -> None:
    """The same option value shares one engine; another value, or none, gets its own."""
    from mlx_integrations.engine import pool

    taken = [pool.acquire(model), pool.acquire(model, **{option: value})]
    try:
        taken.append(pool.acquire(model, **{option: value}))
        taken.append(pool.acquire(model, **{option: other}))
        assert taken[1] is not taken[0] and taken[2] is taken[1]
        assert taken[3] is not taken[1]
    finally:
        for eng in taken:
            pool.release(eng)
        pool.unload_idle()
