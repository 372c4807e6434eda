"""Our engines against raw mlx-lm on a GPU, on random-weight Qwen2.5-0.5B and 1.5B shapes.

Each figure is ours over raw measured in one run, the sides alternating which goes
first, after a warm-up of every shape (a GPU compiles kernels for each new shape),
over several repetitions: the median and the spread (lowest, highest) of the
per-repetition ratios.

0. **Time to first token** (``ttft``, bench/_gpu_ttft.py): on prompts new to the
   process, of about ``--ttft-lengths`` tokens (32, 512, 1,700, 4,000), no length
   twice: the cold figure, the repeat-length figure (a second prompt of one length),
   and raw on a new thread (is the GPU's set-up kept per thread?); the engine with the
   device's defaults (``--engine-options`` JSON overrides them), its load and warm-up,
   and beside it the engine without padded prefill pieces (``--no-ttft-unpadded``
   leaves it out).
1. **Single stream**: greedy decode tokens/s (first token to last) of
   ``SimpleEngine.stream_generate`` against ``mlx_lm.stream_generate``, and the time to
   first token of that same 32-word prompt again and again (not a cold prompt: see
   ``ttft``): ``--warmup`` untimed runs a side, then ``--reps`` (9) timed runs a
   side, alternating.
2. **Batched**: ``BatchedEngine(max_num_seqs=c)`` serving ``c`` requests at once
   against ``mlx_lm.batch_generate`` with the same batch sizes (completion and prefill
   batch ``c``), c = 1, 8, 32, 64: generated tokens over wall time, prefill included.
   The first run of each side at each ``c`` (the first side alternating with ``c``) is
   reported apart (``first``: new shapes, and the engine's new owner thread), with the
   engine's slowest first token; the timed runs follow.
3. **Graph size**: the single stream again, raw and ours, under each
   ``MLX_MAX_OPS_PER_BUFFER`` of ``--graph-ops`` (how many operations MLX's CUDA
   backend records into one CUDA graph), each setting in its own processes, rotated.
4. **Prefix hit**: time to first token of a question after a cached 1,024-token
   prefix: SimpleEngine's prefix cache against raw mlx-lm reusing the prefix's KV cache.
5. **Prompt lookup**: SimpleEngine (``prompt_lookup=4``) against itself without, on
   a copy-heavy prompt, and BatchedEngine at c = 8; ``--shapes smollm2`` runs it on
   SmolLM2-135M-Instruct (a real model copies; a random one only repeats itself).
6. **Profile**: where a decode step's time goes (graph building in Python, kernel
   launches, the GPU), the memory bandwidth, and the bandwidth floor per token.

The models are random bf16 weights of the real shapes (151,936-token head) over a small
tokenizer: the embedding (tied head) rows are zero but those of tokens that read as
printable ASCII alone, so greedy decoding never picks a special token (never ends
early: every side makes exactly the same tokens, checked) and every token streams text.
Results go to ``--out`` as ``bench_gpu.json`` (written after each part) and
``bench_gpu.png`` (tokens/s against concurrency); the card (MLX's device name, and
nvidia-smi's) is in the JSON's header, in every part and on every log line. ``--budget-s`` skips the parts that
would start past it and stops the one running at it (the batched, graph and profile
parts keep what they finished), so a run fits one command of a time-limited machine.

Run (on the GPU machine, see bench/gpu/device.sh): ``python3 bench/bench_gpu.py --out DIR``;
``--quick`` runs tiny shapes and counts, for a check on a CPU (``--shapes tiny`` alone
keeps the counts). ``--plot JSON`` redraws the PNG;
``--merge A.json B.json --out DIR`` joins runs that measured different shapes or parts;
``--table JSON`` prints the README's table rows.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _gpu_owners import probed_engine, retire
from _gpu_report import brief, merge, plot, summary, table
from _gpu_ttft import bench_ttft

import mlx_integrations  # noqa: F401  (BLAS preload and float32 precision before mlx.core)

VOCAB = 151936
SHAPES: dict[str, dict[str, int]] = {
    "qwen2.5-0.5b": {
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "intermediate_size": 4864,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
    },
    "qwen2.5-1.5b": {
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "intermediate_size": 8960,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
    },
    "tiny": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
}
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly box".split()
COPY_TEXT = (
    "def parse_config(path):\n    with open(path) as f:\n        data = json.load(f)\n"
    "    if 'name' not in data:\n        raise ValueError('config has no name')\n"
    "    return Config(name=data['name'], size=int(data.get('size', 0)))\n"
)


@functools.cache
def card() -> str:
    """The device the figures come from: MLX's name for the GPU, else the CPU's."""
    import platform

    from mlx_integrations.runtime import backend_info

    info = backend_info()
    return info["gpu_name"] or f"CPU {platform.machine()} ({os.cpu_count()} cores)"


def nvidia_smi() -> str | None:
    """nvidia-smi's name, memory and driver of the GPU, or None where it is absent."""
    query = "--query-gpu=name,memory.total,driver_version"
    try:
        done = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def build_model(out: Path, shape: dict[str, int], seed: int = 0) -> Path:
    """A random bf16 Qwen2 model of ``shape`` with a 151,936-token head (see the docstring)."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen2
    from tokenizers import Tokenizer

    from tests.support.tiny_models import build_tiny_model

    if (out / "model.safetensors").exists():
        return out
    build_tiny_model(out, arch="qwen2", hidden_size=64, num_hidden_layers=1, dtype="bfloat16")
    config = json.loads((out / "config.json").read_text())
    # Tokens a greedy step may pick: each one alone reads as printable ASCII (a random
    # model would otherwise string bytes into invalid UTF-8, whose text streams late).
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    specials = {
        int(k)
        for k in json.loads((out / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    }
    keep = np.zeros(VOCAB, dtype=bool)
    for i in range(tok.get_vocab_size()):
        text = tok.decode([i])
        keep[i] = i not in specials and bool(text) and text.isascii() and text.isprintable()
    config |= shape | {"vocab_size": VOCAB, "max_position_embeddings": 32768}
    config |= {"tie_word_embeddings": True}
    mx.random.seed(seed)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(config))
    weights = {k: v.astype(mx.bfloat16) for k, v in tree_flatten(model.parameters())}
    name = "model.embed_tokens.weight"
    weights[name] = weights[name] * mx.array(keep[:, None], dtype=mx.bfloat16)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def words(n: int, offset: int = 0) -> str:
    return " ".join(WORDS[(i * 7 + offset) % len(WORDS)] for i in range(n))


def spread(ours: list[float], raw: list[float]) -> dict[str, Any]:
    """Per-repetition ratios ours/raw: median, lowest, highest, and both sides' medians."""
    ratios = [o / r for o, r in zip(ours, raw, strict=True) if r > 0]
    return {
        "ours": ours,
        "raw": raw,
        "ours_median": statistics.median(ours),
        "raw_median": statistics.median(raw),
        "ratio": statistics.median(ratios) if ratios else None,
        "ratio_low": min(ratios) if ratios else None,
        "ratio_high": max(ratios) if ratios else None,
    }


