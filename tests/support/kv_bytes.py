"""What a quantized KV cache (``kv_bits``) should hold, next to an unquantized one."""

from __future__ import annotations

import pytest


def check_quantized_shares(held: dict[int | None, float], group_size: int = 64) -> None:
    """``held[bits] / held[None]`` for 8 and 4 bits, with float32 values: per group of
    ``group_size`` values, the packed values plus a float32 scale and bias."""
    for bits in (8, 4):
        packed = group_size * bits // 8
        expected = (packed + 8) / (group_size * 4)
        assert held[bits] / held[None] == pytest.approx(expected), bits
