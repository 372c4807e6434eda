"""How bench_gpu.py reports: one-line summaries and the tokens/s plot, from its JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def summary(s: dict[str, Any]) -> str:
    if s.get("ratio") is None:
        return "no ratio"
    return (
        f"ours {s['ours_median']:10.2f}  raw {s['raw_median']:10.2f}  ratio {s['ratio']:.3f} "
        f"({s['ratio_low']:.3f}-{s['ratio_high']:.3f})"
    )


def plot(results: dict[str, Any], path: Path) -> None:
    """Aggregate tokens/s against concurrency, ours and raw, one line pair per shape."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    colors = ["tab:blue", "tab:orange", "tab:green"]
    for color, (shape, r) in zip(colors, results["shapes"].items(), strict=False):
        batched = r.get("batched") or {}
        cs = sorted(int(c) for c in batched if isinstance(batched[c], dict))
        if not cs:
            continue
        for side, style in (("ours", "-"), ("raw", "--")):
            values = [batched[str(c)][f"{side}_median"] for c in cs]
            label = f"{shape} {'BatchedEngine' if side == 'ours' else 'mlx-lm batch_generate'}"
            ax.plot(cs, values, style, marker="o", color=color, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(results.get("concurrency", [1, 8, 32, 64]))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("concurrent requests (batch size)")
    ax.set_ylabel("generated tokens/s (all requests, prefill included)")
    ax.set_title(f"{results.get('gpu', 'GPU')}: random-weight bf16 models, greedy")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def brief(part: str, r: dict[str, Any]) -> str:
    """One line for the log."""
    if "error" in r:
        return "ERROR " + r["error"].strip().splitlines()[-1][:300]
    if part == "single":
        return (
            f"decode {summary(r['decode'])}; ttft {summary(r['ttft'])}; "
            f"same tokens {r['same_tokens']} (raw to raw {r['raw_same_tokens']})"
        )
    if part == "batched":
        return "; ".join(f"c={c} {v['ratio']:.3f}" for c, v in r.items() if isinstance(v, dict))
    if part == "prefix":
        return f"{summary(r)} cached {r['cached_tokens']}"
    if part == "lookup":
        c1 = r.get("c1", {})
        return (
            f"c1 {summary(c1)} accepted {c1.get('accepted')}/{c1.get('drafted')}; "
            f"c8 {summary(r.get('c8', {}))}"
        )
    return json.dumps(r)
