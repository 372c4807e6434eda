"""What padded prefill pieces (``prefill_buckets``) cost and whether replies stay the same.

``SimpleEngine(prefill_buckets=True)`` against ``prefill_buckets=False`` on the same
prompts (prefix cache off), alternating which goes first: time to first token per
prompt (the prefill, padding included), the greedy reply of each (which must be the
same), the distinct prefill shapes each side met, and the warm-up's time
(``warmup_shapes``). On a CPU this is the padding's price alone, since a CPU sets
nothing up per shape; on a GPU see bench_gpu.py's ``ttft`` part, which measures prompts
new to the process.

Run: ``python bench/bench_prefill_shapes.py`` (SmolLM2-135M-Instruct, float32, from the
test cache) or ``--model PATH``; ``--lengths`` prompt token counts, ``--reps``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx_integrations  # noqa: F401  (BLAS preload before mlx.core)


class Shapes:
    """The engine's model, recording the token count of every forward pass."""

    def __init__(self, model: Any):
        self.model = model
        self.seen: set[int] = set()

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        self.seen.add(int(inputs.shape[1]))
        return self.model(inputs, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def prompt_of(tokenizer: Any, n: int, seed: int) -> str:
    """Text of exactly ``n`` tokens (decoded from varied ids, checked on re-encoding)."""
    rng = random.Random(seed)
    vocab = tokenizer.vocab_size
    for _ in range(100):
        ids = [rng.randrange(200, min(vocab, 20000)) for _ in range(n + 8)]
        text = tokenizer.decode(ids)
        ids = tokenizer.encode(text, add_special_tokens=False)[:n]
        text = tokenizer.decode(ids)
        if len(tokenizer.encode(text, add_special_tokens=False)) == n:
            return text
    raise RuntimeError(f"no text of {n} tokens")


def _plain_cache() -> Any:
    from mlx_lm.models.cache import KVCache

    return KVCache()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from mlx_integrations.engine import SimpleEngine

    if args.model is None:
        from tests.support.smollm import ensure_smollm2

        args.model = ensure_smollm2()
    common: dict[str, Any] = {"cache_memory_mb": 0}
    if args.step:
        common["prefill_step_size"] = args.step
    sides = {
        "padded": SimpleEngine(args.model, prefill_buckets=True, warmup_shapes=False, **common),
        "plain": SimpleEngine(args.model, prefill_buckets=False, warmup_shapes=False, **common),
    }
    result: dict[str, Any] = {"model": str(args.model), "lengths": {}}
    try:
        for engine in sides.values():
            await engine.start()
        shapes = {name: Shapes(engine._model) for name, engine in sides.items()}
        for name, engine in sides.items():
            engine._model = shapes[name]
        tokenizer = sides["plain"].tokenizer
        result["buckets"] = list(sides["padded"]._shapes.buckets)
        step = sides["padded"]._prefill_step_size
        same = True
        for n in args.lengths:
            times: dict[str, list[float]] = {"padded": [], "plain": []}
            cpu: dict[str, list[float]] = {"padded": [], "plain": []}
            for rep in range(args.reps):
                text = prompt_of(tokenizer, n, seed=n * 100 + rep)
                order = ["padded", "plain"] if rep % 2 == 0 else ["plain", "padded"]
                for name in order:
                    # The prompt and one token: the prefill, in wall and CPU seconds (the
                    # latter less moved by other work on a shared machine).
                    wall, used = time.perf_counter(), time.process_time()
                    await sides[name].generate(text, max_tokens=1, temperature=0)
                    cpu[name].append(time.process_time() - used)
                    times[name].append(time.perf_counter() - wall)
            replies = [
                (await sides[name].generate(text, max_tokens=args.tokens, temperature=0)).tokens
                for name in ("padded", "plain")
            ]
            same = same and replies[0] == replies[1]
            row = result["lengths"][str(n)] = {
                "padded_ms": statistics.median(times["padded"]) * 1e3,
                "plain_ms": statistics.median(times["plain"]) * 1e3,
                "ratio": statistics.median(
                    p / q for p, q in zip(times["padded"], times["plain"], strict=True)
                ),
                "cpu_ratio": statistics.median(
                    p / q for p, q in zip(cpu["padded"], cpu["plain"], strict=True)
                ),
                "padded_tokens": n
                - 1
                + sides["padded"]._shapes.padding([_plain_cache()], (n - 1) % step or step),
            }
            print(
                f"{n:5d} tokens: padded {row['padded_ms']:7.1f} ms, plain {row['plain_ms']:7.1f} ms"
                f" (wall ratio {row['ratio']:.3f}, CPU-time ratio {row['cpu_ratio']:.3f}); "
                f"tokens prefilled {row['padded_tokens']} against {n - 1}",
                flush=True,
            )
        result["same_replies"] = same
        result["prefill_shapes"] = {k: sorted(v.seen - {1}) for k, v in shapes.items()}
        for name, engine in sides.items():
            engine._model = shapes[name].model
        # The warm-up's price on this device: a fresh engine that warms at load.
        warm = SimpleEngine(args.model, prefill_buckets=True, warmup_shapes=True, **common)
        await warm.start()
        result["warmup_s"] = warm.warmup_seconds
        await warm.stop()
    finally:
        for engine in sides.values():
            await engine.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--lengths", type=int, nargs="+", default=[20, 70, 150, 300, 700, 1500])
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16, help="tokens of the compared replies")
    parser.add_argument("--step", type=int, help="prefill_step_size (default: the device's)")
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    print(
        f"same greedy replies: {result['same_replies']}; distinct prefill shapes: padded "
        f"{len(result['prefill_shapes']['padded'])}, plain {len(result['prefill_shapes']['plain'])}"
        f"; warm-up {result['warmup_s']:.2f} s"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
