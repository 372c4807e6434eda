"""Engines a GPU bench is done with, kept from lending their owner threads to the next.

A stopped engine's owner thread serves the next engine made (the package keeps owner
threads for reuse), and MLX keeps CUDA graphs and attention plans per thread: an engine
of a later part, concurrency or variant would inherit what another met before, and its
figures would depend on the order the bench ran in. :func:`retire` frees the model and
keeps the thread to the engine until the process ends; the package ends kept threads at
interpreter exit.
"""

from __future__ import annotations

import logging
from typing import Any

_RETIRED: list[Any] = []


def retire(engine: Any, loop: Any) -> None:
    """Unload ``engine``'s model (weights, caches, MLX's buffer pool); keep its thread.

    An engine still serving (a part that failed with requests in flight) is stopped as
    before, on ``loop``: its requests are aborted and its thread may serve another
    engine, but that part has failed anyway. A kept thread also keeps what MLX set up
    on it (graphs, attention plans) until the process ends.
    """
    if engine.unload_if_idle() or not engine.is_loaded:
        _RETIRED.append(engine)
    else:
        loop.run_until_complete(engine.stop())


def side_thread(name: str) -> Any:
    """A thread of its own for MLX work beside the engines (never an engine's owner),
    kept until the process ends and ended at interpreter exit as the package ends the
    owner threads it keeps (its MLX streams released first)."""
    from concurrent.futures import ThreadPoolExecutor

    from mlx_integrations.runtime.owner import at_thread_exit, release_thread_streams

    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def end() -> None:  # its streams released before any other thread's go (one at a time)
        executor.submit(release_thread_streams)
        executor.shutdown(wait=True)

    at_thread_exit(end)
    _RETIRED.append(executor)
    return executor


# Probes: options a bench variant may name beside the engine's own (never engine options).
PROBES = ("warm_elsewhere", "warm_batch_on_owner", "warm_groups_on_owner", "warm_growth_on_owner")
"""Where the load's warm-up runs: one at most."""
BATCH_PROBES = (
    "warm_batch_on_owner",
    "warm_groups_on_owner",
    "warm_growth_on_owner",
    "largest_first",
)
"""Probes of a ``BatchedEngine``'s own warm-up: on another engine they would do nothing."""


def probed_engine(cls: Any, path: Any, options: dict[str, Any], **fixed: Any) -> Any:
    """``cls(path, **fixed, **options)``, with the warm-up probes ``options`` may name.

    ``"warm_elsewhere": true`` runs the load's whole warm-up on a kept thread of its own
    rather than the owner thread that then serves (MLX keeps CUDA graphs and attention
    plans per thread); ``"warm_batch_on_owner": true`` runs a ``BatchedEngine``'s batch
    part on the owner thread, as the package did before it moved it aside;
    ``"warm_groups_on_owner": true`` splits that part: the groups of requests arriving
    together (their padded prefills, what a first batch's first tokens wait for) on the
    owner thread, the rest (a batch decoded at every size) aside;
    ``"warm_growth_on_owner": true`` the other way round: the batch part without its
    groups (a batch prefilled, joined, grown to every size and shrinking) on the owner
    thread, then the groups aside. With any of them or
    none, ``"largest_first": true`` first decodes a full batch (``max_num_seqs`` rows)
    on the owner thread (:func:`full_batch`). A probe that cannot apply to ``cls`` (the
    batch probes on a ``SimpleEngine``), or two placements, raise ``ValueError``.
    """
    from mlx_integrations.engine import BatchedEngine

    options = dict(options)
    chosen = [probe for probe in PROBES if options.pop(probe, False)]
    if len(chosen) > 1:
        raise ValueError(f"{' and '.join(chosen)} are {len(chosen)} probes: give one")
    largest_first = options.pop("largest_first", False)
    batch_only = [p for p in chosen if p in BATCH_PROBES]
    if largest_first:
        batch_only.append("largest_first")
    if batch_only and not issubclass(cls, BatchedEngine):
        raise ValueError(
            f"{', '.join(batch_only)}: a probe of BatchedEngine's warm-up, not {cls.__name__}'s"
        )
    engine = cls(path, **fixed, **options)
    warm_up = engine._warm_up
    if chosen == ["warm_elsewhere"]:
        # Its errors reach the owner thread's load through the future, as they would.
        engine._warm_up = lambda: side_thread("warm-elsewhere").submit(warm_up).result()
    elif chosen == ["warm_batch_on_owner"]:  # as before run_aside
        engine._warm_up = lambda: as_side_thread(warm_up)
    elif chosen == ["warm_groups_on_owner"]:
        engine._warm_up = lambda: groups_on_owner(engine, warm_up)
    elif chosen == ["warm_growth_on_owner"]:
        engine._warm_up = lambda: growth_on_owner(engine, warm_up)
    if largest_first:  # on the owner thread, whichever thread the warm-up then takes
        placed = engine._warm_up

        def first_the_full_batch() -> None:
            full_batch(engine)
            placed()

        engine._warm_up = first_the_full_batch
    return engine


