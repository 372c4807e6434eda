"""How bench_gpu.py reports: one-line summaries, the README's table and the tokens/s plot,
all from its JSON; and joining runs that measured different shapes or parts."""

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


def plot(results: dict[str, Any], path: Path) -> bool:
    """Aggregate tokens/s against concurrency, ours and raw, one line pair per shape.

    A run without a batched part has nothing to draw: no file then (False)."""
    series = []  # (shape, concurrency, ours, raw)
    for shape, r in results["shapes"].items():
        batched = r.get("batched") or {}
        cs = sorted(int(c) for c in batched if isinstance(batched[c], dict))
        if cs:
            ours, raw = (
                [batched[str(c)][f"{side}_median"] for c in cs] for side in ("ours", "raw")
            )
            series.append((shape, cs, ours, raw))
    if not series:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    colors = ["tab:blue", "tab:orange", "tab:green"]
    for color, (shape, cs, ours, raw) in zip(colors, series, strict=False):
        ax.plot(cs, ours, "-", marker="o", color=color, label=f"{shape} BatchedEngine")
        ax.plot(cs, raw, "--", marker="o", color=color, label=f"{shape} mlx-lm batch_generate")
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
    return True


def brief(part: str, r: dict[str, Any]) -> str:
    """One line for the log."""
    if "error" in r:
        error = "ERROR " + r["error"].strip().splitlines()[-1][:300]
        if part == "ttft" and r.get("reps_done"):  # what it saved before it stopped
            from _gpu_ttft import brief_ttft

            return f"{error}; after {r['reps_done']} repetition(s): {brief_ttft(r)}"
        return error
    if part == "ttft":
        from _gpu_ttft import brief_ttft

        return brief_ttft(r)
    if part == "single":
        return (
            f"decode {summary(r['decode'])}; ttft {summary(r['ttft'])}; "
            f"same tokens {r['same_tokens']} (raw to raw {r['raw_same_tokens']})"
        )
    if part == "batched":
        return "; ".join(
            f"c={c} {v['ratio']:.3f} (first runs: ours {v['first']['ours_tps']:.0f}, "
            f"raw {v['first']['raw_tps']:.0f} tok/s)"
            for c, v in r.items()
            if isinstance(v, dict) and "first" in v
        )
    if part == "prefix":
        return f"{summary(r)} cached {r['cached_tokens']}"
    if part == "graph":
        rows = []
        for setting, v in r.get("summary", {}).items():
            if not isinstance(v, dict):
                continue
            vs = v.get("raw_vs_default", {}).get("median")
            rows.append(
                f"{setting}: raw {v['raw_median']:.0f} ours {v['ours_median']:.0f} tok/s, "
                f"ours/raw {v['ratio']:.3f}" + (f", raw vs default {vs:.3f}" if vs else "")
            )
        same = r.get("summary", {}).get("same_tokens_across_settings")
        return "; ".join(rows) + f"; same tokens {same}"
    if part == "lookup":
        c1 = r.get("c1", {})
        return (
            f"c1 {summary(c1)} accepted {c1.get('accepted')}/{c1.get('drafted')}; "
            f"c8 {summary(r.get('c8', {}))}"
        )
    return json.dumps(r)


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from several runs: the first's header, every run's shapes and parts."""
    joined = dict(runs[0]) | {"shapes": {}, "runs": [r.get("date") for r in runs]}
    joined["date"] = "; ".join(str(r.get("date")) for r in runs)
    for run in runs:
        for shape, parts in run["shapes"].items():
            joined["shapes"].setdefault(shape, {}).update(parts)
    return joined


def _cell(s: dict[str, Any] | None, unit: str = "tok/s", digits: int = 0) -> str:
    """``ratio (low to high; ours / raw unit)`` for one measurement, or 'not run'."""
    if not s or s.get("ratio") is None:
        return "not run"
    sides = f"{s['ours_median']:,.{digits}f} / {s['raw_median']:,.{digits}f} {unit}"
    return f"{s['ratio']:.2f} ({s['ratio_low']:.2f} to {s['ratio_high']:.2f}; {sides})"


def table(results: dict[str, Any]) -> str:
    """The README's Markdown table: one column per shape, ours / raw in every cell."""
    shapes = [s for s in results["shapes"] if s != "smollm2"]
    got = [results["shapes"][s] for s in shapes]

    def row(label: str, cells: list[str]) -> str:
        return f"| {label} | " + " | ".join(cells) + " |"

    def ms(s: dict[str, Any] | None) -> dict[str, Any] | None:
        if not s or s.get("ratio") is None:
            return s
        return s | {"ours_median": s["ours_median"] * 1e3, "raw_median": s["raw_median"] * 1e3}

    lines = [row("what", [s.removeprefix("qwen2.5-") + " shape" for s in shapes])]
    lines.append("| --- " * (len(shapes) + 1) + "|")
    single = [g.get("single", {}) for g in got]
    lines.append(
        row(
            "decode tok/s, `SimpleEngine` / `mlx_lm.stream_generate`",
            [_cell(x.get("decode")) for x in single],
        )
    )
    # A ttft part stopped by its budget keeps the repetitions it finished: said so.
    stopped = [
        f" (stopped after {t['reps_done']} of {t.get('reps')} repetitions)"
        if "error" in t and t.get("reps_done")
        else ""
        for t in (g.get("ttft") or {} for g in got)
    ]
    for length in (results["shapes"][shapes[0]].get("ttft") or {}).get("lengths", {}):
        rows = [((g.get("ttft") or {}).get("lengths") or {}).get(length, {}) for g in got]

        def ttft_cells(key: str, rows: list[dict[str, Any]] = rows) -> list[str]:
            return [
                _cell(ms(x.get(key)), "ms", 1) + why for x, why in zip(rows, stopped, strict=True)
            ]

        lines.append(
            row(
                f"TTFT, new prompt of about {int(length):,} tokens (no length twice in a process), "
                "`SimpleEngine` / `stream_generate`",
                ttft_cells("cold"),
            )
        )
        lines.append(row("the same, a second prompt of that length", ttft_cells("repeat")))
        if any("cold_unpadded" in x for x in rows):
            lines.append(
                row(
                    "new prompt, `SimpleEngine(prefill_buckets=False, warmup_shapes=False)` / "
                    "`stream_generate`",
                    ttft_cells("cold_unpadded"),
                )
            )
    lines.append(
        row(
            "TTFT of one 32-word prompt run again and again (not cold)",
            [_cell(ms(x.get("ttft")), "ms", 1) for x in single],
        )
    )
    for c in results.get("concurrency", []):
        label = (
            "total tok/s, `BatchedEngine(max_num_seqs=c)` / `batch_generate` (batch sizes c), c = 1"
            if c == 1
            else f"c = {c}"
        )
        lines.append(row(label, [_cell((g.get("batched") or {}).get(str(c))) for g in got]))
    lines.append(
        row(
            "TTFT after a cached 1,024-token prefix, prefix cache / raw KV reuse",
            [_cell(ms(g.get("prefix")), "ms", 0) for g in got],
        )
    )
    graphs = [(g.get("graph") or {}).get("summary", {}) for g in got]
    for setting in (results["shapes"][shapes[0]].get("graph") or {}).get("settings", []):
        name = "unset" if setting == "default" else setting
        cells = []
        for summary_ in graphs:
            v = summary_.get(setting)
            if not v:
                cells.append("not run")
                continue
            cell = f"raw {v['raw_median']:.0f}, ours {v['ours_median']:.0f} tok/s; ours/raw " + (
                f"{v['ratio']:.2f} ({v['ratio_low']:.2f} to {v['ratio_high']:.2f})"
            )
            for side in ("raw", "ours"):
                if vs := v.get(f"{side}_vs_default"):
                    cell += (
                        f"; {side} / unset {vs['median']:.2f} ({vs['low']:.2f} to {vs['high']:.2f})"
                    )
            cells.append(cell)
        lines.append(row(f"single stream, `MLX_MAX_OPS_PER_BUFFER` {name}", cells))
    for c in results.get("concurrency", []):
        firsts = [((g.get("batched") or {}).get(str(c)) or {}).get("first") for g in got]
        cells = [
            f"ours {f['ours_tps']:,.0f} / raw {f['raw_tps']:,.0f} tok/s ({f['first_side']} "
            f"first), slowest first token {f['ours_slowest_first_token_s']:.2f} s"
            if f
            else "not run"
            for f in firsts
        ]
        lines.append(row(f"first run at c = {c} (new shapes; the engine on a new thread)", cells))
    return "\n".join(lines)
