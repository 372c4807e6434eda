"""A small batch at load, so that the first batch a process serves finds its kernels.

A batch runs kernels a request alone never does: attention under the mask of
left-padded rows, in its prefill and at every decode step, and the batch cache's own
operations (merging a joining row's cache, dropping rows that end). On CUDA, MLX
compiles such kernels the first time a process meets them (10 s on an H100 for
mlx-lm's batch on a 0.5B model, before any cache on disk holds them), and whichever
request first runs in a batch would wait for it. :func:`warm_batch` meets them while
the model loads, on the owner thread, where the engine's batches run.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from mlx_integrations.engine.batched.solo import prefill_joining
from mlx_integrations.engine.decoding import PrefillShapes

logger = logging.getLogger(__name__)

STEPS = 64
"""Generator steps after which the warm-up gives up (it needs about ten)."""


def warm_batch(model: Any, prefill_step_size: int, shapes: PrefillShapes) -> float:
    """Run one small batch through mlx-lm's ``BatchGenerator``, as the engine runs one.

    Two rows of unequal length are prefilled together (left padding: the masked
    attention of a batch's prefill and decode steps); once they decode, a third joins
    with a KV cache prefilled alone and padded as the engine pads a lone newcomer (the
    merge into a running batch); the rows end at different steps (the batch shrinking).

    Returns:
        The seconds it took.
    """
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator

    began = time.perf_counter()
    generator = BatchGenerator(
        model,
        completion_batch_size=3,
        prefill_batch_size=3,
        prefill_step_size=prefill_step_size,
    )
    try:
        generator.insert([[0] * 24, [0] * 17], max_tokens=[6, 3])
        rows, joined = 2, False
        for _ in range(STEPS):
            _, responses = generator.next()
            rows -= sum(r.finish_reason is not None for r in responses)
            if responses and not joined:
                joined, rows = True, rows + 1
                tokens = [0] * 12
                cache, fed = prefill_joining(model, tokens, 0, None, shapes)
                generator.insert(
                    [tokens[fed:]],
                    max_tokens=[4],
                    caches=None if cache is None else [cache],
                    all_tokens=[tokens[:fed]],
                )
            if joined and rows == 0:
                break
    finally:
        generator.close()
        mx.clear_cache()
    seconds = time.perf_counter() - began
    logger.info("Met the batch's kernels in %.2f s", seconds)
    return seconds
