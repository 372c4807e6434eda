"""Soak: thousands of mixed requests in one process, under a memory budget that holds
one chat model at a time.

``--requests`` (2,000) requests go through ``--concurrency`` (4) workers, drawn at
random (``--seed``) from this mix, over two chat models (a tiny random model and a
second of another shape and seed, or SmolLM2-135M-Instruct with ``--smollm``) and the
MiniLM embedder:

- 30% chat (``ChatMLX.ainvoke``), either model;
- 12% tools with ``tool_choice`` forced to one function;
- 12% structured output (``response_format`` with a JSON schema);
- 25% streams, 30% of them cancelled after their third chunk (the consumer leaves);
- 20% embeddings (a query, or a few documents);
- 1% requests too large for the memory left (``max_tokens`` of a whole context):
  refused with ``RequestTooLarge`` before prefill, by design.

The budget (``set_memory_budget``) holds the embedder, one chat model with its prefix
cache, and the KV of the requests in flight, not both chat models: each switch of model
unloads the least recently used idle one. Checked at the end:

- every request is accounted for: completed, cancelled by design, or refused by design;
  nothing else failed; the engines' own tallies agree with the requests sent to them;
- process RSS, MLX active memory and MLX cache memory plateau: the largest sample of
  the last quarter of the run is within 5% of the second quarter's (a leak grows it).

Run: ``.venv/bin/python bench/bench_soak.py [--requests 2000] [--concurrency 4]
[--smollm] [--keep-alive 2s]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
CITY = {
    "type": "json_schema",
    "json_schema": {
        "name": "city",
        "schema": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 12},
                "population": {"type": "integer", "minimum": 0, "maximum": 99_999_999},
            },
            "required": ["name", "population"],
        },
    },
}
QUESTIONS = [
    "What is the capital of France?",
    "What is the weather in Paris?",
    "Hello! How can I help you today?",
    "Name a city in Italy and its population.",
    "The quick brown fox jumps over the lazy dog. Why?",
]
KINDS = [
    ("chat", 0.30),
    ("tools", 0.12),
    ("structured", 0.12),
    ("stream", 0.25),
    ("embed", 0.20),
    ("oversized", 0.01),
]


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    by_kind: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    sent: Counter[str] = field(default_factory=Counter)  # chat requests per model
    json_valid: int = 0
    tool_calls: int = 0
    latencies: list[float] = field(default_factory=list)
    samples: list[tuple[int, float, float, float, float]] = field(default_factory=list)


def rss_mib() -> float:
    """The process's resident set now (Linux /proc; the peak elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        import os

        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sample(tally: Tally, done: int) -> None:
    """RSS, MLX active and cache memory, and what the budget counts, in MiB."""
    import mlx.core as mx

    from mlx_integrations.engine import pool

    mib = 2**20
    tally.samples.append(
        (
            done,
            rss_mib(),
            mx.get_active_memory() / mib,
            mx.get_cache_memory() / mib,
            pool.memory_in_use() / mib,
        )
    )


def models(smollm: bool, folder: Path) -> tuple[Path, Path, Path]:
    from tests.support.minilm import ensure_minilm
    from tests.support.tiny_models import build_tiny_model

    # About 24 MiB each, so that the budget's room for requests in flight is less than a
    # model. A long context window: a request can ask for more KV than any budget.
    a = build_tiny_model(
        folder / "chat-a", hidden_size=384, num_hidden_layers=4, num_attention_heads=6,
        num_key_value_heads=2, max_position_embeddings=2**20,
    )  # fmt: skip
    if smollm:
        from tests.support.smollm import ensure_smollm2

        b = ensure_smollm2()
    else:
        b = build_tiny_model(
            folder / "chat-b", hidden_size=256, num_hidden_layers=8, num_attention_heads=4,
            num_key_value_heads=2, seed=7, tie_word_embeddings=False,
        )  # fmt: skip
    return a, b, ensure_minilm()


