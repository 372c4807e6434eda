"""A small batch at load, so that the first batch a process serves finds its kernels.

A batch runs kernels a request alone never does: attention under the mask of
left-padded rows, in its prefill and at every decode step, and the batch cache's own
operations (merging a joining row's cache, dropping rows that end). On CUDA, MLX
compiles such kernels the first time a process meets them (10 s on an H100 for
mlx-lm's batch on a 0.5B model, before any cache on disk holds them), and whichever
request first runs in a batch would wait for it. :func:`warm_batch` meets them while
the model loads. The engine runs it on the process's side thread
(:func:`~mlx_integrations.runtime.owner.run_aside`), not on the owner thread where its
batches run: the kernels it compiles serve every thread, and the owner thread keeps
none of the per-thread state that, met there, slowed its later decode steps on CUDA.
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

GROUP_TOKENS = 256
"""A full batch of requests arriving together is met at the buckets up to this length:
short prompts, whose prefill costs less than its set-up on CUDA."""


def warm_batch(
    model: Any, prefill_step_size: int, shapes: PrefillShapes, rows: int, groups: bool = True
) -> float:
    """Run small batches through mlx-lm's ``BatchGenerator``, as the engine runs them.

    Two rows of unequal length are prefilled together (left padding: the masked
    attention of a batch's prefill and decode steps); once they decode, a third joins
    with a KV cache prefilled alone and padded as the engine pads a lone newcomer (the
    merge into a running batch); the rows end at different steps (the batch shrinking).
    Then a batch grows by one joining row a step up to ``rows`` (the engine's
    ``max_num_seqs``), so every batch size the engine can run has decoded once. Where
    pieces are padded, groups of requests arriving together are prefilled at the
    buckets up to :data:`GROUP_TOKENS` and at each row count the engine pads a group to,
    with the spare placeholder row (:func:`warm_groups`; left out with ``groups=False``).

    A failure (a cache type that cannot join a batch, say) is logged and the load goes
    on: the warm-up only moves work earlier.

    Returns:
        The seconds it took.
    """
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator

    began = time.perf_counter()
    generator = BatchGenerator(
        model,
        completion_batch_size=max(rows, 3),
        prefill_batch_size=max(rows, 3),
        prefill_step_size=prefill_step_size,
    )
    try:
        if rows >= 2:
            generator.insert([[0] * 24, [0] * 17], max_tokens=[6, 3])
            third = [(1, [0] * 12, 4)] if rows >= 3 else []
            _run(generator, 2, third, model, shapes)
        # One row joins at each step: row i decodes until the batch holds ``rows``. A row
        # prefilled alone joins at once; one the generator prefills takes a step or two
        # more, so without padded pieces the rows decode for longer.
        extra = 1 if shapes.buckets else rows + 1
        joining = [(i, [0] * (8 + i % 8), rows - i + extra) for i in range(1, rows)]
        generator.insert([[0] * 8], max_tokens=[rows + extra])
        _run(generator, 1, joining, model, shapes)
        generator.close()
        if groups:
            warm_groups(model, prefill_step_size, shapes, rows)
    except Exception:  # the first batch served then meets its kernels itself
        logger.warning("The batch warm-up failed; the model loads without it", exc_info=True)
    finally:
        generator.close()
        mx.clear_cache()
    seconds = time.perf_counter() - began
    logger.info("Met the batch's kernels in %.2f s", seconds)
    return seconds


def _run(
    generator: Any,
    rows: int,
    joining: list[tuple[int, list[int], int]],
    model: Any,
    shapes: PrefillShapes,
) -> None:
    """Step ``generator`` (holding ``rows`` rows) until every row has ended; each of
    ``joining`` (step, prompt, max_tokens) is prefilled alone and joins after that many
    steps that returned tokens."""
    steps = 0
    for _ in range(STEPS + len(joining) * 2):
        _, responses = generator.next()
        rows -= sum(r.finish_reason is not None for r in responses)
        steps += bool(responses)
        while joining and joining[0][0] <= steps:
            _, tokens, max_tokens = joining.pop(0)
            cache, fed = prefill_joining(model, tokens, 0, None, shapes)
            generator.insert(
                [tokens[fed:]],
                max_tokens=[max_tokens],
                caches=None if cache is None else [cache],
                all_tokens=[tokens[:fed]],
            )
            rows += 1
        if not joining and rows == 0:
            return


def warm_groups(model: Any, prefill_step_size: int, shapes: PrefillShapes, rows: int) -> None:
    """Prefill requests arriving together as the engine does, at each bucket up to
    :data:`GROUP_TOKENS` and each row count a group's prefill takes in an empty batch of
    ``rows`` places and the spare (:func:`group_row_counts`; on CUDA a new row count is a
    new shape, whose kernels are then compiled): the rows a token shorter
    than the bucket (padded at their end by mlx-lm, as real prompts are) and a
    placeholder a bucket long, taken out after the prefill; then the rows decode two
    tokens."""
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.models.cache import make_prompt_cache

    from mlx_integrations.engine.batched.arrivals import (
        PLACEHOLDER,
        SPARE,
        drop_placeholders,
        group_row_counts,
    )

    if rows < 2 or not shapes.pads(make_prompt_cache(model)):  # no group, or none padded
        return
    places = rows + SPARE
    # A row reaches its length and two tokens more (mlx-lm computes a step ahead).
    limit = GROUP_TOKENS if shapes.positions is None else min(GROUP_TOKENS, shapes.positions - 3)
    for count in group_row_counts(places):
        for size in (b for b in shapes.buckets if b <= limit):
            generator = BatchGenerator(
                model,
                completion_batch_size=places,
                prefill_batch_size=places,
                prefill_step_size=prefill_step_size,
            )
            try:
                # A prompt's last token is held back for its first step: the
                # placeholder's ``size`` tokens set the prefill's length.
                real = count - 1
                prompts = [[PLACEHOLDER] * size] * real + [[PLACEHOLDER] * (size + 1)]
                uids = generator.insert(prompts, max_tokens=[2] * count)
                generator.next()  # the group's prefill
                drop_placeholders(generator, uids[real:])  # as the engine takes them out
                _run(generator, real, [], model, shapes)
            finally:
                generator.close()
