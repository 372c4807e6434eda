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
N threads (OpenBLAS for MLX, intra-op threads for torch). ``--json FILE`` writes the
figures with the date, commit and command (bench/harness.py).
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from harness import alternate, parser, ratio, save

REPO = Path(__file__).resolve().parents[1]


def make_pairs(count: int, seed: int = 0) -> tuple[str, list[str]]:
    """One query and ``count`` documents of 8 to 80 words, like retrieved chunks."""
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
    p = parser(__doc__, rounds=3)
    p.add_argument("--model", type=Path, help="cross-encoder folder (default: see above)")
    p.add_argument("--pairs", type=int, default=256)
    p.add_argument("--batch-sizes", default="1,32,256", help="comma-separated")
    p.add_argument("--threads", type=int, help="threads for each half (default: theirs)")
    args = p.parse_args()
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
            # Sides take turns, the first rotating, so that load falls on both alike.
            timings = alternate(
                {"mlx": partial(time_round, run_mlx), "torch": partial(time_round, run_torch)},
                args.rounds,
            )
            wall = {k: len(docs) / statistics.median(t[0] for t in v) for k, v in timings.items()}
            cpu = {k: len(docs) / statistics.median(t[1] for t in v) for k, v in timings.items()}
            diff = max(
                abs(a - b)
                for a, b in zip(run_mlx().scores, run_torch().tolist(), strict=True)  # type: ignore[attr-defined]
            )
            ratio_wall, ratio_cpu = wall["mlx"] / wall["torch"], cpu["mlx"] / cpu["torch"]
            # Pairs/s of a round is the inverse of its seconds: torch's seconds over MLX's.
            per_round = ratio([t[0] for t in timings["torch"]], [t[0] for t in timings["mlx"]])
            print(
                f"{batch:>6}{wall['mlx']:>14.1f}{wall['torch']:>15.1f}{ratio_wall:>8.2f}"
                f"{ratio_cpu:>11.2f}   per round {per_round}, max |score diff| {diff:.1e}"
            )
            results[f"batch_{batch}"] = {
                "mlx_pairs_per_s": round(wall["mlx"], 1),
                "torch_pairs_per_s": round(wall["torch"], 1),
                "ratio": round(ratio_wall, 3),
                "ratio_per_cpu_s": round(ratio_cpu, 3),
                "ratio_per_round": str(per_round),
                "max_score_difference": diff,
            }
        engine.close()
    print(
        f"({len(docs)} pairs, median of {args.rounds} rounds, threads: {args.threads or 'default'})"
    )
    save(args.json, "bench_rerank", results)


if __name__ == "__main__":
    main()
