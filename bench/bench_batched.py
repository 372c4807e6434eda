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
decode work. ``--levels`` adds the older table of 1/4/8 concurrent long requests.

Run: ``.venv/bin/python bench/bench_batched.py [--smollm] [--rounds 5] [--levels 1 4 8]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _streams import QUESTIONS

import mlx_integrations  # noqa: F401  (BLAS preload before mlx.core)
from mlx_integrations.engine import BatchedEngine, SimpleEngine
from mlx_integrations.engine.mlx_engine import MLXEngine
from tests.support.tiny_models import build_tiny_model

SHORT_TOKENS = 20


async def run_once(
    engine: MLXEngine, questions: list[str], max_tokens: int, serial: bool = False
) -> tuple[list[list[int]], float]:
    """Serve ``questions`` at once (or one after the other); (tokens of each, seconds)."""

    def call(question: str):  # type: ignore[no-untyped-def]
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


async def compare(
    simple: SimpleEngine,
    batched: BatchedEngine,
    questions: list[str],
    max_tokens: int,
    rounds: int,
) -> tuple[float, float, list[float]]:
    """Median tok/s of each side and the per-round ratios (batched at once / simple serial)."""
    rates: dict[str, list[float]] = {"simple": [], "batched": []}
    ratios: list[float] = []
    for r in range(rounds):
        order = ["simple", "batched"] if r % 2 == 0 else ["batched", "simple"]
        got: dict[str, float] = {}
        outs: dict[str, list[list[int]]] = {}
        for side in order:
            if side == "simple":
                outs[side], seconds = await run_once(simple, questions, max_tokens, serial=True)
            else:
                outs[side], seconds = await run_once(batched, questions, max_tokens)
            got[side] = _rate(outs[side], seconds)
            rates[side].append(got[side])
        assert outs["simple"] == outs["batched"], "greedy outputs differ"
        ratios.append(got["batched"] / got["simple"])
    return statistics.median(rates["simple"]), statistics.median(rates["batched"]), ratios


def _report(label: str, s: float, b: float, ratios: list[float]) -> None:
    print(
        f"  {label:<34} simple {s:8.1f} tok/s  batched {b:8.1f} tok/s  "
        f"ratio {statistics.median(ratios):.2f}x  (rounds {min(ratios):.2f}-{max(ratios):.2f})"
    )


async def bench_targets(model: Path, name: str, rounds: int, solo_tokens: int) -> None:
    simple = SimpleEngine(model, cache_memory_mb=0, load_warm_caches=False)
    batched = BatchedEngine(model, max_num_seqs=8, cache_memory_mb=0, load_warm_caches=False)
    try:
        for engine in (simple, batched):  # load and warm up outside the timings
            await run_once(engine, QUESTIONS, 4)
        print(f"{name}: median of {rounds} rounds, sides alternating")
        s, b, ratios = await compare(simple, batched, QUESTIONS[2:3], solo_tokens, rounds)
        _report(f"concurrency 1 ({solo_tokens} tokens)", s, b, ratios)
        s, b, ratios = await compare(simple, batched, QUESTIONS, SHORT_TOKENS, rounds)
        _report(f"8 short answers ({SHORT_TOKENS} tokens) / serial", s, b, ratios)
        stats = batched.get_stats()
        print(
            f"  batched: {stats['steps_executed']} decode steps, mean batch "
            f"{stats['mean_batch_size']:.2f}, peak {stats['peak_batch_size']}"
        )
    finally:
        for engine in (simple, batched):
            await engine.stop()


async def bench_levels(model: Path, levels: list[int], max_tokens: int, rounds: int) -> None:
    simple = SimpleEngine(model, cache_memory_mb=0, load_warm_caches=False)
    batched = BatchedEngine(
        model, max_num_seqs=max(levels), cache_memory_mb=0, load_warm_caches=False
    )
    try:
        for engine in (simple, batched):
            await run_once(engine, QUESTIONS, 8)
        print(f"{'concurrent':>10} {'simple tok/s':>13} {'batched tok/s':>14} {'ratio':>7}")
        for n in levels:
            questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(n)]
            rates: dict[str, list[float]] = {"simple": [], "batched": []}
            for r in range(rounds):
                engines: list[tuple[str, MLXEngine]] = [("simple", simple), ("batched", batched)]
                for side, engine in engines if r % 2 == 0 else engines[::-1]:
                    tokens, seconds = await run_once(engine, questions, max_tokens)
                    rates[side].append(_rate(tokens, seconds))
            s, b = statistics.median(rates["simple"]), statistics.median(rates["batched"])
            print(f"{n:>10} {s:>13.1f} {b:>14.1f} {b / s:>6.2f}x")
    finally:
        for engine in (simple, batched):
            await engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--solo-tokens", type=int, default=64)
    parser.add_argument("--smollm", action="store_true", help="also SmolLM2-135M (slow)")
    parser.add_argument("--smollm-rounds", type=int, default=3)
    parser.add_argument("--levels", type=int, nargs="*", default=[])
    parser.add_argument("--max-tokens", type=int, default=128, help="per request, --levels")
    args = parser.parse_args()
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
        asyncio.run(bench_targets(model, name, args.rounds, args.solo_tokens))
        if args.levels:
            asyncio.run(bench_levels(model, args.levels, args.max_tokens, args.rounds))
    if args.smollm:
        from tests.support.smollm import ensure_smollm2

        asyncio.run(
            bench_targets(ensure_smollm2(), "SmolLM2-135M-Instruct", args.smollm_rounds, 20)
        )


if __name__ == "__main__":
    main()