async def one(kind: str, which: int, rng: random.Random, llms: list[Any], emb: Any, t: Tally):
    from langchain_core.messages import HumanMessage

    from mlx_integrations.runtime.residency import RequestTooLarge

    question = rng.choice(QUESTIONS)
    llm = llms[which]
    started = time.perf_counter()
    try:
        if kind == "chat":
            t.sent[f"model{which}"] += 1
            await llm.ainvoke([HumanMessage(question)])
        elif kind == "tools":
            t.sent[f"model{which}"] += 1
            bound = llm.bind_tools([WEATHER], tool_choice="get_weather")
            reply = await bound.ainvoke([HumanMessage(question)], max_tokens=48)
            t.tool_calls += bool(reply.tool_calls)
        elif kind == "structured":
            t.sent[f"model{which}"] += 1
            reply = await llm.ainvoke([HumanMessage(question)], response_format=CITY, max_tokens=48)
            try:
                json.loads(reply.content)
                t.json_valid += 1
            except ValueError:
                pass  # cut at max_tokens: a complete reply, just a short one
        elif kind == "stream":
            t.sent[f"model{which}"] += 1
            cancel = rng.random() < 0.30
            chunks = 0
            async for _ in llm.astream([HumanMessage(question)]):
                chunks += 1
                if cancel and chunks == 3:
                    break  # the consumer leaves: the request is aborted on the engine
            if cancel and chunks == 3:
                t.outcomes["cancelled"] += 1
                return
        elif kind == "embed":
            if rng.random() < 0.5:
                await emb.aembed_query(question)
            else:
                await emb.aembed_documents(rng.sample(QUESTIONS, 3))
        elif kind == "oversized":
            try:
                await llms[0].ainvoke([HumanMessage(question)], max_tokens=2**20 - 64)
            except RequestTooLarge:
                t.outcomes["refused"] += 1
                return
            t.unexpected.append("an oversized request was not refused")
            return
        t.outcomes["completed"] += 1
        t.latencies.append(time.perf_counter() - started)
    except Exception as exc:  # counted, never hidden
        t.unexpected.append(f"{kind} on model{which}: {type(exc).__name__}: {exc}")


