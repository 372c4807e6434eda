"""Times mlx-lm's batched prefill calls and decode steps (the engine runs them too).

``StepTracer.install()`` wraps ``PromptProcessingBatch.prompt`` and
``GenerationBatch._step`` of ``mlx_lm.generate`` in the process; ``take()`` returns
the events since the last take: (kind, rows, key length, ms, submit ms, wait ms, CPU
ms). A decode step's ms are split further: ``mx.async_eval`` (MLX encoding and
launching the next step's kernels, on the calling thread) is its submit time,
``mx.eval`` of the current tokens (waiting for the GPU to finish the step before) its
wait time, and the rest is Python building the step's graph; CPU ms are the stepping
thread's CPU time (near the wall time where the host is the bottleneck). ``split``
divides a run's wall time into those calls and the rest: the rest is the Python around
them (mlx-lm's loop, and the engine's own work per step where an engine ran them).
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

# kind ("prefill" or "decode"), rows, key length, ms, and of those ms: mx.async_eval's
# and mx.eval's; then the calling thread's CPU ms
Event = tuple[str, int, int, float, float, float, float]


class TimedMLX:
    """``mlx.core`` as ``mlx_lm.generate`` sees it, with its two evals timed for the
    thread's current step (``timings``: [async_eval ms, eval ms], or None)."""

    def __init__(self, mx: Any) -> None:
        self._mx = mx
        self._local = threading.local()

    @property
    def timings(self) -> list[float] | None:
        return getattr(self._local, "timings", None)

    @timings.setter
    def timings(self, value: list[float] | None) -> None:
        self._local.timings = value

    def _timed(self, slot: int, fn: Any, *args: Any) -> Any:
        began = time.perf_counter()
        try:
            return fn(*args)
        finally:
            timings = self.timings
            if timings is not None:
                timings[slot] += (time.perf_counter() - began) * 1000

    def async_eval(self, *args: Any) -> Any:
        return self._timed(0, self._mx.async_eval, *args)

    def eval(self, *args: Any) -> Any:
        return self._timed(1, self._mx.eval, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mx, name)


class StepTracer:
    """Records every batched prefill call and decode step, with rows and key length."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._undo: tuple[Any, ...] | None = None
        self._installed: tuple[Any, ...] = ()

    def install(self) -> None:
        import importlib

        if self._undo is not None:
            raise RuntimeError("this tracer is installed already")
        g: Any = importlib.import_module("mlx_lm.generate")
        tracer = self
        undo = (g.mx, g.PromptProcessingBatch.prompt, g.GenerationBatch._step)
        timed_mx = TimedMLX(g.mx)

        def timed(kind: str, fn: Any) -> Any:
            def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
                timings = [0.0, 0.0]
                timed_mx.timings = timings
                began, cpu = time.perf_counter(), time.thread_time()
                try:
                    return fn(self, *args, **kwargs)
                finally:
                    ms = (time.perf_counter() - began) * 1000
                    cpu_ms = (time.thread_time() - cpu) * 1000
                    timed_mx.timings = None
                    cache = getattr(self, "prompt_cache", None) or []
                    length = getattr(cache[0], "_idx", -1) if cache else -1
                    tracer.events.append(
                        (kind, len(self.uids), int(length), ms, timings[0], timings[1], cpu_ms)
                    )

            return wrapper

        g.mx = timed_mx
        g.PromptProcessingBatch.prompt = timed("prefill", g.PromptProcessingBatch.prompt)
        g.GenerationBatch._step = timed("decode", g.GenerationBatch._step)
        self._installed = (g.mx, g.PromptProcessingBatch.prompt, g.GenerationBatch._step)
        self._undo = undo

    def remove(self) -> None:
        """Give mlx-lm back what :meth:`install` wrapped (wrappers installed after this
        tracer's must be removed first)."""
        import importlib

        if self._undo is None:
            return
        g: Any = importlib.import_module("mlx_lm.generate")
        if (g.mx, g.PromptProcessingBatch.prompt, g.GenerationBatch._step) != self._installed:
            raise RuntimeError("mlx-lm was wrapped again after this tracer: remove that first")
        g.mx, g.PromptProcessingBatch.prompt, g.GenerationBatch._step = self._undo
        self._undo = None

    def take(self) -> list[Event]:
        events, self.events = self.events, []
        return events


MEDIANS = (
    "step_ms_median",
    "build_ms_median",
    "submit_ms_median",
    "wait_ms_median",
    "cpu_ms_median",
    "key_length_median",
    "rest_ms_per_step",
    "prefill_ms_total",
)
"""The keys of :func:`split` that a bench compares across runs (their median)."""


def split(seconds: float, events: list[Event]) -> dict[str, Any]:
    """A run's wall time: prefill calls, decode steps, and the rest (ms a decode step)."""
    steps = [e for e in events if e[0] == "decode" and e[1] > 0]
    decode = [e[3] for e in steps]
    prefill = [e[3] for e in events if e[0] == "prefill" and e[1] > 0]
    rest = seconds * 1000 - sum(decode) - sum(prefill)

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), 3) if values else None

    return {
        "steps": len(decode),
        "step_ms_median": median(decode),
        # a decode step's Python (building its graph), MLX launching it, the GPU wait
        "build_ms_median": median([e[3] - e[4] - e[5] for e in steps]),
        "submit_ms_median": median([e[4] for e in steps]),
        "wait_ms_median": median([e[5] for e in steps]),
        "cpu_ms_median": median([e[6] for e in steps]),  # the stepping thread's CPU time
        "key_length_median": median([e[2] for e in steps]),  # the cache's, padding included
        "step_ms_total": round(sum(decode), 1),
        "prefill_calls": len(prefill),
        "prefill_ms_total": round(sum(prefill), 1),
        "rest_ms_total": round(rest, 1),
        "rest_ms_per_step": round(rest / len(decode), 3) if decode else None,
    }