FAST_MODE = 1.25
"""A run is in the host's fast mode when its median decode step is within this factor of
the fastest run's (any side, same batch size)."""


def fast_mode(
    tps: dict[str, list[float]], splits: dict[str, list[dict[str, Any]]]
) -> dict[str, dict[str, Any]]:
    """Each engine side's ratio to raw over the repetitions where both ran in the fast mode.

    A batched run of a small model is bound by the host, whose CPU runs some runs about
    1.4x slower, whole runs at a time, on every side alike (docs/benchmarks.md): a
    repetition whose two runs fell in different modes says nothing about the engines. The
    median over all repetitions stays the headline; this is the same comparison without
    the mixed pairs (``pairs``: how many repetitions it kept)."""
    steps = {side: [run["step_ms_median"] for run in runs] for side, runs in splits.items()}
    known = [ms for runs in steps.values() for ms in runs if ms]
    if not known or "raw" not in steps:
        return {}
    limit = min(known) * FAST_MODE
    out: dict[str, dict[str, Any]] = {}
    for side in tps:
        if not side.startswith("ours") or side not in steps:
            continue
        ratios = [
            ours / raw
            for ours, raw, ours_ms, raw_ms in zip(
                tps[side], tps["raw"], steps[side], steps["raw"], strict=True
            )
            if ours_ms and raw_ms and ours_ms <= limit and raw_ms <= limit and raw > 0
        ]
        out[side] = {
            "ratio": statistics.median(ratios) if ratios else None,
            "pairs": len(ratios),
        }
    return out


