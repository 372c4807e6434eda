"""BatchedEngine against SimpleEngine: total generated tokens per second under concurrency.

For 1, 4 and 8 concurrent chat requests (``asyncio.gather``) on a tiny random model,
both engines serve the same requests in the same run, alternating which goes first.
Requests are greedy, so both engines generate the same tokens (checked), and the
prefix cache is off, so both do the same prefill and decode work. No logits processor
is used (one would send BatchGenerator through its per-sequence path). Prints the
median tokens/s of each engine and their ratio (BatchedEngine / SimpleEngine).

Run: ``.venv/bin/python bench/bench_batched.py [--hidden 256 --layers 4 --max-tokens 128]``
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


async def run_once(
    engine: MLXEngine, concurrency: int, max_tokens: int
) -> tuple[list[list[int]], float]:
    """Serve ``concurrency`` requests at once; return (tokens of each, seconds)."""
    calls = [
        engine.chat(
            [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            max_tokens=max_tokens,
            temperature=0,
        )
        for i in range(concurrency)
    ]
    start = time.perf_counter()
    outs = await asyncio.gather(*calls)
    return [o.tokens for o in outs], time.perf_counter() - start


async def bench(model: Path, levels: list[int], max_tokens: int, repeat: int) -> None:
    simple = SimpleEngine(model, cache_memory_mb=0, load_warm_caches=False)
    batched = BatchedEngine(
        model, max_num_seqs=max(levels), cache_memory_mb=0, load_warm_caches=False
    )
    engines: dict[str, MLXEngine] = {"simple": simple, "batched": batched}
    try:
        for engine in engines.values():  # load and warm up outside the timings
            await run_once(engine, max(levels), 8)
        print(f"{'concurrent':>10} {'simple tok/s':>13} {'batched tok/s':>14} {'ratio':>7}")
        for n in levels:
            rates: dict[str, list[float]] = {name: [] for name in engines}
            outputs: dict[str, list[list[int]]] = {}
            for r in range(repeat):
                order = list(engines) if r % 2 == 0 else list(reversed(engines))
                for name in order:
                    outputs[name], seconds = await run_once(engines[name], n, max_tokens)
                    rates[name].append(sum(map(len, outputs[name])) / seconds)
            assert outputs["simple"] == outputs["batched"], "greedy outputs differ"
            s = statistics.median(rates["simple"])
            b = statistics.median(rates["batched"])
            print(f"{n:>10} {s:>13.1f} {b:>14.1f} {b / s:>6.2f}x")
        stats = batched.get_stats()
        print(
            f"batched: {stats['steps_executed']} decode steps, "
            f"mean batch {stats['mean_batch_size']:.2f}, peak {stats['peak_batch_size']}"
        )
    finally:
        for engine in engines.values():
            await engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 8])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(
            Path(tmp) / "model",
            hidden_size=args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
        print(
            f"model: llama, hidden {args.hidden}, {args.layers} layers; "
            f"{args.max_tokens} tokens per request; median of {args.repeat}"
        )
        asyncio.run(bench(model, args.levels, args.max_tokens, args.repeat))


if __name__ == "__main__":
    main()
