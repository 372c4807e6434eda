"""Time to first token of an agent prompt in a fresh process: disk tier against cold prefill.

An agent's prompt is mostly its system prompt and tool definitions, the same on every
request; here about ``--tokens`` (4,000) tokens of them, then a short question. Each
measurement is a new Python process that loads the model (not timed), then times one
``stream_chat`` from the call to its first chunk:

- **cold**: an engine without ``cache_dir`` prefills the whole prompt;
- **disk**: an engine with ``cache_dir`` filled by an earlier process that served the
  same system prompt and tools with another question (the disk tier kept the longest
  prefill-piece-aligned prefix of that prompt), so only the rest is prefilled;
- **shared**: the same, filled by an earlier process that served two other questions
  (the second shared the system prompt and tools with the first: the disk tier kept
  that shared prefix);
- **warm**: the same, with the folder filled by ``warm_disk_cache`` (``mlxi warm
  --cache-dir``), which stores the exact prefix of the system prompt and tools.

The four run alternating, ``--rounds`` times, in one run, each on a copy of its filled
folder; reported are the medians and the ratio of each to cold (target: disk <= 0.2x).
The process that fills the disk tier also reports what a write costs the owner thread
(the views of the KV it hands the writer) and the writer thread (the file write). Greedy replies of the disk and warm
processes are checked against the cold one's.

Runs on a tiny random model (always) and on SmolLM2-135M-Instruct (``--smollm``; the
model of ``tests/support/smollm.py``), on the CPU.

Run: ``.venv/bin/python bench/bench_disk_cache.py [--smollm] [--rounds 3] [--tokens 4000]
[--json FILE]``
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import alternate, compare, parser, ratio, save

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SYSTEM = (
    "You are an operations assistant for a logistics company. You plan deliveries, "
    "answer questions about orders, warehouses and fleets, and call the tools below "
    "to read or change data. Always check an order's status before changing it. Never "
    "guess identifiers: look them up. Answer in short sentences; give numbers with "
    "their units. When a tool fails, say what failed and what the user can do next."
)
AREAS = ["order", "warehouse", "vehicle", "driver", "route", "invoice", "customer", "parcel"]
ACTIONS = ["get", "list", "update", "cancel", "schedule", "estimate", "audit", "export"]
FILL_QUESTIONS = ["Which orders for Lyon are late today?", "Cancel order 4411 if unpaid."]
QUESTION = "Plan tomorrow's routes for the Paris warehouse, fewest vehicles first."


def tool(area: str, action: str) -> dict[str, Any]:
    """One OpenAI-style tool definition, worded as a real API's."""
    return {
        "type": "function",
        "function": {
            "name": f"{action}_{area}",
            "description": (
                f"{action.capitalize()} a {area} record. Use it when the user asks to "
                f"{action} a {area}; it returns the {area} fields as JSON, or an error "
                f"with a reason when the {area} does not exist or cannot be changed."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    f"{area}_id": {"type": "string", "description": f"The {area}'s id."},
                    "fields": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "Fields to return; all when empty.",
                    },
                    "dry_run": {
                        "type": "boolean",
                        "description": "Only say what would change.",
                    },
                },
                "required": [f"{area}_id"],
            },
        },
    }


def agent_prompt(model: str, target: int) -> tuple[list[dict[str, Any]], int]:
    """Tools (and their count) making a prompt of about ``target`` tokens."""
    from mlx_integrations.engine import SimpleEngine

    engine = SimpleEngine(model)
    tools: list[dict[str, Any]] = []
    pairs = [(a, b) for b in ACTIONS for a in AREAS]
    n = 0
    while n < target and len(tools) < len(pairs):
        tools.append(tool(*pairs[len(tools)]))
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
        n = len(engine.tokenizer.encode(engine.render_prompt(messages, tools=tools)))
    asyncio.run(engine.stop())
    return tools, n


# ---------------------------------------------------------------- child process


async def child(args: argparse.Namespace) -> dict[str, Any]:
    from mlx_integrations.engine import SimpleEngine
    from mlx_integrations.engine.cache import kv_files

    spent = {"snapshot_s": 0.0, "write_s": 0.0}

    def timed(fn: Any, key: str) -> Any:
        def run(*a: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*a)
            finally:
                spent[key] += time.perf_counter() - start

        return run

    kv_files.snapshot = timed(kv_files.snapshot, "snapshot_s")
    kv_files.write_file = timed(kv_files.write_file, "write_s")
    tools = json.loads(Path(args.tools).read_text())
    options = {"cache_dir": args.cache_dir} if args.cache_dir else {}
    engine = SimpleEngine(args.model, **options)
    await engine.start()  # the weights load before the clock starts
    for question in args.question:  # the last one is timed
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        start = time.perf_counter()
        ttft = None
        chunks = []
        async for chunk in engine.stream_chat(messages, tools=tools, max_tokens=8, temperature=0):
            ttft = time.perf_counter() - start if ttft is None else ttft
            chunks.append(chunk)
        out = chunks[-1]
    await engine.stop()  # writes out what is queued
    disk = engine.get_cache_stats()["disk"]
    return {
        "ttft_s": ttft,
        "tokens": out.tokens,
        "prompt_tokens": out.prompt_tokens,
        "cached_tokens": out.cached_tokens,
        "load_s": disk["load_seconds"] if disk else 0.0,
        "files": disk["entry_count"] if disk else 0,
        **spent,
    }