async def run(args: argparse.Namespace) -> int:
    import mlx_integrations  # noqa: F401  (BLAS preload before MLX)
    from mlx_integrations.engine import pool
    from mlx_integrations.langchain import ChatMLX, MLXEmbeddings
    from mlx_integrations.runtime.memory import weights_on_disk

    folder = Path(tempfile.mkdtemp(prefix="soak-"))
    a, b, minilm = models(args.smollm, folder)
    cache_mb = 2
    llms = [
        ChatMLX(
            model=str(path),
            max_tokens=args.max_tokens,
            temperature=0.7,
            keep_alive=args.keep_alive,
            engine_options={"cache_memory_mb": cache_mb},
        )
        for path in (a, b)
    ]
    emb = MLXEmbeddings(model_name=str(minilm), keep_alive=args.keep_alive)
    chat_sizes = [weights_on_disk(a), weights_on_disk(b)]
    # Room for the embedder, the larger chat model, its prefix cache and the KV of the
    # requests in flight (a context of 512 tokens each), not for both chat models.
    for llm in llms:  # loads both (one request each): their KV estimates are known
        await llm.ainvoke("warm up")
    kv = max(llm.engine.kv_cache_bytes(512) or 2**20 for llm in llms)
    budget = (
        weights_on_disk(minilm)
        + max(chat_sizes)
        + cache_mb * 2**20
        + args.concurrency * kv
        + min(chat_sizes) // 2
    )
    pool.set_memory_budget(budget, wait_s=120)
    print(
        f"models: {a.name} {chat_sizes[0] / 2**20:.1f} MiB, {b.name} "
        f"{chat_sizes[1] / 2**20:.1f} MiB, {minilm.name} {weights_on_disk(minilm) / 2**20:.1f} "
        f"MiB; budget {budget / 2**20:.1f} MiB; {args.requests} requests, "
        f"{args.concurrency} workers",
        flush=True,
    )

    rng = random.Random(args.seed)
    kinds, weights = zip(*KINDS, strict=True)
    plan = [(rng.choices(kinds, weights)[0], rng.randrange(2)) for _ in range(args.requests)]
    queue: asyncio.Queue[tuple[int, str, int]] = asyncio.Queue()
    for i, (kind, which) in enumerate(plan):
        queue.put_nowait((i, kind, which))
    tally = Tally()
    tally.by_kind.update(k for k, _ in plan)
    done = 0
    every = max(1, args.requests // 100)
    sample(tally, 0)
    started = time.perf_counter()

    async def worker(seed: int) -> None:
        nonlocal done
        wrng = random.Random(seed)
        while True:
            try:
                _, kind, which = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await one(kind, which, wrng, llms, emb, tally)
            done += 1
            if done % every == 0:
                sample(tally, done)
            if done % max(1, args.requests // 10) == 0:
                print(
                    f"  {done}/{args.requests} in {time.perf_counter() - started:.0f} s", flush=True
                )

    await asyncio.gather(*(worker(args.seed * 1000 + w) for w in range(args.concurrency)))
    elapsed = time.perf_counter() - started
    sample(tally, done)
    return report(tally, args, plan, llms, emb, elapsed)


def report(
    t: Tally, args: argparse.Namespace, plan: list[tuple[str, int]], llms: Any, emb: Any, s: float
) -> int:
    from mlx_integrations.engine import pool

    budget_mib = (pool.memory_budget() or 0) / 2**20
    total = len(plan)
    accounted = t.outcomes["completed"] + t.outcomes["cancelled"] + t.outcomes["refused"]
    print(f"\n{total} requests in {s:.0f} s ({total / s:.1f}/s)")
    print("  mix:", dict(sorted(t.by_kind.items())))
    print("  outcomes:", dict(t.outcomes), f"unexpected failures: {len(t.unexpected)}")
    print(f"  tool calls {t.tool_calls}/{t.by_kind['tools']}, valid JSON "
          f"{t.json_valid}/{t.by_kind['structured']} (others cut at max_tokens)")  # fmt: skip
    if t.latencies:
        lat = sorted(t.latencies)
        print(
            f"  latency p50 {statistics.median(lat) * 1000:.0f} ms, "
            f"p95 {lat[int(0.95 * (len(lat) - 1))] * 1000:.0f} ms"
        )
    ok = not t.unexpected and accounted == total
    for line in t.unexpected[:10]:
        print("  UNEXPECTED:", line)
    # The engines' own tallies: every chat request reached its engine once.
    for i, llm in enumerate(llms):
        stats = llm.engine.get_stats()
        seen = stats["num_requests_processed"] + stats["num_requests_aborted"]
        res = stats["residency"]
        print(
            f"  model{i}: sent {t.sent[f'model{i}']}, engine counted {seen} "
            f"(+{stats['num_requests_failed']} failed), loads {res['loads']}, "
            f"evictions {res['evictions']}, unloads {res['unloads']}, "
            f"refused for memory {res['memory_rejections']}"
        )
        expected = t.sent[f"model{i}"] + 1  # and the warm-up request
        if seen != expected or stats["num_requests_failed"]:
            print(f"  MISMATCH on model{i}: {seen} counted, {expected} sent")
            ok = False
    er = emb._get_engine().residency_stats()
    print(f"  embedder: loads {er['loads']}, evictions {er['evictions']}")
    print("  resident at the end:", [(m["name"], m["memory_bytes"] // 2**20) for m in
                                    pool.resident_models()])  # fmt: skip
    # Plateau: the largest sample of each quarter (what the system must hold); the
    # last quarter's within 5% (or 1 MiB) of the second's. Which models happen to be
    # loaded at a sample moves the medians, so a leak is looked for in what MLX holds
    # beyond what the residency counts (weights, prefix caches, reserved KV), too.
    quarters: list[list[tuple[int, float, float, float, float]]] = [[], [], [], []]
    for row in t.samples:
        quarters[min(3, row[0] * 4 // max(1, total))].append(row)
    names = ("RSS", "MLX active", "MLX cache", "budget counts", "active - counted")

    def values(rows: list[tuple[int, float, float, float, float]], i: int) -> list[float]:
        return [r[2] - r[4] for r in rows] if i == 5 else [r[i] for r in rows]

    print(f"  memory by quarter, MiB, max (median) of samples; budget {budget_mib:.1f}:")
    print("       " + "".join(f"{n:>19}" for n in names))
    peaks, medians = [], []
    for q, rows in enumerate(quarters, 1):
        top = [max(values(rows, i)) for i in range(1, 6)]
        med = [statistics.median(values(rows, i)) for i in range(1, 6)]
        peaks.append(top)
        medians.append(med)
        cells = "".join(f"{x:10.1f} ({m:6.1f})" for x, m in zip(top, med, strict=True))
        print(f"    Q{q}:{cells}  [{len(rows)} samples]")
    checks = [(peaks, 0, "RSS max"), (peaks, 1, "MLX active max"), (peaks, 2, "MLX cache max"),
              (medians, 4, "MLX active beyond what is counted, median")]  # fmt: skip
    for table, i, name in checks:
        second, last = table[1][i], table[3][i]
        grew = (last - second) / abs(second) if second else 0.0
        flat = last <= second * 1.05 or last - second < 1.0
        print(f"  {name}: Q4 vs Q2 {grew * 100:+.1f}% -> {'plateau' if flat else 'GROWS'}")
        ok = ok and flat
    over = max(r[4] for r in t.samples) - budget_mib
    print(f"  largest sum the budget counts: {over:+.1f} MiB from the budget")
    print("RESULT:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smollm", action="store_true", help="SmolLM2-135M as the second model")
    parser.add_argument("--keep-alive", default=None, help="keep-alive of every model ('2s')")
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