def alternate(reps: int, sides: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Run every side once per repetition, rotating which goes first."""
    names = list(sides)
    out: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            out[name].append(sides[name]())
    return out


def raw_stream(model: Any, tokenizer: Any, prompt: list[int], tokens: int) -> dict[str, Any]:
    """mlx-lm's stream_generate: TTFT from the call, decode rate from first token to last."""
    from mlx_lm import stream_generate

    at = time.time()
    start = time.perf_counter()
    first = None
    out = []
    for r in stream_generate(model, tokenizer, prompt, max_tokens=tokens):
        out.append(int(r.token))
        if first is None:
            first = time.perf_counter()
    assert first is not None
    end = time.perf_counter()
    return {"tokens": out, "ttft": first - start, "tps": (len(out) - 1) / (end - first), "at": at}


async def engine_stream(engine: Any, prompt: str, tokens: int) -> dict[str, Any]:
    at = time.time()
    start = time.perf_counter()
    first = None
    last: Any = None
    async for out in engine.stream_generate(prompt, max_tokens=tokens, temperature=0.0):
        if first is None:
            first = time.perf_counter()
        last = out
    end = time.perf_counter()
    assert first is not None and last is not None
    n = last.completion_tokens
    return {
        "tokens": list(last.tokens),
        "ttft": first - start,
        "tps": (n - 1) / (end - first),
        "drafted": last.mtp_drafts,
        "accepted": last.mtp_accepted,
        "cached": int(getattr(last, "cached_tokens", 0)),
        "at": at,
    }


def decode_sides(path: Path, model: Any, tokenizer: Any, args: Any) -> dict[str, Any]:
    """Single-stream greedy decode, ``SimpleEngine`` against raw ``stream_generate``.

    Both sides warm up first, ``--warmup`` runs each in turn on the same prompt and
    length, then ``--reps`` timed runs alternate which side goes first. Every run's
    tokens are checked against raw's first (warm-up) run. The time to first token is
    that of each timed run: the same prompt each time, so not a cold one (no prefix
    cache, ``cache_memory_mb=0``, but every shape met before; see the ``ttft`` part).
    """
    from mlx_integrations.engine import SimpleEngine

    prompt = words(32)
    ids = tokenizer.encode(prompt)
    engine = SimpleEngine(path, cache_memory_mb=0)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(engine.start())
        runs: dict[str, list[dict[str, Any]]] = {"raw": [], "ours": []}

        def raw() -> float:
            runs["raw"].append(r := raw_stream(model, tokenizer, ids, args.tokens))
            return float(r["tps"])

        def ours() -> float:
            r = loop.run_until_complete(engine_stream(engine, prompt, args.tokens))
            runs["ours"].append(r)
            return float(r["tps"])

        warm = alternate(max(1, args.warmup), {"raw": raw, "ours": ours})
        ref = runs["raw"][0]["tokens"]
        same = all(r["tokens"] == ref for side in runs.values() for r in side)
        runs = {"raw": [], "ours": []}
        began = time.time()
        tps = alternate(args.reps, {"raw": raw, "ours": ours})
        return {
            "card": card(),
            "tokens": len(ref),
            "token_digest": hashlib.sha256(json.dumps(ref).encode()).hexdigest()[:16],
            "same_tokens": same and all(r["tokens"] == ref for r in runs["ours"]),
            "raw_same_tokens": all(r["tokens"] == ref for r in runs["raw"]),
            "warmup": warm,
            "started": began,
            "at": {k: [round(r["at"] - began, 2) for r in v] for k, v in runs.items()},
            "decode": spread(tps["ours"], tps["raw"]),
            "ttft": spread(*([r["ttft"] for r in runs[k]] for k in ("ours", "raw"))),
        }
    finally:
        retire(engine, loop)
        loop.close()


def bench_single(path: Path, model: Any, tokenizer: Any, args: Any) -> dict[str, Any]:
    return decode_sides(path, model, tokenizer, args)


def save_part(path: Path, result: dict[str, Any]) -> None:
    """Write a part's results whole: a part killed mid-write leaves the last save."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, path)


def read_part(path: Path) -> dict[str, Any]:
    """What a part saved, or nothing."""
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def bench_batched(path: Path, model: Any, tokenizer: Any, args: Any) -> dict[str, Any]:
    from _gpu_steps import StepTracer

    tracer = StepTracer()
    tracer.install()
    results: dict[str, Any] = {}
    for c in args.concurrency:
        r = results[str(c)] = batched_at(c, path, model, tokenizer, args, tracer)
        first = r["first"]
        steps = "; ".join(
            f"{side} step {s.get('step_ms_median')} ms + rest {s.get('rest_ms_per_step')} ms"
            for side, s in r["split_median"].items()
        )
        variants = "".join(
            f"; {key[:-6].replace('_', '-')} ratio {value:.3f}"
            for key, value in r.items()
            if key.startswith("ours_") and key.endswith("_ratio")
        )
        variants += "".join(
            f"; {side} in the fast mode {f['ratio']:.3f} ({f['pairs']} pairs)"
            for side, f in r.get("fast_mode", {}).items()
            if f["ratio"] is not None
        )
        print(
            f"    [{r['card']}] c={c:3d}  {summary(r)}; first runs ({first['first_side']} first): "
            f"ours {first['ours_tps']:.1f} raw {first['raw_tps']:.1f} tok/s, slowest first "
            f"token {first['ours_slowest_first_token_s']:.3f} s; {steps}{variants}",
            flush=True,
        )
        # Each concurrency saved once done: a part timed out keeps those before it.
        save_part(args.part_out, results | {"partial": True})
    return results


def batched_at(
    c: int, path: Path, model: Any, tokenizer: Any, args: Any, tracer: Any
) -> dict[str, Any]:
    """``c`` requests at once: BatchedEngine against batch_generate with batch sizes ``c``.

    Both sides start from the prompts' text and end with the replies' text: raw's run
    tokenizes the prompts (``raw_encode_ms_median``), as the engine does per request.
    Every run's wall time is split into mlx-lm's prefill calls, its decode steps and
    the rest (the Python around them: mlx-lm's loop, and the engine's own work). With
    ``--raw-thread``, batch_generate also runs on a thread of its own (as the engine's
    steps do) beside the main-thread runs.
    """
    from concurrent.futures import ThreadPoolExecutor

    from _gpu_steps import MEDIANS, split
    from mlx_lm import batch_generate

    from mlx_integrations.engine import BatchedEngine

    prompts = [words(20 + (i % 9), offset=i) for i in range(c)]
    engine = BatchedEngine(path, max_num_seqs=c, cache_memory_mb=0)
    asked = json.loads(args.batched_variants)
    variants = {name: variant_engine(path, c, options) for name, options in asked.items()}
    loop = asyncio.new_event_loop()
    thread = ThreadPoolExecutor(1, thread_name_prefix="raw-thread")
    encode_ms: list[float] = []  # raw's tokenizing, inside its timed run
    counts: dict[str, list[int]] = {}
    splits: dict[str, list[dict[str, Any]]] = {}
    started: dict[str, list[float]] = {}  # each run's start, time.time(), to match GPU clocks

    def timed(side: str, run: Callable[[], int]) -> float:
        tracer.take()
        started.setdefault(side, []).append(round(time.time(), 3))
        start = time.perf_counter()
        n = run()
        seconds = time.perf_counter() - start
        counts.setdefault(side, []).append(n)
        splits.setdefault(side, []).append(split(seconds, tracer.take()))
        return n / seconds

    def raw_run() -> int:
        # Both sides start from the prompts' text and end with the replies' text (the
        # engine tokenizes each request; batch_generate takes ids, and decodes).
        began = time.perf_counter()
        ids = [tokenizer.encode(p) for p in prompts]
        encode_ms.append(round((time.perf_counter() - began) * 1000, 2))
        response = batch_generate(
            model,
            tokenizer,
            ids,
            max_tokens=args.tokens,
            completion_batch_size=c,
            prefill_batch_size=c,
            return_token_ids=True,
        )
        return sum(map(len, response.token_ids))

    async def serve(served: Any) -> list[Any]:
        calls = [served.generate(p, max_tokens=args.tokens, temperature=0.0) for p in prompts]
        return list(await asyncio.gather(*calls))

    slowest_first: list[float] = []  # the engine's slowest first token, per run

    def ours_run() -> int:
        outs = loop.run_until_complete(serve(engine))
        slowest_first.append(max(o.ttft_s for o in outs))
        return sum(o.completion_tokens for o in outs)

    def variant_run(served: Any) -> Callable[[], int]:
        return lambda: sum(o.completion_tokens for o in loop.run_until_complete(serve(served)))

    sides = {
        "raw": lambda: timed("raw", raw_run),
        "ours": lambda: timed("ours", ours_run),
        "raw-thread": lambda: timed("raw-thread", lambda: thread.submit(raw_run).result()),
    }
    for name, served in variants.items():
        sides[f"ours-{name}"] = functools.partial(timed, f"ours-{name}", variant_run(served))
    chosen = {"raw": sides["raw"], "ours": sides["ours"]}
    chosen |= {side: run for side, run in sides.items() if side.startswith("ours-")}
    if args.raw_thread:
        chosen["raw-thread"] = sides["raw-thread"]
    try:
        began = time.perf_counter()
        loop.run_until_complete(engine.start())
        load_s = time.perf_counter() - began
        for served in variants.values():
            loop.run_until_complete(served.start())
        thread.submit(lambda: None).result()
        # The first run of each side at this batch size: new shapes for both, and a
        # new owner thread for the engine. The first side alternates with c; the
        # variants' first runs follow (kept apart too, out of the timed rotation).
        first_side = "raw" if args.concurrency.index(c) % 2 == 0 else "ours"
        first = alternate(
            1,
            {"raw": sides["raw"], "ours": sides["ours"]}
            if first_side == "raw"
            else {"ours": sides["ours"], "raw": sides["raw"]},
        )
        first_variants = {side: sides[side]() for side in chosen if side.startswith("ours-")}
        first_splits = {side: splits[side][0] for side in ("raw", "ours")}
        splits.clear()
        tps = alternate(args.batched_reps, chosen)
        extra = {
            f"{side.replace('-', '_')}_tps": tps[side]
            for side in tps
            if side not in ("raw", "ours")
        }
        extra |= {
            f"{side.replace('-', '_')}_ratio": spread(tps[side], tps["raw"])["ratio"]
            for side in tps
            if side.startswith("ours-")
        }
        extra["fast_mode"] = fast_mode(tps, splits)
        return (
            spread(tps["ours"], tps["raw"])
            | extra
            | {
                "card": card(),
                "same_token_count": len({n for ns in counts.values() for n in ns}) == 1,
                "tokens_per_run": counts["ours"][-1],
                "first": {
                    "first_side": first_side,
                    "raw_tps": first["raw"][0],
                    "ours_tps": first["ours"][0],
                    "ours_slowest_first_token_s": slowest_first[0],
                    "split": first_splits,
                    "variants_tps": first_variants,
                },
                "ours_slowest_first_token_s": slowest_first[1:],
                "split": splits,
                "split_median": {
                    side: {
                        key: statistics.median(s[key] for s in runs)
                        for key in MEDIANS
                        if all(s[key] is not None for s in runs)
                    }
                    for side, runs in splits.items()
                },
                "started": started,
                "raw_encode_ms_median": statistics.median(encode_ms),
                "load_s": load_s,
                "warmup_s": engine.warmup_seconds,
                "variants": asked,
                "variants_warmup_s": {
                    f"ours-{name}": served.warmup_seconds for name, served in variants.items()
                },
            }
        )
    finally:
        thread.shutdown()
        for served in (engine, *variants.values()):
            retire(served, loop)
        loop.close()


def variant_engine(path: Path, c: int, options: dict[str, Any]) -> Any:
    """A ``BatchedEngine`` with room for ``c`` and ``options``, the warm-up probes
    among them (``_gpu_owners.probed_engine``)."""
    from mlx_integrations.engine import BatchedEngine

    return probed_engine(BatchedEngine, path, options, max_num_seqs=c, cache_memory_mb=0)


def bench_prefix(path: Path, model: Any, tokenizer: Any, args: Any) -> dict[str, Any]:
    """TTFT of a question after a cached 1,024-token prefix, ours against raw reuse."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    from mlx_integrations.engine import SimpleEngine

    prefix_ids = tokenizer.encode(words(1200))[: args.prefix_tokens]
    prefix = tokenizer.decode(prefix_ids)
    prefix_ids = tokenizer.encode(prefix)
    questions = [f" question {i}: " + words(12, offset=i) for i in range(args.reps + 2)]

    raw_cache = make_prompt_cache(model)
    for _ in generate_step(mx.array(prefix_ids), model, max_tokens=1, prompt_cache=raw_cache):
        pass
    held = raw_cache[0].offset

    def raw_once(q: str) -> float:
        ids = tokenizer.encode(prefix + q)[len(prefix_ids) :]
        start = time.perf_counter()
        steps = generate_step(mx.array(ids), model, max_tokens=1, prompt_cache=raw_cache)
        next(steps)
        ttft = time.perf_counter() - start
        steps.close()
        trim_prompt_cache(raw_cache, raw_cache[0].offset - held)
        return ttft

    engine = SimpleEngine(path)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(engine.start())
        loop.run_until_complete(engine.generate(prefix + questions[0], max_tokens=2))
        raw_once(questions[1])  # warm-up
        cached: list[int] = []
        it = iter(questions[2:])

        def ours() -> float:
            r = loop.run_until_complete(engine_stream(engine, prefix + next(it), 1))
            cached.append(r["cached"])
            return float(r["ttft"])

        qs = iter(questions[2:])
        ttft = alternate(args.reps, {"raw": lambda: raw_once(next(qs)), "ours": ours})
        return spread(ttft["ours"], ttft["raw"]) | {
            "prefix_tokens": len(prefix_ids),
            "cached_tokens": cached,
        }
    finally:
        retire(engine, loop)
        loop.close()


def bench_lookup(path: Path, args: Any, label: str) -> dict[str, Any]:
    """Prompt lookup's speed-up on a copy-heavy prompt, c = 1 and c = 8."""
    from mlx_integrations.engine import BatchedEngine, SimpleEngine

    prompt = "Repeat this code exactly, then stop.\n\n" + COPY_TEXT * 2 + "\n" + COPY_TEXT[:40]
    tokens = args.tokens
    plain = SimpleEngine(path, cache_memory_mb=0)
    lookup = SimpleEngine(path, cache_memory_mb=0, prompt_lookup=4)
    loop = asyncio.new_event_loop()
    result: dict[str, Any] = {"model": label}
    try:
        for e in (plain, lookup):
            loop.run_until_complete(e.start())
            loop.run_until_complete(engine_stream(e, prompt, 16))
        runs: list[dict[str, Any]] = []

        def with_lookup() -> float:
            runs.append(r := loop.run_until_complete(engine_stream(lookup, prompt, tokens)))
            return float(r["tps"])

        def without() -> float:
            return float(loop.run_until_complete(engine_stream(plain, prompt, tokens))["tps"])

        tps = alternate(args.reps, {"plain": without, "lookup": with_lookup})
        result["c1"] = spread(tps["lookup"], tps["plain"]) | {
            "drafted": runs[-1]["drafted"],
            "accepted": runs[-1]["accepted"],
        }
    finally:
        for e in (plain, lookup):
            retire(e, loop)
    engines = {
        "plain": BatchedEngine(path, max_num_seqs=8, cache_memory_mb=0),
        "lookup": BatchedEngine(path, max_num_seqs=8, cache_memory_mb=0, prompt_lookup=4),
    }
    try:
        for e in engines.values():
            loop.run_until_complete(e.start())

        async def serve(name: str) -> list[Any]:
            prompts = [f"{i}. " + prompt for i in range(8)]
            calls = [engines[name].generate(p, max_tokens=tokens, temperature=0.0) for p in prompts]
            return list(await asyncio.gather(*calls))

        def batch(name: str) -> float:
            start = time.perf_counter()
            outs = loop.run_until_complete(serve(name))
            return sum(o.completion_tokens for o in outs) / (time.perf_counter() - start)

        batch("plain"), batch("lookup")
        tps = alternate(
            max(2, args.batched_reps),
            {"plain": lambda: batch("plain"), "lookup": lambda: batch("lookup")},
        )
        result["c8"] = spread(tps["lookup"], tps["plain"])
    finally:
        for e in engines.values():
            retire(e, loop)
        loop.close()
    return result


GRAPH_VARIABLE = "MLX_MAX_OPS_PER_BUFFER"
"""Most operations MLX's CUDA backend puts in one CUDA graph before it launches it.

Read once, when a process first uses the GPU (``get_graph_limits`` in MLX's
mlx/backend/cuda/device.cpp); unset, it depends on the compute capability: 100 on
sm_90 (H100, H200), 20 on sm_80. ``MLX_MAX_MB_PER_BUFFER`` (1,000 MB on sm_90) caps the
bytes a graph reads the same way.
"""


def bench_graph(path: Path, args: Any) -> dict[str, Any]:
    """Single-stream decode, raw and ours, under each ``--graph-ops`` setting of
    ``MLX_MAX_OPS_PER_BUFFER`` ("default": unset), one process per setting and
    repetition (MLX reads it once per process), the settings rotating.

    Each process warms both sides up and then alternates them ``--graph-inner`` times
    (``decode_sides``). Per setting: both sides' tokens/s over all its runs, ours/raw
    per run, and each side's rate against the unset default's from the same round.
    """
    settings = list(args.graph_ops)
    rounds: list[dict[str, Any]] = []
    out: dict[str, Any] = {"variable": GRAPH_VARIABLE, "settings": settings, "rounds": rounds}
    for rep in range(args.graph_reps):
        row: dict[str, Any] = {}
        for setting in settings[rep % len(settings) :] + settings[: rep % len(settings)]:
            left = args.deadline - time.time()
            if left < 30:
                row[setting] = {"error": "skipped: out of time"}
                continue
            env = {k: v for k, v in os.environ.items() if k != GRAPH_VARIABLE}
            if setting != "default":
                env[GRAPH_VARIABLE] = setting
            cmd = [sys.executable, __file__, "--graph-decode", str(path)]
            cmd += ["--tokens", str(args.tokens), "--reps", str(args.graph_inner)]
            cmd += ["--warmup", str(args.warmup)]
            try:
                done = subprocess.run(
                    cmd, env=env, capture_output=True, text=True, timeout=min(left, 240)
                )
                lines = done.stdout.strip().splitlines()
                row[setting] = json.loads(lines[-1]) if lines else {"error": done.stderr[-800:]}
            except subprocess.TimeoutExpired:
                row[setting] = {"error": "timed out"}
        rounds.append(row)
        partial = out | {"partial": True, "summary": graph_summary(rounds, settings)}
        save_part(args.part_out, partial)
    out["summary"] = graph_summary(rounds, settings)
    return out


def graph_summary(rounds: list[dict[str, Any]], settings: list[str]) -> dict[str, Any]:
    """Per setting: each side's rates, ours/raw per run, and setting/default per round."""
    summary: dict[str, Any] = {}
    done = [r for r in rounds if all("decode" in r.get(s, {}) for s in settings)]
    digests = {r[s]["token_digest"] for r in done for s in settings}
    for setting in settings:
        runs = [r[setting] for r in rounds if "decode" in r.get(setting, {})]
        if not runs:
            continue
        raw = [x for r in runs for x in r["decode"]["raw"]]
        ours = [x for r in runs for x in r["decode"]["ours"]]
        entry = spread(ours, raw) | {"processes": len(runs)}
        entry["same_tokens"] = all(r["same_tokens"] and r["raw_same_tokens"] for r in runs)
        if setting != "default" and "default" in settings and done:
            for side in ("raw", "ours"):
                ratios = [
                    r[setting]["decode"][f"{side}_median"]
                    / r["default"]["decode"][f"{side}_median"]
                    for r in done
                ]
                entry[f"{side}_vs_default"] = {
                    "median": statistics.median(ratios),
                    "low": min(ratios),
                    "high": max(ratios),
                }
        summary[setting] = entry
    summary["same_tokens_across_settings"] = len(digests) == 1
    return summary


def graph_decode_only(path: Path, args: Any) -> None:
    """One process of ``bench_graph``: ``decode_sides`` as one JSON line."""
    from mlx_lm import load

    model, tokenizer = load(str(path))
    result = decode_sides(path, model, tokenizer, args)
    result["variable"] = os.environ.get(GRAPH_VARIABLE)
    print(json.dumps(result))


RAW_ENVS: dict[str, dict[str, str]] = {
    "default": {},
    "cuda_graphs_off": {"MLX_USE_CUDA_GRAPHS": "0"},
    "ops_per_buffer_50": {"MLX_MAX_OPS_PER_BUFFER": "50"},
    "ops_per_buffer_500": {"MLX_MAX_OPS_PER_BUFFER": "500"},
    "ops_per_buffer_5000": {"MLX_MAX_OPS_PER_BUFFER": "5000"},
}
"""Environments raw mlx-lm decodes under, each in its own process (MLX reads them once)."""


def bench_profile(model: Any, tokenizer: Any, path: Path, args: Any) -> dict[str, Any]:
    """Where a decode step's time goes; the memory bandwidth; MLX's CUDA settings.

    Saved to ``--part-out`` after each measurement, so a failure keeps the earlier ones.
    """
    import mlx.core as mx

    out: dict[str, Any] = {"steps": 32}

    def save() -> None:
        save_part(args.part_out, out | {"partial": True})

    # A token reads every weight once: the tied head is the embedding table.
    weight_bytes = sum(v.nbytes for _, v in _leaves(model))
    x = mx.random.uniform(shape=(1 << 28,)).astype(mx.bfloat16)
    mx.eval(x)
    times = []
    for _ in range(6):
        start = time.perf_counter()
        mx.eval(x * 1.5)
        times.append(time.perf_counter() - start)
    bandwidth = 2 * x.nbytes / statistics.median(times[1:])
    del x
    out |= {"weight_bytes": weight_bytes, "copy_bandwidth_gbs": bandwidth / 1e9}
    out["floor_ms_per_token"] = weight_bytes / bandwidth * 1e3
    save()
    out["raw_decode_tps"] = {}
    for name, env in RAW_ENVS.items():
        cmd = [sys.executable, __file__, "--raw-decode", str(path), "--tokens", str(args.tokens)]
        done = subprocess.run(
            cmd, env=os.environ | env, capture_output=True, text=True, timeout=300
        )
        lines = done.stdout.strip().splitlines()
        out["raw_decode_tps"][name] = json.loads(lines[-1]) if lines else done.stderr[-300:]
        save()
    for variant in ("eager_sync", "eager_chain", "compiled_sync", "compiled_chain"):
        out[variant] = _step_times(model, tokenizer, variant, out["steps"])
        save()
    return out


def _step_times(model: Any, tokenizer: Any, variant: str, n: int) -> dict[str, float]:
    """Per-token milliseconds of one way to run decode steps.

    ``sync``: each step built (Python) then evaluated before the next, so ``build_ms``
    is the Python graph building and ``eval_ms`` the launches and the GPU's work.
    ``chain``: ``n`` steps built first (each fed the last's lazy token), evaluated once.
    ``compiled`` runs the step as one compiled function (bench/_compiled_step.py).
    """
    import mlx.core as mx
    from _compiled_step import CompiledDecoder
    from mlx_lm.models.cache import make_prompt_cache

    from mlx_integrations.engine.decoding import prefill

    ids = tokenizer.encode(words(32))
    cache = make_prompt_cache(model)
    prefill(model, cache, ids[:-1], 2048)
    decoder = CompiledDecoder(model, cache) if variant.startswith("compiled") else None

    def step(y: Any) -> Any:
        if decoder is not None:
            return mx.argmax(decoder.feed(y), axis=-1)
        logits = model(y[None], cache=cache)[:, -1, :]
        return mx.argmax(logits - mx.logsumexp(logits, axis=-1, keepdims=True), axis=-1)

    y = mx.array([ids[-1]], mx.uint32)
    for _ in range(4):  # warm-up: kernels compiled, the compiled step traced
        y = step(y)
        mx.eval(y)
    build = run = 0.0
    if variant.endswith("sync"):
        for _ in range(n):
            t0 = time.perf_counter()
            y = step(y)
            t1 = time.perf_counter()
            mx.eval(y)
            t2 = time.perf_counter()
            build, run = build + t1 - t0, run + t2 - t1
    else:
        t0 = time.perf_counter()
        ys = []
        for _ in range(n):
            ys.append(y := step(y))
        t1 = time.perf_counter()
        mx.eval(ys)
        build, run = t1 - t0, time.perf_counter() - t1
    if decoder is not None:
        decoder.close()
    return {
        "build_ms": build / n * 1e3,
        "eval_ms": run / n * 1e3,
        "total_ms": (build + run) / n * 1e3,
    }


def _leaves(model: Any) -> list[tuple[str, Any]]:
    from mlx.utils import tree_flatten

    return list(tree_flatten(model.parameters()))


def raw_decode_only(path: Path, tokens: int) -> None:
    """Print raw mlx-lm's decode tokens/s (median of 3 after a warm-up) as one JSON line."""
    from mlx_lm import load

    model, tokenizer = load(str(path))
    ids = tokenizer.encode(words(32))
    raw_stream(model, tokenizer, ids, tokens)
    rates = [raw_stream(model, tokenizer, ids, tokens)["tps"] for _ in range(3)]
    print(json.dumps({"tps": statistics.median(rates), "all": rates}))


def run_part(args: Any) -> None:
    """One part on one shape, in this process; its JSON to ``--part-out``."""
    from mlx_lm import load

    if args.shape == "smollm2":
        from tests.support.smollm import ensure_smollm2

        path = ensure_smollm2()
    else:
        path = build_model(args.models / args.shape, SHAPES[args.shape])
    if args.run_part == "graph":
        save_part(args.part_out, bench_graph(path, args))
        return
    model, tokenizer = load(str(path))
    options = json.loads(args.engine_options)
    parts: dict[str, Callable[[], Any]] = {
        "ttft": functools.partial(
            bench_ttft,
            path,
            model,
            tokenizer,
            args.ttft_lengths,
            args.ttft_reps,
            options,
            card(),
            not args.no_ttft_unpadded,
            json.loads(args.ttft_variants),
            # After each repetition: a part stopped by its deadline keeps them.
            lambda r: save_part(args.part_out, r | {"partial": True}),
        ),
        "single": functools.partial(bench_single, path, model, tokenizer, args),
        "profile": functools.partial(bench_profile, model, tokenizer, path, args),
        "batched": functools.partial(bench_batched, path, model, tokenizer, args),
        "prefix": functools.partial(bench_prefix, path, model, tokenizer, args),
        "lookup": functools.partial(bench_lookup, path, args, args.shape),
    }
    result = parts[args.run_part]()
    result["parameters"] = sum(v.size for _, v in _leaves(model))
    result.setdefault("card", card())
    save_part(args.part_out, result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--shapes", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-1.5b"])
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["ttft", "single", "batched", "graph", "prefix", "profile", "lookup"],
    )
    parser.add_argument(
        "--ttft-lengths",
        type=int,
        nargs="+",
        default=[32, 512, 1700, 4000],
        help="prompt length classes of the ttft part (tokens)",
    )
    parser.add_argument("--ttft-reps", type=int, default=3, help="ttft measurements a side")
    parser.add_argument(
        "--no-ttft-unpadded",
        action="store_true",
        help="leave out the ttft part's third side (the engine without prefill_buckets)",
    )
    parser.add_argument(
        "--engine-options",
        default="{}",
        help="JSON of engine options for the ttft part (default: the device's defaults)",
    )
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=9, help="timed single-stream runs a side")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs a side first")
    parser.add_argument("--batched-reps", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument(
        "--raw-thread",
        action="store_true",
        help="a third batched side: batch_generate on a thread of its own, as the engine's steps",
    )
    parser.add_argument(
        "--batched-variants",
        default="{}",
        help='JSON {"name": {engine options}}: more batched sides, BatchedEngines with '
        "these options (ours-NAME), timed in the same rotation",
    )
    parser.add_argument(
        "--ttft-variants",
        default="{}",
        help='JSON {"name": {engine options}}: more ttft sides, SimpleEngines with these '
        "options (ours_NAME), the warm-up probes among them, in the same rotation",
    )
    parser.add_argument("--prefix-tokens", type=int, default=1024)
    parser.add_argument(
        "--graph-ops",
        nargs="+",
        default=["default", "50", "200"],
        help=f"{GRAPH_VARIABLE} values for the graph part ('default': unset)",
    )
    parser.add_argument("--graph-reps", type=int, default=3, help="processes per setting")
    parser.add_argument("--graph-inner", type=int, default=3, help="timed runs a side each")
    parser.add_argument("--models", type=Path, default=Path("/tmp/bench-gpu-models"))
    parser.add_argument("--budget-s", type=float, default=86400.0, help="skip parts past this")
    parser.add_argument("--quick", action="store_true", help="tiny shapes and counts (CPU check)")
    parser.add_argument("--plot", type=Path, help="redraw the PNG from this JSON and stop")
    parser.add_argument("--merge", type=Path, nargs="+", help="join these runs' JSON into --out")
    parser.add_argument("--table", type=Path, help="print the README's table rows from this JSON")
    parser.add_argument("--raw-decode", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--graph-decode", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=float("inf"), help=argparse.SUPPRESS)
    parser.add_argument("--run-part", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--part-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_decode:
        return raw_decode_only(args.raw_decode, args.tokens)
    if args.graph_decode:
        return graph_decode_only(args.graph_decode, args)
    if args.plot:
        plot(json.loads(args.plot.read_text()), args.plot.with_suffix(".png"))
        return
    if args.table:
        return print(table(json.loads(args.table.read_text())))
    if args.merge:
        args.out.mkdir(parents=True, exist_ok=True)
        joined = merge([json.loads(p.read_text()) for p in args.merge])
        (args.out / "bench_gpu.json").write_text(json.dumps(joined, indent=1))
        plot(joined, args.out / "bench_gpu.png")
        return
    if args.quick:
        args.shapes, args.tokens, args.reps, args.batched_reps = ["tiny"], 24, 2, 1
        args.concurrency, args.prefix_tokens = [1, 4], 128
        args.warmup, args.graph_reps, args.graph_inner = 1, 2, 2
        args.ttft_lengths, args.ttft_reps = [32, 200], 2
    if args.run_part:
        return run_part(args)

    from mlx_integrations.runtime import backend_info

    began = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    info = backend_info()
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "gpu": info["gpu_name"] or info["device"],
        "card": card(),
        "nvidia_smi": nvidia_smi(),
        "backend": dict(info),
        # MLX's settings from the environment (graphs, cache sizes, ...) as this run had them
        "mlx_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MLX_")},
        "tokens": args.tokens,
        "reps": args.reps,
        "batched_reps": args.batched_reps,
        "concurrency": args.concurrency,
        "shapes": {},
    }
    json_path = args.out / "bench_gpu.json"
    print(
        f"{results['card']} ({info['backend']}; nvidia-smi: {results['nvidia_smi']}), "
        f"mlx {info['mlx_version']}",
        flush=True,
    )
    common = ["--tokens", str(args.tokens), "--reps", str(args.reps), "--models", str(args.models)]
    common += ["--batched-reps", str(args.batched_reps), "--prefix-tokens", str(args.prefix_tokens)]
    common += ["--concurrency", *map(str, args.concurrency), "--warmup", str(args.warmup)]
    common += ["--raw-thread"] if args.raw_thread else []
    common += ["--batched-variants", args.batched_variants]
    common += ["--ttft-variants", args.ttft_variants]
    common += ["--graph-ops", *args.graph_ops, "--graph-reps", str(args.graph_reps)]
    common += ["--graph-inner", str(args.graph_inner), "--ttft-reps", str(args.ttft_reps)]
    common += ["--ttft-lengths", *map(str, args.ttft_lengths)]
    common += ["--engine-options", args.engine_options]
    common += ["--no-ttft-unpadded"] if args.no_ttft_unpadded else []
    for shape in args.shapes:
        r: dict[str, Any] = results["shapes"].setdefault(shape, {})
        for part in args.parts:
            if part in ("profile", "lookup") and shape != args.shapes[0]:
                continue  # the first shape's profile and lookup say what they need to
            left = args.budget_s - (time.perf_counter() - began)
            if left < 20:
                r[part] = {"error": "skipped: out of time"}
                continue
            # A part per process: an MLX or CUDA failure ends only that part.
            start = time.perf_counter()
            out = Path(f"/tmp/bench-gpu-{shape}-{part}.json")
            out.unlink(missing_ok=True)
            cmd = [sys.executable, __file__, "--run-part", part, "--shape", shape]
            cmd += ["--part-out", str(out), "--deadline", str(time.time() + left), *common]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=left)
                # A part that failed keeps what it saved before (batched, graph and
                # profile save as they go) beside its error.
                r[part] = read_part(out)
                if done.returncode != 0 or not r[part]:
                    r[part]["error"] = f"exit {done.returncode}: {done.stderr[-1500:]}"
            except subprocess.TimeoutExpired:
                r[part] = read_part(out) | {"error": "timed out"}
            r["parameters"] = r[part].pop("parameters", r.get("parameters"))
            r[f"{part}_s"] = round(time.perf_counter() - start, 1)
            r[f"{part}_at"] = time.strftime(
                "%H:%M:%S UTC", time.gmtime(time.time() - r[f"{part}_s"])
            )
            json_path.write_text(json.dumps(results, indent=1))
            print(
                f"  [{results['card']}] {shape} {part} ({r[f'{part}_s']} s): "
                f"{brief(part, r[part])}",
                flush=True,
            )
    try:
        plot(results, args.out / "bench_gpu.png")
    except Exception as exc:
        print(f"no plot: {exc}", flush=True)


if __name__ == "__main__":
    main()