def run_child(
    model: str, tools: Path, questions: list[str], cache_dir: str | None
) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", "--model", model, "--tools", str(tools)]
    for question in questions:
        cmd += ["--question", question]
    cmd += ["--cache-dir", cache_dir] if cache_dir else []
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------- parent


def bench(model: str, label: str, rounds: int, target: int) -> dict[str, Any]:
    from mlx_integrations.engine import warm_disk_cache

    tools, n = agent_prompt(model, target)
    with tempfile.TemporaryDirectory() as tmp:
        tools_file = Path(tmp) / "tools.json"
        tools_file.write_text(json.dumps(tools))
        dirs = {
            "cold": None,
            "disk": str(Path(tmp) / "disk"),
            "shared": str(Path(tmp) / "shared"),
            "warm": str(Path(tmp) / "warm"),
        }
        fill = run_child(model, tools_file, FILL_QUESTIONS[:1], dirs["disk"])
        fill2 = run_child(model, tools_file, FILL_QUESTIONS, dirs["shared"])
        warm = warm_disk_cache(model, dirs["warm"], system=SYSTEM, tools=tools)
        print(
            f"\n{label}: prompt {n} tokens ({len(tools)} tools); a process of one request "
            f"wrote {fill['files']} file: owner thread {fill['snapshot_s'] * 1e3:.1f} ms, "
            f"writer thread {fill['write_s'] * 1e3:.1f} ms; one of two requests wrote "
            f"{fill2['files']} files; warm_disk_cache stored {warm.tokens} tokens"
        )
        runs_made = 0

        def side(name: str) -> dict[str, Any]:
            # Each run on a copy of the filled folder: it finds what the fillers left,
            # not what an earlier run of the same question wrote.
            nonlocal runs_made
            runs_made += 1
            folder = dirs[name]
            if folder is not None:
                folder = str(shutil.copytree(folder, Path(tmp) / f"{name}-{runs_made}"))
            return run_child(model, tools_file, [QUESTION], folder)

        sides = alternate({name: functools.partial(side, name) for name in dirs}, rounds)
        cold_ttft = [x["ttft_s"] for x in sides["cold"]]
        figures: dict[str, Any] = {"prompt_tokens": n, "tools": len(tools)}
        for name, runs in sides.items():
            ttft = [x["ttft_s"] for x in runs]
            same = all(x["tokens"] == sides["cold"][0]["tokens"] for x in runs)
            print(
                f"  {name:6s} TTFT {statistics.median(ttft) * 1e3:8.1f} ms  "
                f"{ratio(ttft, cold_ttft)} of cold  cached "
                f"{'/'.join(str(x['cached_tokens']) for x in runs)} of "
                f"{runs[0]['prompt_tokens']} tokens, "
                f"load {statistics.median(x['load_s'] for x in runs) * 1e3:.1f} ms, "
                f"greedy reply as cold: {same}"
            )
            figures[name] = compare(ttft, cold_ttft) | {"greedy_as_cold": same}
        return figures


def main() -> None:
    p = parser(__doc__, rounds=3)
    p.add_argument("--tokens", type=int, default=4000)
    p.add_argument("--smollm", action="store_true", help="also SmolLM2-135M (slow)")
    p.add_argument("--skip-tiny", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--tools", help=argparse.SUPPRESS)
    p.add_argument("--question", action="append", help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    import mlx_integrations  # noqa: F401  (BLAS preload before mlx.core)

    if args.child:
        print(json.dumps(asyncio.run(child(args))))
        return
    from tests.support.tiny_models import build_tiny_model

    figures: dict[str, Any] = {}
    if not args.skip_tiny:
        with tempfile.TemporaryDirectory() as tmp:
            model = build_tiny_model(
                Path(tmp) / "tiny",
                hidden_size=256,
                num_hidden_layers=4,
                tie_word_embeddings=False,
                max_position_embeddings=16384,
            )
            figures["tiny"] = bench(
                str(model), "tiny llama (hidden 256, 4 layers)", args.rounds, args.tokens
            )
    if args.smollm:
        from tests.support.smollm import ensure_smollm2

        with tempfile.TemporaryDirectory() as tmp:
            # A copy of its own: a test that converts the shared folder again meanwhile
            # would change the weights' identity, and the disk tier would start afresh.
            model = shutil.copytree(ensure_smollm2(), Path(tmp) / "smollm2-135m-instruct")
            figures["smollm2"] = bench(
                str(model), "SmolLM2-135M-Instruct", args.rounds, args.tokens
            )
    save(args.json, "bench_disk_cache", figures)


if __name__ == "__main__":
    main()
