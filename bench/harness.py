"""What every benchmark here shares: sides timed in turn, medians and ranges, one JSON file.

A figure is a ratio measured side by side in one run: each round runs every side once,
the side that goes first rotating from round to round, so that load from other programs
falls on all sides alike. A ratio is reported as the median of the per-round ratios and
their range; absolute rates are not comparable across runs or machines, ratios are.

``--json PATH`` writes a run's figures with what reproduces them: the date, the commit,
the command and the machine. Standard library only, so a peer's worker in another
virtualenv can time its streams with the same code.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")

# Short, varied chat requests for concurrent runs.
QUESTIONS = [
    "What is the weather in Paris?",
    "Hello! How can I help you today?",
    "The capital of France is Paris. The capital of Italy is",
    "Call get_weather for Rome, in celsius please.",
    "The quick brown fox jumps over the lazy dog.",
    "0123456789 + - * / = ( ) [ ] { }",
    "Tools: You may call one or more functions.",
    "Unicode: café, naïve, 東京, Привет",
]


def alternate(sides: Mapping[str, Callable[[], T]], rounds: int) -> dict[str, list[T]]:
    """Run every side once a round, ``rounds`` times, rotating which side goes first."""
    names = list(sides)
    out: dict[str, list[T]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            out[name].append(sides[name]())
    return out


async def alternate_async(
    sides: Mapping[str, Callable[[], Awaitable[T]]], rounds: int
) -> dict[str, list[T]]:
    """``alternate`` for sides that are coroutines, awaited one after the other."""
    names = list(sides)
    out: dict[str, list[T]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            out[name].append(await sides[name]())
    return out


@dataclass(frozen=True)
class Spread:
    """The median of some values and their range."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("no values to summarize")
        return cls(statistics.median(values), min(values), max(values), len(values))

    def __str__(self) -> str:
        if self.n == 1:
            return f"{self.median:.3f}"
        return f"{self.median:.3f} ({self.low:.3f} to {self.high:.3f})"


def ratio(ours: Sequence[float], theirs: Sequence[float]) -> Spread:
    """Per-round ratios ``ours[i] / theirs[i]``, summarized (rounds paired by index)."""
    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} rounds against {len(theirs)}: pair them round by round")
    return Spread.of([o / t for o, t in zip(ours, theirs, strict=True) if t > 0])


def compare(ours: Sequence[float], theirs: Sequence[float]) -> dict[str, Any]:
    """Both sides' values and medians, and the ratio ours / theirs, ready for JSON."""
    return {
        "ours": list(ours),
        "theirs": list(theirs),
        "ours_median": statistics.median(ours),
        "theirs_median": statistics.median(theirs),
        "ratio": asdict(ratio(ours, theirs)),
    }


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0 to 100), linear between the nearest ranks."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    at = (len(ordered) - 1) * q / 100
    below = int(at)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (at - below)


async def timed_stream(stream: Any) -> dict[str, Any]:
    """Consume one engine output stream; time its first chunk and the span of the rest."""
    start = time.perf_counter()
    first = last = None
    out = None
    chunks = 0
    async for chunk in stream:
        out = chunk
        last = time.perf_counter()
        if first is None:
            first = last
        chunks += 1
    if out is None or first is None or last is None:
        raise RuntimeError("the engine produced no output")
    return {
        "text": out.text,
        "completion_tokens": int(out.completion_tokens),
        "prompt_tokens": int(out.prompt_tokens),
        "cached_tokens": getattr(out, "cached_tokens", None),
        "finish_reason": out.finish_reason,
        "chunks": chunks,
        "ttft_s": first - start,
        "decode_s": last - first,
        "total_s": last - start,
    }


def parser(doc: str | None, *, rounds: int) -> argparse.ArgumentParser:
    """An argument parser with what every benchmark takes: ``--rounds`` and ``--json``."""
    p = argparse.ArgumentParser(
        description=(doc or "").strip().splitlines()[0] if doc else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rounds", type=int, default=rounds, help="rounds, sides alternating")
    p.add_argument("--json", type=Path, help="write the figures and how they were made here")
    return p


def commit() -> str:
    """The repository's commit (short), with ``+changes`` when the tree differs from it."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return (sha or "unknown") + ("+changes" if dirty else "")


def machine() -> dict[str, Any]:
    """The platform, the cores and, where MLX is importable, its version and device."""
    out: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        from mlx_integrations.runtime import backend_info

        info = backend_info()
        out |= {
            "mlx": info.get("mlx_version"),
            "mlx_lm": info.get("mlx_lm_version"),
            "device": info.get("gpu_name") or info.get("device"),
            "backend": info.get("backend"),
            "cpu_blas": info.get("cpu_blas"),
        }
    except Exception:  # no MLX here (a peer's virtualenv): the platform is enough
        pass
    return out


def record(benchmark: str, figures: Mapping[str, Any]) -> dict[str, Any]:
    """A run's figures with the date, commit, command and machine that reproduce them."""
    return {
        "benchmark": benchmark,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit(),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(),
        "figures": dict(figures),
    }


def save(path: Path | None, benchmark: str, figures: Mapping[str, Any]) -> None:
    """Write ``record(benchmark, figures)`` to ``path`` whole (nothing when it is None)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record(benchmark, figures), indent=1, default=str) + "\n")
    os.replace(tmp, path)
    print(f"figures written to {path}", file=sys.stderr)
