"""Pairs per second of MLXRerank's cross-encoder against sentence-transformers' CrossEncoder.

Both score the same (query, document) pairs with the same weights and batch size, in one
process, alternating rounds so that a change in machine load hits both alike. The
model is all-MiniLM-L6-v2's encoder under a seeded classification head
(``tests/support/cross_encoders.py``): the size and layout of ms-marco-MiniLM-L-6-v2,
which is what this measures; ``--model`` takes any cross-encoder folder instead.
The result is the ratio ``MLX pairs/s / torch pairs/s`` (above 1.0: MLX is faster).

It needs an environment with both this package and torch + sentence-transformers, as
``bench/bench_embeddings.py`` describes:

    PYTHONPATH=. /tmp/bench-venv/bin/python bench/bench_rerank.py --batch-sizes 1,32,256

Besides wall-clock pairs/s it reports pairs per CPU-second of the whole process, which
moves less when other programs compete for the cores. ``--threads N`` gives both halves
N threads (OpenBLAS for MLX, intra-op threads for torch).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make_pairs(count: int, seed: int = 0) -> tuple[str, list[str]]:
    """One query and ``count`` documents of 8 to 80 words, like retrieved chunks."""
    sys.path.insert(0, str(REPO / "bench"))
    from bench_embeddings import _WORDS

    rng = random.Random(seed)
    query = " ".join(rng.choice(_WORDS) for _ in range(8)).capitalize() + "?"
    docs = []
    for _ in range(count):
        n = rng.choice([8, 16, 24, 32, 48, 64, 80])
        docs.append(" ".join(rng.choice(_WORDS) for _ in range(n)).capitalize() + ".")
    return query, docs


def time_round(run: Callable[[], object]) -> tuple[float, float]:
    """Wall-clock and process CPU seconds of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    """Parse arguments, run both halves alternately for each batch size, print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="cross-encoder folder (default: see above)")
    parser.add_argument("--pairs", type=int, default=256)
    parser.add_argument("--batch-sizes", default="1,32,256", help="comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, help="threads for each half (default: theirs)")
    parser.add_argument("--json", type=Path, help="also write the result here as JSON")
    args = parser.parse_args()
    if args.threads:
        # Read by OpenBLAS when it loads, which happens on the import below.
        os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)

    import mlx_integrations  # noqa: F401  (preloads the CPU BLAS before mlx.core)
    from mlx_integrations.embeddings.rerank_engine import RerankEngine

    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model
        if folder is None:
            from tests.support.cross_encoders import write_minilm_cross_encoder
            from tests.support.minilm import ensure_minilm

            folder = write_minilm_cross_encoder(ensure_minilm(), Path(tmp) / "ce")
        query, docs = make_pairs(args.pairs)
        engine = RerankEngine(folder)
        import torch
        from sentence_transformers import CrossEncoder

        if args.threads:
            torch.set_num_threads(args.threads)
        st_model = CrossEncoder(str(folder), device="cpu")
        results: dict[str, object] = {
            "model": str(args.model or "minilm-l6 cross-encoder"),
            "threads": args.threads,
            "torch_version": torch.__version__,
        }
        print(f"{'batch':>6}{'MLX pairs/s':>14}{'torch pairs/s':>15}{'ratio':>8}{'per CPU-s':>11}")
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            pairs = [(query, d) for d in docs]

            def run_mlx(batch: int = batch) -> object:
                return engine.score(query, docs, batch_size=batch)

            def run_torch(batch: int = batch, pairs: list = pairs) -> object:
                return st_model.predict(pairs, batch_size=batch)

            run_mlx()
            run_torch()  # warm-up
            timings: dict[str, list[tuple[float, float]]] = {"mlx": [], "torch": []}
            for _ in range(args.rounds):
                timings["mlx"].append(time_round(run_mlx))
                timings["torch"].append(time_round(run_torch))
            wall = {k: len(docs) / statistics.median(t[0] for t in v) for k, v in timings.items()}
            cpu = {k: len(docs) / statistics.median(t[1] for t in v) for k, v in timings.items()}
            diff = max(
                abs(a - b)
                for a, b in zip(run_mlx().scores, run_torch().tolist(), strict=True)  # type: ignore[attr-defined]
            )
            ratio, ratio_cpu = wall["mlx"] / wall["torch"], cpu["mlx"] / cpu["torch"]
            print(
                f"{batch:>6}{wall['mlx']:>14.1f}{wall['torch']:>15.1f}{ratio:>8.2f}"
                f"{ratio_cpu:>11.2f}   max |score diff| {diff:.1e}"
            )
            results[f"batch_{batch}"] = {
                "mlx_pairs_per_s": round(wall["mlx"], 1),
                "torch_pairs_per_s": round(wall["torch"], 1),
                "ratio": round(ratio, 3),
                "ratio_per_cpu_s": round(ratio_cpu, 3),
                "max_score_difference": diff,
            }
        engine.close()
    print(
        f"({len(docs)} pairs, median of {args.rounds} rounds, threads: {args.threads or 'default'})"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