def groups_on_owner(engine: Any, warm_up: Any) -> None:
    """``engine``'s load warm-up with the batch part's groups taken out of it (aside)
    and met on the calling thread, the owner's, after it."""
    import functools

    from mlx_integrations.engine.batched import engine as batched

    parts = _load_with(engine, warm_up, functools.partial(batched.warm_batch, groups=False))
    if parts is not None:
        engine.warmup_seconds += _timed_groups(parts, empty_cache=False)


def growth_on_owner(engine: Any, warm_up: Any) -> None:
    """``engine``'s load warm-up with the batch part split, in the package's order: the
    part without its groups (two rows of unequal length prefilled together, a row
    joining a running batch, the batch growing a row a step to every size and rows
    ending) on the calling thread, the owner's; then the groups aside."""
    import functools

    from mlx_integrations.engine.batched import engine as batched
    from mlx_integrations.runtime.owner import run_aside

    def later(*args: Any, **kwargs: Any) -> float:  # the load's batch part, met below
        return 0.0

    whole = batched.warm_batch
    parts = _load_with(engine, warm_up, later)
    if parts is not None:
        engine.warmup_seconds += whole(*parts, groups=False)
        engine.warmup_seconds += run_aside(
            functools.partial(_timed_groups, parts, empty_cache=True)
        )


def _load_with(engine: Any, warm_up: Any, batch_part: Any) -> tuple[Any, int, Any, int] | None:
    """Run the load's ``warm_up`` with ``batch_part`` standing in for the package's
    ``warm_batch`` (given back after, whatever happens); ``warm_batch``'s arguments, or
    ``None`` where the load warmed nothing up (``warmup_shapes`` off)."""
    from mlx_integrations.engine.batched import engine as batched

    whole = batched.warm_batch
    batched.warm_batch = batch_part  # engines load one at a time
    try:
        warm_up()
    finally:
        batched.warm_batch = whole
    if engine.warmup_seconds is None:
        return None
    return (engine._model, engine._prefill_step_size, engine._shapes, engine._max_num_seqs)


def _timed_groups(parts: tuple[Any, int, Any, int], empty_cache: bool) -> float:
    """``warm_groups(*parts)``'s seconds; a failure is logged, as in ``warm_batch`` (the
    first batch then meets them itself). ``empty_cache``: MLX's buffer cache emptied
    after, as ``warm_batch`` ends."""
    import time

    import mlx.core as mx

    from mlx_integrations.engine.batched import warmup

    began = time.perf_counter()
    try:
        warmup.warm_groups(*parts)
    except Exception:
        logging.getLogger(__name__).warning("The groups' warm-up failed", exc_info=True)
    finally:
        if empty_cache:
            mx.clear_cache()
    return time.perf_counter() - began


def as_side_thread(fn: Any) -> None:
    """Run ``fn`` with the calling thread taken for the package's side thread, so that
    what ``fn`` hands to ``run_aside`` runs here."""
    from mlx_integrations.runtime import owner

    owner._here.aside = True
    try:
        fn()
    finally:
        owner._here.aside = False


def full_batch(engine: Any, tokens: int = 4) -> None:
    """Decode a batch of ``engine``'s ``max_num_seqs`` rows on the calling thread, as its
    generator would: MLX's CUDA backend keys the graphs it keeps per thread by their
    nodes' kinds and edges only, and updates a kept graph to each later one of the same
    key, so the first batch size a thread decodes makes the graphs later sizes reuse."""
    from mlx_lm.generate import BatchGenerator

    from mlx_integrations.engine.batched.arrivals import SPARE

    rows = engine._max_num_seqs
    generator = BatchGenerator(
        engine._model,
        completion_batch_size=rows + SPARE,
        prefill_batch_size=rows + SPARE,
        prefill_step_size=engine._prefill_step_size,
    )
    try:
        generator.insert([[0] * 8] * rows, max_tokens=[tokens] * rows)
        ended = 0
        for _ in range(4 * tokens + 8):
            _, responses = generator.next()
            ended += sum(r.finish_reason is not None for r in responses)
            if ended == rows:
                return
        raise RuntimeError(f"the full batch of {rows} rows did not end")
    finally:
        generator.close()
