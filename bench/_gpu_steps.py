"""Times mlx-lm's batched prefill calls and decode steps (the engine runs them too).

``StepTracer.install()`` wraps ``PromptProcessingBatch.prompt`` and
``GenerationBatch._step`` of ``mlx_lm.generate`` in the process; ``take()`` returns
the events since the last take: (kind, rows, key length, ms). ``split`` divides a
run's wall time into those calls and the rest: the rest is the Python around them
(mlx-lm's loop, and the engine's own work per step where an engine ran them).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

Event = tuple[str, int, int, float]  # kind ("prefill" or "decode"), rows, key length, ms


class StepTracer:
    """Records every batched prefill call and decode step, with rows and key length."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def install(self) -> None:
        import importlib

        g = importlib.import_module("mlx_lm.generate")
        tracer = self

        def timed(kind: str, fn: Any) -> Any:
            def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
                began = time.perf_counter()
                try:
                    return fn(self, *args, **kwargs)
                finally:
                    ms = (time.perf_counter() - began) * 1000
                    cache = getattr(self, "prompt_cache", None) or []
                    length = getattr(cache[0], "_idx", -1) if cache else -1
                    tracer.events.append((kind, len(self.uids), int(length), ms))

            return wrapper

        g.PromptProcessingBatch.prompt = timed("prefill", g.PromptProcessingBatch.prompt)
        g.GenerationBatch._step = timed("decode", g.GenerationBatch._step)

    def take(self) -> list[Event]:
        events, self.events = self.events, []
        return events


def split(seconds: float, events: list[Event]) -> dict[str, Any]:
    """A run's wall time: prefill calls, decode steps, and the rest (ms a decode step)."""
    decode = [e[3] for e in events if e[0] == "decode" and e[1] > 0]
    prefill = [e[3] for e in events if e[0] == "prefill" and e[1] > 0]
    rest = seconds * 1000 - sum(decode) - sum(prefill)
    return {
        "steps": len(decode),
        "step_ms_median": round(statistics.median(decode), 3) if decode else None,
        "step_ms_total": round(sum(decode), 1),
        "prefill_calls": len(prefill),
        "prefill_ms_total": round(sum(prefill), 1),
        "rest_ms_total": round(rest, 1),
        "rest_ms_per_step": round(rest / len(decode), 3) if decode else None,
    }
