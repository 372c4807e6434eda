"""The adapters' default engine against SimpleEngine, through ``ChatMLX``.

Two questions a user of a default ``ChatMLX(model=...)`` asks, each measured side by
side in one run with the sides alternating which goes first, over several rounds
(median, then the spread of the per-round ratios):

1. **Concurrent calls**: ``abatch`` of four short prompts, against the same four
   ``invoke``\\ d one after the other, on the same adapter (target >= 1.8x on the
   default; ``engine_type="simple"`` is shown beside it).
2. **A lone call**: one ``invoke`` (timed from the call to its return, prefill
   included: its tokens/s) and the time to the first chunk of one ``stream``, the
   speed of a default ``ChatMLX`` over that of ``ChatMLX(engine_type="simple")``
   (target >= 0.97x; above 1 the default is faster).

Each ratio is the median of the per-round ratios, with their range; "best over best"
divides the fastest round of one side by the fastest of the other, which a busy
machine disturbs least; "CPU" is the same median ratio of the process's CPU time
(``time.process_time``), which other processes on the machine hardly move.

Requests are greedy, so both sides reply with the same tokens (checked), and each
timed call starts from an empty prefix cache (``clear_runtime_caches()``), so every
call prefills its whole prompt. Both adapters keep the engines' other defaults.

Runs on a tiny random model (always) and on SmolLM2-135M-Instruct (``--smollm``: the
store model ``smollm2-135m-instruct`` of ``cookbook/example_model.py``; slow on a CPU,
so fewer rounds).

Run: ``.venv/bin/python bench/bench_adapter_defaults.py [--smollm] [--rounds 7]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _streams import QUESTIONS

import mlx_integrations  # noqa: F401  (BLAS preload before mlx.core)
from mlx_integrations.engine import pool
from mlx_integrations.langchain import ChatMLX
from tests.support.tiny_models import build_tiny_model

SHORT = QUESTIONS[:4]
T = TypeVar("T")


@dataclass
class Timing:
    """Wall-clock and process CPU seconds of one measured span."""

    wall: float
    cpu: float


class _Clock:
    """Times a span: ``with _Clock() as c: ...`` then ``c.timing``; ``c.lap()`` mid-span."""

    def __enter__(self) -> _Clock:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def lap(self) -> Timing:
        return Timing(time.perf_counter() - self._wall, time.process_time() - self._cpu)

    def __exit__(self, *exc: object) -> None:
        self.timing = self.lap()


def _tokens(message: object) -> int:
    usage = getattr(message, "usage_metadata", None) or {}
    return int(usage.get("output_tokens", 0))


def abatch_vs_sequential(llm: ChatMLX) -> tuple[tuple[Timing, Timing], list[int]]:
    """((the 4 one by one, abatch of the 4), reply tokens), both from an empty cache."""
    llm.clear_runtime_caches()
    with _Clock() as sequential:
        one_by_one = [llm.invoke(q) for q in SHORT]
    llm.clear_runtime_caches()
    with _Clock() as concurrent:
        together = asyncio.run(llm.abatch(SHORT))
    replies = [str(m.content) for m in one_by_one]
    assert replies == [str(m.content) for m in together], "abatch replies differ"
    return (sequential.timing, concurrent.timing), [_tokens(m) for m in together]


def lone_invoke(llm: ChatMLX, question: str) -> tuple[Timing, int]:
    """(one invoke, its reply tokens), from an empty cache."""
    llm.clear_runtime_caches()
    with _Clock() as clock:
        reply = llm.invoke(question)
    return clock.timing, _tokens(reply)


def lone_ttft(llm: ChatMLX, question: str) -> tuple[Timing, str]:
    """(time to the first chunk with text of one stream, the reply), from an empty cache."""
    llm.clear_runtime_caches()
    first: Timing | None = None
    text = ""
    with _Clock() as clock:
        for chunk in llm.stream(question):
            if chunk.content and first is None:
                first = clock.lap()
            text += str(chunk.content)
    if first is None:
        raise RuntimeError("the stream had no text")
    return first, text


def _alternate(
    rounds: int, sides: dict[str, ChatMLX], measure: Callable[[ChatMLX], tuple[T, object]]
) -> tuple[dict[str, list[T]], object]:
    """Per-side values over ``rounds`` rounds, the sides alternating which goes first;
    and what the calls returned (the same on both sides: greedy replies)."""
    got: dict[str, list[T]] = {name: [] for name in sides}
    names = list(sides)
    reply: object = None
    for r in range(rounds):
        replies = {}
        for name in names if r % 2 == 0 else names[::-1]:
            value, replies[name] = measure(sides[name])
            got[name].append(value)
        assert replies["default"] == replies["simple"], "greedy replies differ"
        reply = replies["default"]
    return got, reply


def _ratio(slow: list[Timing], fast: list[Timing]) -> str:
    """How many times faster ``fast`` ran than ``slow``, round by round."""
    wall = [s.wall / f.wall for s, f in zip(slow, fast, strict=True)]
    cpu = [s.cpu / f.cpu for s, f in zip(slow, fast, strict=True)]
    best = min(s.wall for s in slow) / min(f.wall for f in fast)
    return (
        f"{statistics.median(wall):.2f}x (rounds {min(wall):.2f}-{max(wall):.2f}; best over "
        f"best {best:.2f}x; CPU {statistics.median(cpu):.2f}x)"
    )


def _median_ms(values: list[Timing]) -> float:
    return statistics.median(v.wall for v in values) * 1000


def bench(model: str, label: str, rounds: int, max_tokens: int) -> None:
    kwargs = {"model": model, "temperature": 0, "max_tokens": max_tokens}
    default = ChatMLX(**kwargs)
    simple = ChatMLX(**kwargs, engine_type="simple")
    sides = {"default": default, "simple": simple}
    print(
        f"{label}: default engine_type={default.engine_type!r} "
        f"({type(default.engine).__name__}), {rounds} rounds, sides alternating, "
        f"max_tokens {max_tokens}"
    )
    for llm in sides.values():  # load and warm up outside the timings
        asyncio.run(llm.abatch(SHORT))

    pairs, tokens = _alternate(rounds, sides, abatch_vs_sequential)
    print(f"  abatch of 4 short prompts (reply tokens {tokens}), speed-up over one by one:")
    for name, both in pairs.items():
        sequential, together = [p[0] for p in both], [p[1] for p in both]
        print(
            f"    {name:<8} {_ratio(sequential, together)}  "
            f"({_median_ms(sequential):.0f} ms / {_median_ms(together):.0f} ms)"
        )

    question = QUESTIONS[2]
    invokes, n = _alternate(rounds, sides, lambda llm: lone_invoke(llm, question))
    print(
        f"  lone invoke ({n} tokens), default speed / simple: "
        f"{_ratio(invokes['simple'], invokes['default'])}  "
        f"({_median_ms(invokes['default']):.1f} ms / {_median_ms(invokes['simple']):.1f} ms)"
    )
    ttfts, _ = _alternate(rounds, sides, lambda llm: lone_ttft(llm, question))
    print(
        f"  lone TTFT, default speed / simple: {_ratio(ttfts['simple'], ttfts['default'])}  "
        f"({_median_ms(ttfts['default']):.1f} ms / {_median_ms(ttfts['simple']):.1f} ms)"
    )
    stats = default.get_stats()
    if "peak_batch_size" in stats:
        print(
            f"  default engine: peak batch {stats['peak_batch_size']}, mean batch "
            f"{stats['mean_batch_size']:.2f}, {stats['solo_requests']} solo runs"
        )
    del default, simple, sides
    pool.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--smollm", action="store_true", help="also SmolLM2-135M (slow)")
    parser.add_argument("--smollm-rounds", type=int, default=3)
    parser.add_argument("--skip-tiny", action="store_true")
    args = parser.parse_args()
    if not args.skip_tiny:
        with tempfile.TemporaryDirectory() as tmp:
            model = build_tiny_model(
                Path(tmp) / "model",
                hidden_size=args.hidden,
                num_hidden_layers=args.layers,
                num_attention_heads=4,
                num_key_value_heads=2,
                tie_word_embeddings=False,
            )
            name = f"tiny llama (hidden {args.hidden}, {args.layers} layers)"
            bench(str(model), name, args.rounds, args.max_tokens)
    if args.smollm:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cookbook"))
        from example_model import example_model

        bench(example_model(), "SmolLM2-135M-Instruct", args.smollm_rounds, args.max_tokens)


if __name__ == "__main__":
    main()
