"""Goodness of fit of sampled replies to a model's exact distribution (``top_k`` sampling).

The exact probabilities come from the model's logits, filtered and scaled as mlx-lm's
sampler does (``top_k``, then ``1 / temperature``); the sampled replies are compared with
them by Pearson's chi-square statistic.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from typing import Any


def next_token_probs(
    model: Any, tokens: Sequence[int], top_k: int, temperature: float = 1.0
) -> dict[int, float]:
    """The probability of each token the sampler can pick after ``tokens``."""
    import mlx.core as mx
    from mlx_lm.sample_utils import apply_top_k

    logits = model(mx.array(tokens)[None])[:, -1, :]
    logprobs = apply_top_k(logits - mx.logsumexp(logits, axis=-1, keepdims=True), top_k)
    probs = mx.softmax(logprobs * (1.0 / temperature), axis=-1)[0].tolist()
    return {t: p for t, p in enumerate(probs) if p > 0}


def sequence_probs(
    model: Any, prompt: Sequence[int], length: int, top_k: int, temperature: float = 1.0
) -> dict[tuple[int, ...], float]:
    """The probability of each sequence of ``length`` tokens sampled after ``prompt``."""
    probs: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(length):
        probs = {
            (*seq, t): p * q
            for seq, p in probs.items()
            for t, q in next_token_probs(model, [*prompt, *seq], top_k, temperature).items()
        }
    return probs


def chi_square(counts: Counter, expected: Mapping[Hashable, float], n: int) -> tuple[float, int]:
    """Pearson's statistic, cells expected below 5 pooled; (statistic, degrees of freedom)."""
    cells: list[tuple[float, int]] = []
    pooled_p, pooled_count = 0.0, 0
    for key, p in expected.items():
        if p * n >= 5:
            cells.append((p * n, counts[key]))
        else:
            pooled_p, pooled_count = pooled_p + p, pooled_count + counts[key]
    pooled_count += sum(c for k, c in counts.items() if k not in expected)
    if pooled_p * n >= 1 or pooled_count:
        cells.append((max(pooled_p * n, 1.0), pooled_count))
    return sum((o - e) ** 2 / e for e, o in cells), len(cells) - 1


def bound(df: int) -> float:
    """About seven standard deviations above the mean of a chi-square of ``df`` degrees."""
    return df + 7 * math.sqrt(2 * df)
