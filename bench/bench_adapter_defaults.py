"""The adapters' default engine against SimpleEngine, through ``ChatMLX``.

Two questions a user of a default ``ChatMLX(model=...)`` asks, each measured side by
side in one run with the sides alternating which goes first, over several rounds
(median, then the spread of the per-round ratios):

1. **Concurrent calls**: ``abatch`` of four short prompts, against the same four
   ``invoke``\\ d one after the other, on the same adapter (target >= 1.8x on the
   default; ``engine_type="simple"`` is shown beside it).
2. **A lone call**: one ``invoke`` (tokens/s, timed from the call to its return,
   prefill included) and the time to the first chunk of one ``stream``, default
   ``ChatMLX`` over ``ChatMLX(engine_type="simple")`` (target >= 0.97x tokens/s).

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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _streams import QUESTIONS

import mlx_integrations  # noqa: F401  (BLAS preload before mlx.core)
from mlx_integrations.engine import pool
from mlx_integrations.langchain import ChatMLX
from tests.support.tiny_models import build_tiny_model

SHORT = QUESTIONS[:4]


def _tokens(message: object) -> int:
    usage = getattr(message, "usage_metadata", None) or {}
    return int(usage.get("output_tokens", 0))


def abatch_vs_sequential(llm: ChatMLX) -> tuple[float, list[str]]:
    """(sequential seconds / abatch seconds, the replies), both from an empty cache."""
    llm.clear_runtime_caches()
    start = time.perf_counter()
    one_by_one = [llm.invoke(q) for q in SHORT]
    sequential = time.perf_counter() - start
    llm.clear_runtime_caches()
    start = time.perf_counter()
    together = asyncio.run(llm.abatch(SHORT))
    concurrent = time.perf_counter() - start
    replies = [str(m.content) for m in one_by_one]
    assert replies == [str(m.content) for m in together], "abatch replies differ"
    return sequential / concurrent, replies


def lone_invoke(llm: ChatMLX, question: str) -> tuple[float, str]:
    """(tokens/s of one invoke, its reply), from an empty cache."""
    llm.clear_runtime_caches()
    start = time.perf_counter()
    reply = llm.invoke(question)
    return _tokens(reply) / (time.perf_counter() - start), str(reply.content)


def lone_ttft(llm: ChatMLX, question: str) -> float:
    """Seconds to the first chunk with text of one stream, from an empty cache."""
    llm.clear_runtime_caches()
    start = time.perf_counter()
    first: float | None = None
    for chunk in llm.stream(question):
        if chunk.content and first is None:
            first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("the stream had no text")
    return first


def _alternate(
    rounds: int, sides: dict[str, ChatMLX], measure: Callable[[ChatMLX], tuple[float, object]]
) -> tuple[dict[str, list[float]], list[float]]:
    """Per-side values over ``rounds`` alternating rounds, and default / simple each round."""
    got: dict[str, list[float]] = {name: [] for name in sides}
    ratios: list[float] = []
    names = list(sides)
    for r in range(rounds):
        replies = {}
        for name in names if r % 2 == 0 else names[::-1]:
            value, replies[name] = measure(sides[name])
            got[name].append(value)
        assert replies["default"] == replies["simple"], "greedy replies differ"
        ratios.append(got["default"][-1] / got["simple"][-1])
    return got, ratios


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x (rounds {min(values):.2f}-{max(values):.2f})"


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

    speedups, _ = _alternate(rounds, sides, abatch_vs_sequential)
    for name, values in speedups.items():
        print(f"  abatch of 4 / sequential, {name:<8} {_spread(values)}")

    question = QUESTIONS[2]
    rates, ratios = _alternate(rounds, sides, lambda llm: lone_invoke(llm, question))
    print(
        f"  lone invoke tok/s   default {statistics.median(rates['default']):7.1f}  "
        f"simple {statistics.median(rates['simple']):7.1f}  ratio {_spread(ratios)}"
    )
    ttfts, ratios = _alternate(rounds, sides, lambda llm: (lone_ttft(llm, question), ""))
    print(
        f"  lone TTFT ms        default {statistics.median(ttfts['default']) * 1000:7.1f}  "
        f"simple {statistics.median(ttfts['simple']) * 1000:7.1f}  ratio {_spread(ratios)} "
        "(lower is faster)"
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
