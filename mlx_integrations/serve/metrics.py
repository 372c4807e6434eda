"""The server's figures in Prometheus' text format (``GET /metrics``).

Counted by the server as requests pass: requests by endpoint and status, their
duration, time to first token, tokens in and out, prompt tokens served from the cache,
disconnects, refusals. Read from the engines at each scrape: requests running and
waiting, aborted, prefix-cache hits, and the memory each model and MLX hold.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

__all__ = ["Metrics"]

_PREFIX = "mlxi_"
# Seconds; first tokens of a small model on a GPU to a long prompt on a CPU.
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

Labels = tuple[tuple[str, str], ...]


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1


_HELP = {
    "requests_total": ("counter", "Requests answered, by endpoint and HTTP status."),
    "request_duration_seconds": ("histogram", "Time from a request's arrival to its last byte."),
    "time_to_first_token_seconds": (
        "histogram",
        "Time from a generation request's arrival to its first generated text.",
    ),
    "prompt_tokens_total": ("counter", "Prompt tokens of finished generations."),
    "generation_tokens_total": ("counter", "Tokens generated."),
    "cached_prompt_tokens_total": ("counter", "Prompt tokens served from the prefix cache."),
    "client_disconnects_total": ("counter", "Requests whose client went away before the end."),
    "rejected_requests_total": ("counter", "Requests refused for want of room, by reason."),
    "requests_in_flight": ("gauge", "Requests the server is answering now."),
    "engine_requests_running": ("gauge", "Requests an engine is decoding now."),
    "engine_requests_waiting": ("gauge", "Requests queued in an engine."),
    "engine_requests_aborted_total": ("counter", "Requests an engine stopped before their end."),
    "prefix_cache_hits_total": ("counter", "Requests that reused a cached prompt prefix."),
    "prefix_cache_misses_total": ("counter", "Requests that found no prefix to reuse."),
    "prefix_cache_tokens_saved_total": ("counter", "Prompt tokens the prefix cache saved."),
    "prefix_cache_bytes": ("gauge", "Bytes held by an engine's prefix cache."),
    "model_loaded": ("gauge", "1 while a model's weights are in memory."),
    "model_memory_bytes": ("gauge", "Bytes a model holds: weights and caches."),
    "mlx_memory_active_bytes": ("gauge", "MLX's active memory."),
    "mlx_memory_peak_bytes": ("gauge", "MLX's peak memory."),
    "mlx_memory_cache_bytes": ("gauge", "MLX's buffer pool (freed buffers kept for reuse)."),
}


class Metrics:
    """Counters, gauges and histograms of one server; :meth:`render` writes them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[Labels, float]] = defaultdict(dict)
        self._histograms: dict[str, dict[Labels, _Histogram]] = defaultdict(dict)
        self.in_flight = 0

    def add(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._counters[name]
            series[key] = series.get(key, 0.0) + value

    def observe(self, name: str, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        buckets = _TTFT_BUCKETS if name.startswith("time_to_first") else _DURATION_BUCKETS
        with self._lock:
            series = self._histograms[name]
            if key not in series:
                series[key] = _Histogram(buckets)
            series[key].observe(value)

    def count(self, name: str, **labels: str) -> float:
        """A counter's value (0 before it was counted)."""
        with self._lock:
            return self._counters[name].get(tuple(sorted(labels.items())), 0.0)

    def finished(
        self, model: str, prompt: int, completion: int, cached: int, ttft_s: float | None
    ) -> None:
        """Count one generation's tokens and its time to first token."""
        self.add("prompt_tokens_total", prompt, model=model)
        self.add("generation_tokens_total", completion, model=model)
        self.add("cached_prompt_tokens_total", cached, model=model)
        if ttft_s is not None:
            self.observe("time_to_first_token_seconds", ttft_s, model=model)

    def render(self, served: Iterable[Any] = ()) -> str:
        """Everything in Prometheus' text format (version 0.0.4)."""
        lines: list[str] = []
        with self._lock:
            counters = {k: dict(v) for k, v in self._counters.items()}
            histograms = {
                k: {labels: (h.buckets, list(h.counts), h.total, h.n) for labels, h in v.items()}
                for k, v in self._histograms.items()
            }
        gauges: dict[str, dict[Labels, float]] = defaultdict(dict)
        gauges["requests_in_flight"][()] = self.in_flight
        for item in served:
            _engine_series(item, counters, gauges)
        _mlx_memory(gauges)
        for name in _HELP:
            kind, text = _HELP[name]
            series: dict[Labels, Any] = (
                histograms.get(name, {})
                if kind == "histogram"
                else counters.get(name) or gauges.get(name) or {}
            )
            if not series:
                continue
            full = _PREFIX + name
            lines += [f"# HELP {full} {text}", f"# TYPE {full} {kind}"]
            for labels, value in sorted(series.items()):
                if kind == "histogram":
                    lines += _histogram_lines(full, labels, *value)
                else:
                    lines.append(f"{full}{_labels(labels)} {_number(value)}")
        return "\n".join(lines) + "\n"


def _engine_series(
    item: Any, counters: dict[str, dict[Labels, float]], gauges: dict[str, dict[Labels, float]]
) -> None:
    labels: Labels = (("model", item.name),)
    engine = item.engine
    if item.kind in ("embedding", "reranker"):  # an encoder's engine: no requests to count
        gauges["model_loaded"][labels] = float(bool(getattr(engine, "is_loaded", False)))
        weights, caches = engine.resident_bytes()
        gauges["model_memory_bytes"][labels] = weights + caches
        return
    try:
        stats = engine.get_stats()
    except Exception:  # an engine of another project may not report; list it as is
        stats = {}
    gauges["engine_requests_running"][labels] = stats.get("num_running", 0)
    gauges["engine_requests_waiting"][labels] = stats.get("num_waiting", 0)
    counters.setdefault("engine_requests_aborted_total", {})[labels] = stats.get(
        "num_requests_aborted", 0
    )
    cache = stats.get("prefix_cache") or {}
    counters.setdefault("prefix_cache_hits_total", {})[labels] = cache.get("hits", 0)
    counters.setdefault("prefix_cache_misses_total", {})[labels] = cache.get("misses", 0)
    counters.setdefault("prefix_cache_tokens_saved_total", {})[labels] = cache.get(
        "tokens_saved", 0
    )
    gauges["prefix_cache_bytes"][labels] = cache.get("current_memory_mb", 0.0) * 1024 * 1024
    gauges["model_loaded"][labels] = float(bool(stats.get("loaded", False)))
    residency = stats.get("residency") or {}
    gauges["model_memory_bytes"][labels] = residency.get("memory_bytes", 0)


def _mlx_memory(gauges: dict[str, dict[Labels, float]]) -> None:
    from mlx_integrations.engine.stats import memory_stats

    memory = memory_stats()
    mib = 1024 * 1024
    gauges["mlx_memory_active_bytes"][()] = memory["active_mb"] * mib
    gauges["mlx_memory_peak_bytes"][()] = memory["peak_mb"] * mib
    gauges["mlx_memory_cache_bytes"][()] = memory["cache_mb"] * mib


def _labels(labels: Labels, extra: tuple[str, str] | None = None) -> str:
    pairs = [*labels, *([extra] if extra else [])]
    if not pairs:
        return ""
    text = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return "{" + text + "}"


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _histogram_lines(
    name: str, labels: Labels, buckets: tuple[float, ...], counts: list[int], total: float, n: int
) -> list[str]:
    lines = []
    running = 0
    for bound, count in zip((*buckets, float("inf")), counts, strict=True):
        running += count
        le = "+Inf" if bound == float("inf") else _number(bound)
        lines.append(f"{name}_bucket{_labels(labels, ('le', le))} {running}")
    lines.append(f"{name}_sum{_labels(labels)} {_number(total)}")
    lines.append(f"{name}_count{_labels(labels)} {n}")
    return lines
