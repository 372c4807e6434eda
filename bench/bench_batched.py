"""BatchedEngine against SimpleEngine: one request alone, and eight short ones at once.

Two ratios, each measured side by side in one run with the sides alternating which goes
first, over several repetitions (median, then the spread of the per-round ratios):

1. **Concurrency 1**: one greedy chat request, BatchedEngine tokens/s over
   SimpleEngine tokens/s, timed from the call to the last token (prefill included).
2. **Eight short answers**: eight different one-line questions (``max_tokens`` 20) sent
   at once to BatchedEngine, against the same eight served one after the other by
   SimpleEngine: total generated tokens over wall time, prefill included.

Both run on a tiny random model (always) and on SmolLM2-135M-Instruct (``--smollm``;
slow on a CPU, so fewer rounds). Requests are greedy, so both engines generate the
same tokens (checked), and the prefix cache is off, so both do the same prefill and
decode work. ``--levels`` adds a table of 1/4/8 concurrent long requests.

Run: ``.venv/bin/python bench/bench_batched.py [--smollm] [--rounds 5] [--levels 1 4 8]
[--json FILE]``
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import QUESTIONS, Spread, alternate_async, compare, parser, ratio, save

import mlx_integrations  # noqa: F401  (BLAS preload before mlx.core)
from mlx_integrations.engine import BatchedEngine, SimpleEngine
from mlx_integrations.engine.mlx_engine import MLXEngine
from tests.support.tiny_models import build_tiny_model

SHORT_TOKENS = 20


async def run_once(
    engine: MLXEngine, questions: list[str], max_tokens: int, serial: bool = False
) -> tuple[list[list[int]], float]:
    """Serve ``questions`` at once (or one after the other); (tokens of each, seconds)."""

    def call(question: str):
        messages = [{"role": "user", "content": question}]
        return engine.chat(messages, max_tokens=max_tokens, temperature=0)

    start = time.perf_counter()
    if serial:
        outs = [await call(q) for q in questions]
    else:
        outs = await asyncio.gather(*[call(q) for q in questions])
    return [o.tokens for o in outs], time.perf_counter() - start


def _rate(tokens: list[list[int]], seconds: float) -> float:
    return sum(map(len, tokens)) / seconds


async def sides_compared(
    simple: SimpleEngine,
    batched: BatchedEngine,
    questions: list[str],
    max_tokens: int,
    rounds: int,
) -> dict[str, list[float]]:
    """Tok/s of each side a round: batched at once against simple one by one."""
    tokens: dict[str, list[list[list[int]]]] = {"simple": [], "batched": []}

    async def side(name: str) -> float:
        engine: MLXEngine = simple if name == "simple" else batched
        outs, seconds = await run_once(engine, questions, max_tokens, serial=name == "simple")
        tokens[name].append(outs)
        return _rate(outs, seconds)

    rates = await alternate_async(
        {"simple": lambda: side("simple"), "batched": lambda: side("batched")}, rounds
    )
    assert tokens["simple"] == tokens["batched"], "greedy outputs differ"
    return rates


def _report(label: str, rates: dict[str, list[float]]) -> dict[str, Any]:
    s, b = statistics.median(rates["simple"]), statistics.median(rates["batched"])
    print(
        f"  {label:<34} simple {s:8.1f} tok/s  batched {b:8.1f} tok/s  "
        f"ratio {ratio(rates['batched'], rates['simple'])}"
    )
    return compare(rates["batched"], rates["simple"])


async def bench_targets(model: Path, name: str, rounds: int, solo_tokens: int) -> dict[str, Any]:
    simple = SimpleEngine(model, cache_memory_mb=0, load_warm_caches=False)
    batched = BatchedEngine(model, max_num_seqs=8, cache_memory_mb=0, load_warm_caches=False)
    try:
        for engine in (simple, batched):  # load and warm up outside the timings
            await run_once(engine, QUESTIONS, 4)
        print(f"{name}: median of {rounds} rounds, sides alternating")
        alone = await sides_compared(simple, batched, QUESTIONS[2:3], solo_tokens, rounds)
        short = await sides_compared(simple, batched, QUESTIONS, SHORT_TOKENS, rounds)
        figures = {
            "alone": _report(f"concurrency 1 ({solo_tokens} tokens)", alone),
            "eight_short": _report(f"8 short answers ({SHORT_TOKENS} tokens) / serial", short),
        }
        stats = batched.get_stats()
        print(
            f"  batched: {stats['steps_executed']} decode steps, mean batch "
            f"{stats['mean_batch_size']:.2f}, peak {stats['peak_batch_size']}"
        )
        return figures
    finally:
        for engine in (simple, batched):
            await engine.stop()


async def bench_levels(
    model: Path, levels: list[int], max_tokens: int, rounds: int
) -> dict[str, Any]:
    simple = SimpleEngine(model, cache_memory_mb=0, load_warm_caches=False)
    batched = BatchedEngine(
        model, max_num_seqs=max(levels), cache_memory_mb=0, load_warm_caches=False
    )
    figures = {}
    try:
        for engine in (simple, batched):
            await run_once(engine, QUESTIONS, 8)
        print(f"{'concurrent':>10} {'simple tok/s':>13} {'batched tok/s':>14} {'ratio':>24}")
        for n in levels:
            questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(n)]

            async def at_once(engine: MLXEngine, qs: list[str] = questions) -> float:
                return _rate(*await run_once(engine, qs, max_tokens))

            rates = await alternate_async(
                {"simple": lambda: at_once(simple), "batched": lambda: at_once(batched)}, rounds
            )
            s, b = statistics.median(rates["simple"]), statistics.median(rates["batched"])
            spread: Spread = ratio(rates["batched"], rates["simple"])
            print(f"{n:>10} {s:>13.1f} {b:>14.1f} {spread!s:>24}")
            figures[f"c{n}"] = compare(rates["batched"], rates["simple"])
        return figures
    finally:
        for engine in (simple, batched):
            await engine.stop()


def main() -> None:
    p = parser(__doc__, rounds=7)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--solo-tokens", type=int, default=64)
    p.add_argument("--smollm", action="store_true", help="also SmolLM2-135M (slow)")
    p.add_argument("--smollm-rounds", type=int, default=3)
    p.add_argument("--levels", type=int, nargs="*", default=[])
    p.add_argument("--max-tokens", type=int, default=128, help="per request, --levels")
    args = p.parse_args()
    figures: dict[str, Any] = {}
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
        figures["tiny"] = asyncio.run(bench_targets(model, name, args.rounds, args.solo_tokens))
        if args.levels:
            figures["tiny_levels"] = asyncio.run(
                bench_levels(model, args.levels, args.max_tokens, args.rounds)
            )
    if args.smollm:
        from tests.support.smollm import ensure_smollm2

        figures["smollm2"] = asyncio.run(
            bench_targets(ensure_smollm2(), "SmolLM2-135M-Instruct", args.smollm_rounds, 20)
        )
    save(args.json, "bench_batched", figures)


if __name__ == "__main__":
    main()
