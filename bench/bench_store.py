"""Model store benchmark: pull throughput, ``mlxi --help`` time, quantize overhead.

Prints three figures against their references:

- pull: our ``pull`` (download, sha256 of every file, manifest) relative to a raw
  ``snapshot_download`` of the same repo from the same loopback Hub (target >= 0.95);
- ``mlxi --help`` wall time in a fresh process (target < 0.5 s);
- quantize: ``quantize_model`` time divided by ``mlx_lm.convert`` on the same model
  (target <= 1.05).

The loopback Hub runs in a process of its own (a remote Hub does not share the client's
interpreter); runs are interleaved and both best and median ratios are printed.

Run: ``.venv/bin/python bench/bench_store.py [--hidden 512 --layers 8 --repeat 6]``
or ``--model FOLDER`` for a real model (e.g. SmolLM2-135M converted by the tests).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx_integrations  # noqa: F401  (BLAS preload before mlx.core)
from mlx_integrations.models import ModelStore, pull, quantize_model, remove_model
from mlx_integrations.models.progress import tqdm_bridge
from tests.support.tiny_models import build_tiny_model


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


_HUB_SERVER = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.support.fake_hub import FakeHub
hub = FakeHub().start()
hub.add_repo("bench/model", Path(sys.argv[2]))
print(hub.url, flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def hub_process(model: Path) -> Iterator[str]:
    """The loopback Hub in a process of its own, as a remote Hub would be; yields its URL."""
    root = str(Path(__file__).resolve().parents[1])
    proc = subprocess.Popen(
        [sys.executable, "-c", _HUB_SERVER, root, str(model)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError("the loopback Hub did not start")
        yield url
    finally:
        proc.kill()
        proc.wait()


def bench_pull(model: Path, work: Path, repeat: int) -> tuple[list[float], list[float], int]:
    """Seconds of a raw snapshot_download and of our pull, interleaved, cold caches each time."""
    from huggingface_hub import snapshot_download

    from mlx_integrations.models.hub.pull import MODEL_FILE_PATTERNS

    size = sum(f.stat().st_size for f in model.iterdir() if f.is_file())
    raw, ours = [], []
    with hub_process(model) as url:
        for i in range(repeat):
            cache_raw, cache_ours = work / f"hf-raw-{i}", work / f"hf-ours-{i}"
            store = ModelStore(work / f"store-{i}")

            def run_raw(c: Path = cache_raw) -> None:
                raw.append(
                    _timed(
                        lambda: snapshot_download(
                            "bench/model",
                            endpoint=url,
                            cache_dir=c,
                            allow_patterns=list(MODEL_FILE_PATTERNS),
                            tqdm_class=tqdm_bridge(None),  # draws nothing, as pull's
                        )
                    )
                )

            def run_ours(s: ModelStore = store, c: Path = cache_ours) -> None:
                ours.append(_timed(lambda: pull("bench/model", store=s, endpoint=url, cache_dir=c)))

            # Alternate which goes first, so neither always meets a warmer machine.
            for step in (run_raw, run_ours) if i % 2 == 0 else (run_ours, run_raw):
                step()
            shutil.rmtree(cache_raw)
            shutil.rmtree(cache_ours)
            shutil.rmtree(store.home)
    return raw, ours, size


def bench_help(repeat: int) -> tuple[float, float]:
    """Best and median wall time of ``mlxi --help`` in a fresh process."""
    exe = Path(sys.executable).with_name("mlxi")
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([str(exe), "--help"], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def bench_quantize(model: Path, work: Path, repeat: int) -> tuple[list[float], list[float]]:
    """Seconds of mlx_lm.convert and of quantize_model (4 bits, group 64), interleaved."""
    from mlx_lm.convert import convert

    ref, ours = [], []
    store = ModelStore(work / "store-q")
    for i in range(repeat):
        out = work / f"convert-{i}"

        def run_ref(o: Path = out) -> None:
            ref.append(
                _timed(
                    lambda: convert(str(model), str(o), quantize=True, q_bits=4, q_group_size=64)
                )
            )

        def run_ours(n: str = f"q-{i}") -> None:
            ours.append(
                _timed(lambda: quantize_model(model, n, bits=4, group_size=64, store=store))
            )

        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            # Alternate which goes first, as for pull.
            for step in (run_ref, run_ours) if i % 2 == 0 else (run_ours, run_ref):
                gc.collect()
                step()
        shutil.rmtree(out)
        remove_model(f"q-{i}", store=store)
    return ref, ours


def _ratio_line(label: str, ref: list[float], ours: list[float], invert: bool, target: str) -> str:
    """Best and median of each, and their ratios (throughput ratio when ``invert``)."""
    best = min(ref) / min(ours) if invert else min(ours) / min(ref)
    med_ref, med_ours = statistics.median(ref), statistics.median(ours)
    median = med_ref / med_ours if invert else med_ours / med_ref
    return (
        f"{label}: reference best {min(ref):.3f} s median {med_ref:.3f} s | "
        f"ours best {min(ours):.3f} s median {med_ours:.3f} s | "
        f"ratio best {best:.3f} median {median:.3f}  ({target})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=6)
    parser.add_argument(
        "--model", type=Path, default=None, help="a model folder to use instead of a tiny one"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = args.model or build_tiny_model(
            work / "model",
            hidden_size=args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=8,
            num_key_value_heads=4,
        )
        raw, ours, size = bench_pull(model, work, args.repeat)
        mb = size / 1e6
        what = (
            args.model.name if args.model else f"tiny (hidden {args.hidden}, {args.layers} layers)"
        )
        print(f"model: {what}, {mb:.1f} MB")
        print(
            f"pull throughput {mb / statistics.median(raw):.1f} MB/s raw, "
            f"{mb / statistics.median(ours):.1f} MB/s mlxi (medians)"
        )
        print(_ratio_line("pull mlxi/raw snapshot_download", raw, ours, True, "target >= 0.95"))
        best, median = bench_help(max(5, args.repeat))
        print(f"mlxi --help best {best:.3f} s   median {median:.3f} s   (target < 0.5 s)")
        ref, q = bench_quantize(model, work, args.repeat)
        print(_ratio_line("quantize ours/mlx_lm.convert", ref, q, False, "target <= 1.05"))


if __name__ == "__main__":
    main()
