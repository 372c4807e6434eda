"""Model store benchmark: pull throughput, ``mlxi --help`` time, quantize overhead.

Prints three figures against their references:

- pull: our ``pull`` (download, sha256 of every file, manifest) relative to a raw
  ``snapshot_download`` of the same repo from the same loopback Hub (target >= 0.95);
- ``mlxi --help`` wall time in a fresh process (target < 0.5 s);
- quantize: ``quantize_model`` time divided by ``mlx_lm.convert`` on the same model
  (target <= 1.05).

Run: ``.venv/bin/python bench/bench_store.py [--hidden 512 --layers 8 --repeat 3]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx_integrations  # noqa: F401  (BLAS preload before mlx.core)
from mlx_integrations.models import ModelStore, pull, quantize_model
from tests.support.fake_hub import FakeHub
from tests.support.tiny_models import build_tiny_model


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_pull(model: Path, work: Path, repeat: int) -> tuple[float, float, int]:
    """Best seconds of a raw snapshot_download and of our pull, cold caches each time."""
    from huggingface_hub import snapshot_download

    from mlx_integrations.models.hub import MODEL_FILE_PATTERNS

    size = sum(f.stat().st_size for f in model.iterdir())
    raw, ours = [], []
    with FakeHub() as hub:
        hub.add_repo("bench/model", model)
        for i in range(repeat):
            cache_raw, cache_ours = work / f"hf-raw-{i}", work / f"hf-ours-{i}"
            raw.append(
                _timed(
                    lambda c=cache_raw: snapshot_download(
                        "bench/model",
                        endpoint=hub.url,
                        cache_dir=c,
                        allow_patterns=list(MODEL_FILE_PATTERNS),
                    )
                )
            )
            store = ModelStore(work / f"store-{i}")
            ours.append(
                _timed(
                    lambda s=store, c=cache_ours: pull(
                        "bench/model", store=s, endpoint=hub.url, cache_dir=c
                    )
                )
            )
            shutil.rmtree(cache_raw)
            shutil.rmtree(cache_ours)
    return min(raw), min(ours), size


def bench_help(repeat: int) -> tuple[float, float]:
    """Best and median wall time of ``mlxi --help`` in a fresh process."""
    exe = Path(sys.executable).with_name("mlxi")
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([str(exe), "--help"], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def bench_quantize(model: Path, work: Path, repeat: int) -> tuple[float, float]:
    """Best seconds of mlx_lm.convert and of quantize_model (4 bits, group 64)."""
    from mlx_lm.convert import convert

    ref, ours = [], []
    store = ModelStore(work / "store-q")
    for i in range(repeat):
        out = work / f"convert-{i}"
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            ref.append(
                _timed(
                    lambda o=out: convert(
                        str(model), str(o), quantize=True, q_bits=4, q_group_size=64
                    )
                )
            )
            ours.append(
                _timed(
                    lambda n=f"q-{i}": quantize_model(model, n, bits=4, group_size=64, store=store)
                )
            )
        shutil.rmtree(out)
    return min(ref), min(ours)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=6)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = build_tiny_model(
            work / "model",
            hidden_size=args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=8,
            num_key_value_heads=4,
        )
        raw, ours, size = bench_pull(model, work, args.repeat)
        mb = size / 1e6
        print(f"model: hidden {args.hidden}, {args.layers} layers, {mb:.1f} MB")
        print(
            f"pull        raw snapshot_download {mb / raw:8.1f} MB/s   "
            f"mlxi pull {mb / ours:8.1f} MB/s   ratio {raw / ours:.3f}  (target >= 0.95)"
        )
        best, median = bench_help(max(5, args.repeat))
        print(f"mlxi --help best {best:.3f} s   median {median:.3f} s   (target < 0.5 s)")
        ref, q = bench_quantize(model, work, args.repeat)
        print(
            f"quantize    mlx_lm.convert {ref:.3f} s   quantize_model {q:.3f} s   "
            f"ratio {q / ref:.3f}  (target <= 1.05)"
        )


if __name__ == "__main__":
    main()
