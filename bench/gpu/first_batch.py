"""Where the first batches of a process spend their time on a GPU.

Ten probes, each printing JSON lines (also written to ``--out``):

``sdpa``: the attention call alone, at the shapes a decode batch meets. For each model
shape, batch size and mask kind (none; an array mask as mlx-lm's ``BatchKVCache``
makes for left-padded rows; the same mask over the key length rounded up to the
cache's 256-position step), a run of key lengths the thread has not met: the first
call at each length and a second one, in ms. And a length met on this thread, called
again from a new thread.

``prefix``: a 16-token piece after a cached prefix, the whole forward pass, at held
lengths new to the thread (1 row and 8): the first call at each and a second one, in ms.

``graphs``: what each attention graph MLX's CUDA backend keeps costs (time to build,
host and GPU memory), 300 of them.

``turns``: the time to the first token of second turns after first turns of new
lengths: SimpleEngine (cached prefixes in whole key steps), SimpleEngine with
``prefix_key_step=1``, and mlx-lm's ``stream_generate`` reusing the first turn's cache.

``host``: where the host time between mlx-lm's steps goes at c = 8 and 64:
``batch_generate`` on the main thread and on its own thread, BatchedEngine with its
owner loop's parts timed (with and without padded pieces), and mlx-lm's generator set
up and fed as the engine does, in a plain loop (``raw-as-ours``).

``neighbour``: ``batch_generate`` alone in the process, then beside an idle
BatchedEngine, then after the engine has served: wall ms per run, and where the
process's other threads were seen meanwhile.

``pool``: whether what MLX's buffer pool holds (buffers the host wrote or read, which
MLX's CUDA backend keeps in managed memory) decides a run's speed: ``batch_generate``
alone, after the pool was filled with such buffers, after ``mx.clear_cache()``, beside
and after an engine; per run, the decode step's GPU wait and host share.

``owner``: mlx-lm's decode step timed in parts (Python building the graph, MLX
submitting it, waiting for the GPU, the thread's CPU time) in ``batch_generate`` on the
main thread, on a thread of its own, on the engine's owner thread, with the engine's
model object, and in the engine.

``provenance``: whether what a thread met before slows its batch of c (64; ``--provenance-c``):
``batch_generate`` timed on new threads that first ran nothing, a batch of half the
size, the engine's batch warm-up, a batch of c and then that warm-up, the prefill
shapes' warm-up, or one half of the batch warm-up (its growing batch, its padded
groups); ``--provenance-scenarios`` picks them.

``trace``: a fresh process per scenario (``engine-first``, ``raw-first``; or one side
alone: ``engine``, ``engine-nowarm`` [no warm-up at load], ``engine-nobuckets`` [no padded
pieces, placeholder rows or warm-up], ``engine-elsewhere`` [the load's whole warm-up on a
thread other than the owner's], ``engine-ownerwarm`` [the batch warm-up on the owner
thread, as before the package ran it aside], ``engine-groupsowner`` [the batch
warm-up's groups on the owner thread, the rest aside], ``engine-growthowner`` [the
other way round], ``engine-largest`` [a full batch
decoded on the owner thread before the load's warm-up], ``engine-ownerwarm-largest``
[that, and the batch warm-up on the owner thread], ``raw``, with ``--orders``; ``engine@32``: the engine
with room for 32 requests instead of 16, whose load's warm-up meets more). Each times
every prefill call and decode step of mlx-lm's batch classes (the engine runs them
too) for: ``BatchedEngine`` on 8 requests at once, twice, then on 8 prompts of new
lengths, then on 8 more of lengths new again but in the same buckets (the engine
prefills requests arriving together as one padded group where it pads pieces, which
the tracer does not see: its slowest first token does); and ``batch_generate`` on the
same four sets, in the scenario's order.
Prints per run: seconds, slowest first token, the steps slower than 3x the run's
median step and their key lengths.

Usage: python bench/gpu/first_batch.py [--probes sdpa,graphs,prefix,turns,host,neighbour,pool,owner,provenance,trace] [--shapes qwen2.5-0.5b]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

import bench_gpu  # noqa: E402  (the model shapes and builder; the BLAS preload)
from _gpu_owners import retire, side_thread  # noqa: E402
from _gpu_steps import StepTracer  # noqa: E402

HEADS = {
    name: (s["num_attention_heads"], s["num_key_value_heads"])
    for name, s in bench_gpu.SHAPES.items()
}
STEP = 256


def model_path(shape: str) -> Path:
    """The random model of ``shape`` the probes share, built once per machine."""
    return bench_gpu.build_model(
        Path(tempfile.gettempdir()) / f"first-batch-{shape}", bench_gpu.SHAPES[shape]
    )


def emit(record: dict[str, Any], out: Path | None) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    if out is not None:
        with (out / "first_batch.jsonl").open("a") as f:
            f.write(line + "\n")


def serve_all(
    loop: asyncio.AbstractEventLoop, engine: Any, prompts: list[str], tokens: int
) -> list[Any]:
    """The engine's greedy replies of ``tokens`` to ``prompts``, all sent at once."""

    async def go() -> list[Any]:
        calls = [engine.generate(p, max_tokens=tokens, temperature=0.0) for p in prompts]
        return list(await asyncio.gather(*calls))

    return loop.run_until_complete(go())


def raw_batch(
    model: Any, tokenizer: Any, ids: list[list[int]], tokens: int, c: int | None = None
) -> None:
    """mlx-lm's ``batch_generate`` on ``ids``: with batch sizes ``c`` where given."""
    from mlx_lm import batch_generate

    sizes = {} if c is None else {"completion_batch_size": c, "prefill_batch_size": c}
    batch_generate(model, tokenizer, ids, max_tokens=tokens, **sizes)


# ------------------------------------------------------------------ sdpa


def sdpa_probe(shape: str, out: Path | None) -> None:
    import mlx.core as mx

    h, kvh = HEADS[shape]
    d = bench_gpu.SHAPES[shape]["hidden_size"] // h

    def call(b: int, length: int, mask: str) -> float:
        buffer = -(-length // STEP) * STEP
        seen = buffer if mask == "padded" else length
        q = mx.random.normal((b, h, 1, d)).astype(mx.bfloat16)
        keys = mx.random.normal((b, kvh, buffer, d)).astype(mx.bfloat16)
        values = mx.random.normal((b, kvh, buffer, d)).astype(mx.bfloat16)
        k, v = keys[..., :seen, :], values[..., :seen, :]
        m: Any = None
        if mask != "none":
            pad = mx.arange(b)[:, None] % 3  # rows' left padding
            pos = mx.arange(seen)[None]
            m = ((pos >= pad) & (pos < length))[:, None, None, :]
        mx.eval(q, k, v, m) if m is not None else mx.eval(q, k, v)
        began = time.perf_counter()
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=d**-0.5, mask=m)
        mx.eval(o)
        return (time.perf_counter() - began) * 1000

    for b in (1, 8):
        for mask in ("none", "array", "padded"):
            lengths = list(
                range(300 + 40 * b + (mask != "none") * 7, 300 + 40 * b + 12 + (mask != "none") * 7)
            )
            if mask == "padded":
                lengths = [n + 13 for n in lengths]
            first = [call(b, n, mask) for n in lengths]
            again = [call(b, n, mask) for n in lengths]
            holder: list[float] = []
            t = threading.Thread(
                target=lambda h, *a: h.append(call(*a)), args=(holder, b, lengths[0], mask)
            )
            t.start()
            t.join()
            emit(
                {
                    "probe": "sdpa",
                    "shape": shape,
                    "batch": b,
                    "mask": mask,
                    "lengths": lengths,
                    "first_ms": [round(x, 2) for x in first],
                    "again_ms": [round(x, 2) for x in again],
                    "new_thread_seen_length_ms": round(holder[0], 2),
                },
                out,
            )


# ------------------------------------------------------------------ prefix


def prefix_probe(shape: str, out: Path | None) -> None:
    """A 16-token piece after a cached prefix: the whole model's forward pass, at held
    lengths the thread has not met (1 row; and 8 rows, as a group of later turns is
    prefilled), the first call at each and a second one, in ms. Whether the attention's
    key length, which a bucketed piece leaves free, costs a set-up of its own."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    path = model_path(shape)
    model, _ = load(str(path))
    h, kvh = HEADS[shape]
    d = bench_gpu.SHAPES[shape]["hidden_size"] // h

    def call(rows: int, held: int, piece: int = 16) -> float:
        cache = make_prompt_cache(model)
        for layer in cache:
            zeros = mx.zeros((rows, kvh, held, d), mx.bfloat16)
            layer.state = (zeros, zeros, held)
        mx.eval([layer.keys for layer in cache])
        began = time.perf_counter()
        mx.eval(model(mx.zeros((rows, piece), mx.uint32), cache=cache))
        return (time.perf_counter() - began) * 1000

    call(1, 512)  # the thread's first pass
    for rows in (1, 8):
        helds = [1000 + 37 * i + rows for i in range(8)]
        first = [call(rows, n) for n in helds]
        again = [call(rows, n) for n in helds]
        # The key lengths met above, reached by a 32-token piece after 16 fewer held (a
        # new piece length at each key length): which of the two the set-up is kept by.
        same_keys = [call(rows, n - 16, 32) for n in helds]
        # A 32-token piece at key lengths new again.
        new_keys = [call(rows, n + 5, 32) for n in helds]
        emit(
            {
                "probe": "prefix",
                "shape": shape,
                "rows": rows,
                "held": helds,
                "first_ms": [round(x, 2) for x in first],
                "again_ms": [round(x, 2) for x in again],
                "piece32_same_keys_ms": [round(x, 2) for x in same_keys],
                "piece32_new_keys_ms": [round(x, 2) for x in new_keys],
            },
            out,
        )


# ------------------------------------------------------------------ graphs


def graphs_probe(out: Path | None, n: int = 300) -> None:
    """What each attention graph MLX's CUDA backend keeps costs: ``n`` causal attention
    calls at (query, key) lengths new to the thread (0.5B shape's heads, bf16), the
    first call's time, and the process's resident memory, GPU memory (nvidia-smi) and
    MLX's active memory every 100 graphs. Run in a fresh process: it sets
    ``MLX_CUDA_SDPA_CACHE_SIZE`` to hold them all."""
    os.environ["MLX_CUDA_SDPA_CACHE_SIZE"] = str(max(n + 64, 256))
    import mlx.core as mx

    def rss_mb() -> float:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS"))

    def gpu_mb() -> float:
        query = [
            "nvidia-smi",
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        ]
        rows = subprocess.run(query, capture_output=True, text=True).stdout.splitlines()
        return next(
            (float(r.split(",")[1]) for r in rows if int(r.split(",")[0]) == os.getpid()), 0.0
        )

    h, kvh = HEADS["qwen2.5-0.5b"]
    d = bench_gpu.SHAPES["qwen2.5-0.5b"]["hidden_size"] // h

    def call(q_len: int, k_len: int) -> float:
        q = mx.random.normal((1, h, q_len, d)).astype(mx.bfloat16)
        k = mx.random.normal((1, kvh, k_len, d)).astype(mx.bfloat16)
        mx.eval(q, k)
        began = time.perf_counter()
        mx.eval(mx.fast.scaled_dot_product_attention(q, k, k, scale=d**-0.5, mask="causal"))
        return (time.perf_counter() - began) * 1000

    call(16, 16)
    base = (rss_mb(), gpu_mb(), mx.get_active_memory() / 2**20)
    times = []
    for i in range(n):
        times.append(call(16 + 8 * (i % 4), 300 + i))
        if (i + 1) % 100 == 0:
            emit(
                {
                    "probe": "graphs",
                    "card": bench_gpu.card(),
                    "graphs": i + 1,
                    "rss_mb": round(rss_mb() - base[0], 1),
                    "gpu_mb": gpu_mb() - base[1],
                    "active_mb": round(mx.get_active_memory() / 2**20 - base[2], 2),
                    "first_ms_median": round(statistics.median(times), 1),
                },
                out,
            )
    again = [call(16 + 8 * (i % 4), 300 + i) for i in range(20)]
    emit({"probe": "graphs", "again_ms_median": round(statistics.median(again), 2)}, out)


# ------------------------------------------------------------------ turns


def turns_probe(shape: str, out: Path | None, conversations: int = 36) -> None:
    """Second turns of conversations whose first turns have new lengths (about 500 to
    1,000 tokens): the time to the first token of each turn, one conversation at a time,
    the sides taking turns. SimpleEngine as it comes (its cached prefix served in whole
    key steps of 256 on CUDA), SimpleEngine with ``prefix_key_step=1`` (all that is
    cached), and raw mlx-lm (``stream_generate`` reusing the first turn's cache, trimmed
    to what the second shares, as mlx-lm's server does). Medians over the first third of
    the conversations and the last two thirds, in ms."""
    from mlx_lm import load, stream_generate
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    from mlx_integrations.engine import SimpleEngine
    from mlx_integrations.engine.cache.kv_files import common_prefix_len

    path = model_path(shape)
    model, tokenizer = load(str(path))
    loop = asyncio.new_event_loop()
    engines = {
        "engine": SimpleEngine(path),
        "engine-key-1": SimpleEngine(path, prefix_key_step=1),
    }
    for engine in engines.values():
        loop.run_until_complete(engine.start())

    def ours(engine: Any, first: str, second: str) -> tuple[float, float, int]:
        a = loop.run_until_complete(engine.generate(first, max_tokens=8, temperature=0.0))
        b = loop.run_until_complete(engine.generate(second, max_tokens=8, temperature=0.0))
        return a.ttft_s * 1000, b.ttft_s * 1000, b.cached_tokens

    def raw(first: str, second: str) -> tuple[float, float, int]:
        cache = make_prompt_cache(model)
        ttfts, held = [], []
        for text in (first, second):
            ids = tokenizer.encode(text)
            keep = min(common_prefix_len(held, ids), len(ids) - 1)
            trim_prompt_cache(cache, len(held) - keep)
            began = time.perf_counter()
            replies = stream_generate(model, tokenizer, ids[keep:], 8, prompt_cache=cache)
            first_token, made = None, []
            for reply in replies:
                if first_token is None:
                    first_token = (time.perf_counter() - began) * 1000
                made.append(reply.token)
            ttfts.append(first_token or 0.0)
            held = (ids + made)[: cache[0].offset]  # what the cache holds
        return ttfts[0], ttfts[1], keep

    sides = {
        "raw": raw,
        **{name: lambda f, s, e=engine: ours(e, f, s) for name, engine in engines.items()},
    }
    times: dict[str, list[tuple[float, float, int]]] = {name: [] for name in sides}
    for i in range(conversations):
        first = bench_gpu.words(330 + 14 * (i * 7 % conversations), offset=i)
        second = f"{first} {bench_gpu.words(12 + i % 7, offset=i + 3)}"
        names = list(sides)
        for name in names[i % len(names) :] + names[: i % len(names)]:
            times[name].append(sides[name](first, second))
    third = conversations // 3
    for name, rows in times.items():
        emit(
            {
                "probe": "turns",
                "shape": shape,
                "card": bench_gpu.card(),
                "side": name,
                "first_turn_ms": [round(r[0], 1) for r in rows],
                "second_turn_ms": [round(r[1], 1) for r in rows],
                "cached": [r[2] for r in rows],
                "second_median_first_third": round(
                    statistics.median(r[1] for r in rows[:third]), 1
                ),
                "second_median_rest": round(statistics.median(r[1] for r in rows[third:]), 1),
                "first_median": round(statistics.median(r[0] for r in rows), 1),
            },
            out,
        )
    for engine in engines.values():
        retire(engine, loop)
    loop.close()


# ------------------------------------------------------------------ host


def host_probe(shape: str, out: Path | None, tokens: int = 128, reps: int = 3) -> None:
    """Where the host time between mlx-lm's steps goes, c = 8 and 64 requests at once:
    ``batch_generate`` on the main thread and on a thread of its own, and BatchedEngine
    with its owner loop's parts timed (the engine's work after each generator step,
    aborts, admission). Per run: the time before the first prefill (head), after the
    last step (tail), and between steps (gaps: total and median), in ms; the decode
    steps' median, 10th and 90th percentiles and how many took over twice the median;
    the batch's layout (rows, key buffer, keys held) at its first and last decode step;
    the engine's parts (ms a step): its step, aborts, admission, the generator's step,
    and a group's placeholders (inserting the group, taking them out, and the generator's
    ``remove``, which also takes out rows retired early). ``ours-remove`` is the engine
    taking placeholders out as it did before 2026-12-06 15:00 (mlx-lm's ``remove``, then
    ``realign``). Each repetition starts one side later than the one before."""
    import importlib
    from concurrent.futures import ThreadPoolExecutor

    from mlx_lm import load

    from mlx_integrations.engine import BatchedEngine
    from mlx_integrations.engine.batched import engine as batched

    g = importlib.import_module("mlx_lm.generate")
    events: list[tuple[float, float, str]] = []  # mlx-lm's calls that had rows
    parts: dict[str, float] = {}
    layouts: list[tuple[int, ...]] = []  # (rows, key buffer, keys held) at each decode step

    def timed(owner: Any, name: str, key: str | None = None) -> None:
        fn = getattr(owner, name)

        def wrapper(*a: Any, **k: Any) -> Any:
            began = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                ended = time.perf_counter()
                if key is not None:
                    parts[key] = parts.get(key, 0.0) + ended - began
                elif a[0].uids:
                    events.append((began, ended, name))
                    if name == "_step":
                        layer = a[0].prompt_cache[0]
                        keys = getattr(layer, "keys", None)
                        held = getattr(layer, "_idx", -1)
                        layouts.append(
                            (len(a[0].uids), -1 if keys is None else keys.shape[2], held)
                        )

        setattr(owner, name, wrapper)

    timed(g.PromptProcessingBatch, "prompt")
    timed(g.GenerationBatch, "_step")
    timed(g.BatchGenerator, "next", "generator")
    timed(batched.BatchedEngine, "_step", "engine_step")
    timed(batched.BatchedEngine, "_drop_aborted", "drop_aborted")
    timed(batched.BatchedEngine, "_admit", "admit")
    # A group's placeholder rows: inserted with it, taken out after its prefill.
    timed(batched.BatchedEngine, "_insert_together", "group_insert")
    timed(g.BatchGenerator, "remove", "generator_remove")
    timed(batched, "drop_placeholders", "drop_placeholders")
    from mlx_integrations.engine.batched import arrivals

    def by_remove(generator: Any, uids: list[int]) -> None:
        """The engine's earlier way: mlx-lm's ``remove`` (a gather of every layer, the
        left padding read back), then the buffers grown back to whole steps."""
        generator.remove(uids)
        arrivals.realign(generator)

    def removing(run: Any) -> None:
        saved = batched.drop_placeholders
        batched.drop_placeholders = by_remove
        try:
            run()
        finally:
            batched.drop_placeholders = saved

    path = model_path(shape)
    model, tokenizer = load(str(path))
    thread = ThreadPoolExecutor(1)
    loop = asyncio.new_event_loop()
    eos = list(tokenizer.eos_token_ids)
    for c in (8, 64):
        prompts = [bench_gpu.words(20 + (i % 9), offset=i) for i in range(c)]
        engine = BatchedEngine(path, max_num_seqs=c, cache_memory_mb=0)
        loop.run_until_complete(engine.start())
        # The engine without padded pieces (no placeholder rows, no group warm-up).
        nopad = BatchedEngine(path, max_num_seqs=c, cache_memory_mb=0, prefill_buckets=False)
        loop.run_until_complete(nopad.start())
        old = BatchedEngine(path, max_num_seqs=c, cache_memory_mb=0)
        loop.run_until_complete(old.start())

        def as_ours(prompts: list[str] = prompts, c: int = c) -> None:
            """mlx-lm's generator set up and fed as the engine does (one place more than
            the batch, a row inserted at a time with its own stop sequences), driven in
            a plain loop: what the engine's loop adds, apart from the generator's use."""
            gen = g.BatchGenerator(model, completion_batch_size=c + 1, prefill_batch_size=c + 1)
            stop = g.StopSequences([[t] for t in eos])
            for ids in (tokenizer.encode(p) for p in prompts):
                gen.insert(
                    [ids],
                    max_tokens=[tokens],
                    caches=[None],
                    all_tokens=[[]],
                    samplers=[None],
                    logits_processors=[[]],
                    stop_sequences=[stop],
                )
            finished = 0
            while finished < c:
                _, responses = gen.next()
                finished += sum(r.finish_reason is not None for r in responses)
            gen.close()

        def raw(prompts: list[str] = prompts, c: int = c) -> None:
            raw_batch(model, tokenizer, [tokenizer.encode(p) for p in prompts], tokens, c)

        sides = {
            "raw": raw,
            "raw-thread": lambda: thread.submit(raw).result(),
            "ours": lambda e=engine, p=prompts: serve_all(loop, e, p, tokens),
            "ours-nopad": lambda n=nopad, p=prompts: serve_all(loop, n, p, tokens),
            "ours-remove": lambda o=old, p=prompts: removing(lambda: serve_all(loop, o, p, tokens)),
            "raw-as-ours": lambda: thread.submit(as_ours).result(),
        }
        for side in sides.values():  # one run each: shapes met
            side()
        names = list(sides)
        for rep in range(reps):
            # Each repetition starts one side later: no side always follows the same one.
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                side = sides[name]
                events.clear()
                parts.clear()
                layouts.clear()
                began = time.perf_counter()
                side()
                ended = time.perf_counter()
                ev = sorted(events)
                gaps = [(b[0] - a[1]) * 1000 for a, b in itertools.pairwise(ev)]
                steps = sum(1 for e in ev if e[2] == "_step") or 1
                step_ms = sorted((e[1] - e[0]) * 1000 for e in ev if e[2] == "_step")
                emit(
                    {
                        "probe": "host",
                        "shape": shape,
                        "card": bench_gpu.card(),
                        "c": c,
                        "side": name,
                        "rep": rep,
                        "ms": round((ended - began) * 1000, 1),
                        "head_ms": round((ev[0][0] - began) * 1000, 2),
                        "tail_ms": round((ended - ev[-1][1]) * 1000, 2),
                        "gaps_ms": round(sum(gaps), 1),
                        # The longest gaps: ms, the call index after it, the calls around it.
                        "gaps_top": [
                            [round(gaps[i], 2), i + 1, ev[i][2], ev[i + 1][2]]
                            for i in sorted(range(len(gaps)), key=lambda i: -gaps[i])[:5]
                        ],
                        "gap_ms_median": round(statistics.median(gaps), 3),
                        "calls": len(ev),
                        "step_ms_median": round(statistics.median(step_ms), 3),
                        "step_ms_p10_p90": [
                            round(step_ms[len(step_ms) // 10], 3),
                            round(step_ms[len(step_ms) * 9 // 10], 3),
                        ],
                        "steps_over_2x_median": sum(
                            t > 2 * statistics.median(step_ms) for t in step_ms
                        ),
                        "layout_first_last": [layouts[0], layouts[-1]] if layouts else [],
                        "layouts": len(set(layouts)),
                        "steps": steps,
                        "parts_ms_per_step": {
                            k: round(v * 1000 / steps, 3) for k, v in parts.items()
                        },
                    },
                    out,
                )
        retire(engine, loop)
        retire(nopad, loop)
        retire(old, loop)
    thread.shutdown()
    loop.close()


# ------------------------------------------------------------------ neighbour


def neighbour_probe(shape: str, out: Path | None, tokens: int = 128, runs: int = 8) -> None:
    """Does an engine in the process slow mlx-lm's own batches? ``batch_generate`` on 8
    prompts, ``runs`` times in each phase: alone in the process; after a BatchedEngine
    has started there (its threads idle); while the engine serves the same 8 prompts
    (its runs); after it has served them. Wall ms per run; each phase also says which
    functions the process's other threads were seen in (sampled every 2 ms): an engine
    that works beside the runs would show there."""
    import traceback

    from mlx_lm import load

    from mlx_integrations.engine import BatchedEngine

    path = model_path(shape)
    model, tokenizer = load(str(path))
    prompts = [bench_gpu.words(20 + (i % 9), offset=i) for i in range(8)]
    ids = [tokenizer.encode(p) for p in prompts]
    seen: dict[str, int] = {}
    main = threading.get_ident()
    stop = threading.Event()

    def sample() -> None:
        me = threading.get_ident()
        while not stop.wait(0.002):
            for tid, frame in sys._current_frames().items():
                if tid not in (me, main):
                    where = traceback.extract_stack(frame)[-1]
                    key = f"{where.name} ({Path(where.filename).name}:{where.lineno})"
                    seen[key] = seen.get(key, 0) + 1

    def phase(name: str, run: Any) -> None:
        ms = []
        seen.clear()
        for _ in range(runs):
            began = time.perf_counter()
            run()
            ms.append(round((time.perf_counter() - began) * 1000, 1))
        top = sorted(seen.items(), key=lambda kv: -kv[1])[:3]
        emit(
            {
                "probe": "neighbour",
                "shape": shape,
                "card": bench_gpu.card(),
                "phase": name,
                "ms": ms,
                "others_seen": top,
            },
            out,
        )

    def raw() -> None:
        raw_batch(model, tokenizer, ids, tokens)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    loop = asyncio.new_event_loop()
    engine = BatchedEngine(path, max_num_seqs=8, cache_memory_mb=0)
    try:
        phase("raw-alone", raw)
        loop.run_until_complete(engine.start())
        phase("raw-engine-idle", raw)
        phase("engine", lambda: serve_all(loop, engine, prompts, tokens))
        phase("raw-after-engine", raw)
    finally:
        stop.set()
        retire(engine, loop)
        loop.close()


# ------------------------------------------------------------------ pool


class StepClock:
    """mlx-lm's decode steps wherever they run, per run (a :class:`StepTracer`'s events,
    summed): their count and median wall time, and per step the time in ``mx.eval``
    (waiting for the step before: the GPU's share), in ``mx.async_eval`` (MLX encoding
    and submitting the step's kernels), the rest (Python building the step's graph) and
    the thread's CPU time."""

    def __init__(self) -> None:
        self.tracer = StepTracer()
        self.tracer.install()

    def reset(self) -> None:
        self.tracer.take()

    def report(self) -> dict[str, Any]:
        steps = [e for e in self.tracer.take() if e[0] == "decode"]
        n = max(len(steps), 1)
        wall, submit, wait, cpu = (sum(e[i] for e in steps) for i in (3, 4, 5, 6))

        def per_step(ms: float) -> float:
            return round(ms / n, 3)

        return {
            "steps": len(steps),
            "step_ms_median": round(statistics.median(e[3] for e in steps), 3) if steps else 0.0,
            "wait_ms_per_step": per_step(wait),
            "submit_ms_per_step": per_step(submit),
            "build_ms_per_step": per_step(wall - wait - submit),
            "cpu_ms_per_step": per_step(cpu),
        }

    def close(self) -> None:
        self.tracer.remove()


def owner_probe(
    shape: str,
    out: Path | None,
    tokens: int = 128,
    reps: int = 5,
    sizes: tuple[int, ...] = (8, 32, 64),
) -> None:
    """Why mlx-lm's decode step takes longer inside BatchedEngine than in
    ``batch_generate``, at each batch size of ``sizes``: the same step timed
    (:class:`StepClock`) for ``batch_generate`` on the main thread (``raw``), on a thread
    of its own (``raw-thread``), on the engine's owner thread (``raw-owner``), on the main
    thread with the engine's model object (``raw-engine-model``), and the engine serving
    (``ours``); the sides rotate each repetition."""
    from concurrent.futures import ThreadPoolExecutor

    from mlx_lm import load

    from mlx_integrations.engine import BatchedEngine

    clock = StepClock()
    path = model_path(shape)
    model, tokenizer = load(str(path))
    thread = ThreadPoolExecutor(1)
    loop = asyncio.new_event_loop()
    try:
        for c in sizes:
            prompts = [bench_gpu.words(20 + (i % 9), offset=i) for i in range(c)]
            ids = [tokenizer.encode(p) for p in prompts]
            engine = BatchedEngine(path, max_num_seqs=c, cache_memory_mb=0)
            loop.run_until_complete(engine.start())

            def raw(m: Any = model, ids: list[list[int]] = ids, c: int = c) -> None:
                raw_batch(m, tokenizer, ids, tokens, c)

            sides = {
                "raw": raw,
                "raw-thread": lambda: thread.submit(raw).result(),
                "raw-owner": lambda e=engine: e._executor.submit(raw).result(),
                "raw-engine-model": lambda e=engine: raw(e._model),
                "ours": lambda e=engine, p=prompts: serve_all(loop, e, p, tokens),
            }
            for side in sides.values():  # one run each: shapes met
                side()
            names = list(sides)
            for rep in range(reps):
                for name in names[rep % len(names) :] + names[: rep % len(names)]:
                    clock.reset()
                    began = time.perf_counter()
                    sides[name]()
                    emit(
                        {
                            "probe": "owner",
                            "shape": shape,
                            "card": bench_gpu.card(),
                            "c": c,
                            "side": name,
                            "rep": rep,
                            "ms": round((time.perf_counter() - began) * 1000, 1),
                            **clock.report(),
                        },
                        out,
                    )
            retire(engine, loop)
    finally:
        thread.shutdown()
        loop.close()
        clock.close()


def pool_probe(shape: str, out: Path | None, tokens: int = 128, runs: int = 5) -> None:
    """Does what MLX's buffer pool holds decide a run's speed? MLX's CUDA backend moves
    a buffer the host reads into managed memory for good, and a freed buffer goes back
    to one pool that later kernels draw from, whichever memory it is. ``batch_generate``
    on 8 prompts, ``runs`` times in each phase: alone; after the pool was filled with
    buffers the host wrote and read (1 KiB to 4 MiB); after ``mx.clear_cache()``; beside
    an idle BatchedEngine; after the engine served; after ``clear_cache`` again; then the
    engine serving after a ``clear_cache`` each run. Per run: wall ms, the decode steps'
    median (ms) and, per step, the time mlx-lm waited in ``mx.eval`` for the step
    before (the GPU's share) and the rest (building and submitting: the host's)."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm import load

    from mlx_integrations.engine import BatchedEngine

    clock = StepClock()
    path = model_path(shape)
    model, tokenizer = load(str(path))
    prompts = [bench_gpu.words(20 + (i % 9), offset=i) for i in range(8)]
    ids = [tokenizer.encode(p) for p in prompts]
    loop = asyncio.new_event_loop()
    engine = BatchedEngine(path, max_num_seqs=8, cache_memory_mb=0)

    def raw() -> None:
        raw_batch(model, tokenizer, ids, tokens)

    def serve() -> None:
        serve_all(loop, engine, prompts, tokens)

    def phase(name: str, run: Any, before: Any = None) -> None:
        for i in range(runs):
            if before is not None:
                before()
            cached = mx.get_cache_memory()
            clock.reset()
            began = time.perf_counter()
            run()
            ms = (time.perf_counter() - began) * 1000
            emit(
                {
                    "probe": "pool",
                    "shape": shape,
                    "card": bench_gpu.card(),
                    "phase": name,
                    "run": i,
                    "ms": round(ms, 1),
                    **clock.report(),
                    "pool_mb_before": round(cached / 2**20, 1),
                },
                out,
            )

    def poison() -> None:
        """Fill the pool with buffers the host wrote, and device buffers the host read."""
        held = []
        for size in [2**k for k in range(10, 14)] + [
            16384 * m for m in (1, 2, 3, 4, 8, 16, 64, 256)
        ]:
            for _ in range(6):
                held.append(mx.array(np.ones(size, np.uint8)))
                read = mx.ones((size,), mx.uint8) + 1
                mx.eval(read)
                np.array(read, copy=False).sum()
                held.append(read)
        del held

    raw()  # shapes met
    try:
        phase("raw-alone", raw)
        poison()
        phase("raw-after-poison", raw)
        mx.clear_cache()
        phase("raw-after-clear", raw)
        loop.run_until_complete(engine.start())
        phase("raw-engine-idle", raw)
        phase("engine", serve)
        phase("raw-after-engine", raw)
        mx.clear_cache()
        phase("raw-after-engine-clear", raw)
        phase("engine-clear-each", serve, mx.clear_cache)
        phase("raw-clear-each", raw, mx.clear_cache)
    finally:
        retire(engine, loop)
        loop.close()
        clock.close()


# ------------------------------------------------------------------ provenance

PROVENANCE_SCENARIOS = (
    "fresh",
    "after-half",
    "after-warm-batch",
    "largest-first",
    "after-shapes",
    "after-growth",
    "after-groups",
)


def check_scenarios(names: list[str]) -> None:
    """Stop at a provenance scenario the probe does not know, before anything runs."""
    for i, name in enumerate(names):
        if name not in PROVENANCE_SCENARIOS:
            known = ", ".join(PROVENANCE_SCENARIOS)
            raise SystemExit(f"unknown provenance scenario {name!r}: use one of {known}")
        if name in names[:i]:
            raise SystemExit(f"provenance scenario {name!r} given twice: name each once")


def provenance_probe(
    shape: str,
    out: Path | None,
    tokens: int = 128,
    reps: int = 3,
    c: int = 64,
    names: tuple[str, ...] = PROVENANCE_SCENARIOS,
) -> None:
    """What a thread met before slows its batch of ``c``? MLX's CUDA backend keys the
    CUDA graphs it keeps per thread and stream by their node types and edges only, not
    by the kernels' shapes, and updates a kept graph to each new one of the same key:
    a batch of ``c`` may then run on graphs first made for another shape. Each
    scenario runs on a new thread, ``batch_generate`` on ``c`` prompts timed last:
    ``fresh`` (nothing before), ``after-half`` (a batch of ``c // 2`` first),
    ``after-warm-batch`` (the engine's batch warm-up, every size up to ``c``),
    ``largest-first`` (a batch of ``c`` first, then that warm-up) and ``after-shapes``
    (the engine's prefill-shape warm-up of a lone request); the batch warm-up's two
    halves apart: ``after-growth`` (its batches growing a row a step to ``c``, and the
    joining and shrinking rows) and ``after-groups`` (its padded groups, at each bucket
    and row count). ``names`` picks the scenarios. Every scenario runs once
    first on a thread of its own, untimed, so that MLX compiled every kernel for the
    process; the scenarios then rotate, ``reps`` times. Per run: the decode steps'
    median and per-step parts (:class:`StepClock`)."""
    import functools

    import mlx.core as mx

    from mlx_integrations.engine import BatchedEngine
    from mlx_integrations.engine.batched.warmup import warm_batch, warm_groups
    from mlx_integrations.engine.decoding import warm_shapes

    clock = StepClock()
    loop = asyncio.new_event_loop()
    # The engine's model, buckets and piece size, with no warm-up of its own.
    engine = BatchedEngine(
        model_path(shape), max_num_seqs=c, cache_memory_mb=0, warmup_shapes=False
    )
    loop.run_until_complete(engine.start())
    model, tokenizer = engine._model, engine._tokenizer
    shapes, step = engine._shapes, engine._prefill_step_size

    def batch(n: int, length: int = tokens) -> None:
        ids = [tokenizer.encode(bench_gpu.words(20 + (i % 9), offset=i)) for i in range(n)]
        raw_batch(model, tokenizer, ids, length, n)

    def groups() -> None:  # as warm_batch ends: MLX's buffer cache emptied
        warm_groups(model, step, shapes, c)
        mx.clear_cache()

    half, full = f"batch of {max(c // 2, 1)}", f"batch of {c}"
    warm = ("warm_batch", functools.partial(warm_batch, model, step, shapes, c))
    before: dict[str, list[tuple[str, Callable[[], Any]]]] = {
        "fresh": [],
        "after-half": [(half, functools.partial(batch, max(c // 2, 1), 8))],
        "after-warm-batch": [warm],
        "largest-first": [(full, functools.partial(batch, c, 8)), warm],
        "after-shapes": [("warm_shapes", functools.partial(warm_shapes, model, shapes, step))],
        "after-growth": [
            (
                "warm_batch(groups=False)",
                functools.partial(warm_batch, model, step, shapes, c, groups=False),
            )
        ],
        "after-groups": [("warm_groups", groups)],
    }

    def scenario(name: str) -> dict[str, Any]:
        for _, prepare in before[name]:
            prepare()
        clock.reset()
        began = time.perf_counter()
        batch(c)
        return {
            "history": [label for label, _ in before[name]],
            "ms": round((time.perf_counter() - began) * 1000, 1),
            **clock.report(),
        }

    try:
        for name in names:  # kernels compiled for the process
            side_thread(f"prov-setup-{name}").submit(scenario, name).result()
        for rep in range(reps):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                record = side_thread(f"prov-{name}").submit(scenario, name).result()
                emit(
                    {
                        "probe": "provenance",
                        "shape": shape,
                        "card": bench_gpu.card(),
                        "c": c,
                        "scenario": name,
                        "rep": rep,
                        **record,
                    },
                    out,
                )
    finally:
        retire(engine, loop)
        loop.close()
        clock.close()


# ------------------------------------------------------------------ trace


def summarize(
    name: str, seconds: float, events: list[Any], first_token: float | None
) -> dict[str, Any]:
    decode = [e for e in events if e[0] == "decode"]
    prefill = [e for e in events if e[0] == "prefill"]
    median = statistics.median(e[3] for e in decode) if decode else 0.0
    slow = [e for e in decode if e[3] > 3 * median]
    return {
        "run": name,
        "seconds": round(seconds, 3),
        "slowest_first_token_s": None if first_token is None else round(first_token, 3),
        "prefill_ms": [[e[1], e[2], round(e[3], 1)] for e in prefill],
        "decode_steps": len(decode),
        "decode_ms_total": round(sum(e[3] for e in decode), 1),
        "decode_ms_median": round(median, 2),
        "slow_steps": len(slow),
        "slow_ms_total": round(sum(e[3] for e in slow), 1),
        "slow_lengths": [e[2] for e in slow][:40],
        "slow_rows": sorted({e[1] for e in slow}),
    }


# Trace orders that run the engine alone (no raw side): the default engine and its
# probes, each with the options it is made with (_gpu_owners.probed_engine).
ENGINE_ALONE: dict[str, dict[str, Any]] = {
    "engine": {},
    # no warm-up at load (neither a lone request's shapes nor a batch's)
    "engine-nowarm": {"warmup_shapes": False},
    # no padded pieces at all (nor placeholder rows, nor a warm-up)
    "engine-nobuckets": {"prefill_buckets": False},
    # the load's whole warm-up on a thread of its own, not the owner thread that serves
    "engine-elsewhere": {"warm_elsewhere": True},
    # the batch warm-up on the owner thread too, as before the package ran it aside
    "engine-ownerwarm": {"warm_batch_on_owner": True},
    # the batch warm-up's groups on the owner thread, the rest aside
    "engine-groupsowner": {"warm_groups_on_owner": True},
    # the batch warm-up's growth to every size on the owner thread, its groups aside
    "engine-growthowner": {"warm_growth_on_owner": True},
    # a full batch decoded on the owner thread before the load's warm-up
    "engine-largest": {"largest_first": True},
    # that, then the whole warm-up on the owner thread
    "engine-ownerwarm-largest": {"warm_batch_on_owner": True, "largest_first": True},
}
TRACE_KINDS = ("engine-first", "raw-first", "raw", *ENGINE_ALONE)


def check_orders(orders: list[str]) -> None:
    """Stop at an order ``--orders`` cannot run, naming the ones it can."""
    for order in orders:
        kind, at, seqs = order.partition("@")
        if kind not in TRACE_KINDS or (at and not seqs.isdigit()):
            raise SystemExit(
                f"unknown trace order {order!r}: use one of {', '.join(TRACE_KINDS)}, "
                "each optionally with @N (room for N requests)"
            )


def trace_scenario(shape: str, order: str, tokens: int, out: Path | None) -> None:
    from mlx_lm import load

    check_orders([order])
    path = model_path(shape)
    # engine@N: the default engine with room for N; its warm-up meets the row counts of
    # N + 1 places (a group of 8 is padded to 12 rows at 16 or 32: only the load differs).
    kind, _, seqs = order.partition("@")
    tracer = StepTracer()
    tracer.install()
    # mlx-lm's own model only where raw runs (not for the engine alone).
    alone = kind in ENGINE_ALONE
    model, tokenizer = (None, None) if alone else load(str(path))
    sets = {
        "a": [bench_gpu.words(20 + (i % 9), offset=i) for i in range(8)],
        "new-lengths": [bench_gpu.words(41 + 3 * i, offset=i + 5) for i in range(8)],
        # Lengths new again, each within one word of a new-lengths one: one padded shape
        # for the engine (the same buckets), new shapes for raw.
        "other-lengths": [bench_gpu.words(42 + 3 * i, offset=i + 9) for i in range(8)],
    }
    # Room for 16: a group of 8 is padded (with placeholder rows) as a server's would be.
    engine = bench_gpu.variant_engine(path, int(seqs or 16), ENGINE_ALONE.get(kind, {}))
    loop = asyncio.new_event_loop()
    began = time.perf_counter()
    loop.run_until_complete(engine.start())
    emit(
        {
            "probe": "trace",
            "order": order,
            "shape": shape,
            "load_s": round(time.perf_counter() - began, 3),
            "warmup_s": engine.warmup_seconds,
            "max_num_seqs": engine._max_num_seqs,
        },
        out,
    )

    def ours(label: str, prompts: list[str]) -> None:
        tracer.take()
        start = time.perf_counter()
        outs = serve_all(loop, engine, prompts, tokens)
        seconds = time.perf_counter() - start
        record = summarize(f"engine {label}", seconds, tracer.take(), max(o.ttft_s for o in outs))
        record["grouped_so_far"] = engine.get_stats()["grouped_prefill_requests"]
        emit({"probe": "trace", "order": order, "shape": shape, **record}, out)

    def raw(label: str, prompts: list[str]) -> None:
        ids = [tokenizer.encode(p) for p in prompts]
        tracer.take()
        start = time.perf_counter()
        raw_batch(model, tokenizer, ids, tokens, 8)
        seconds = time.perf_counter() - start
        emit(
            {
                "probe": "trace",
                "order": order,
                "shape": shape,
                **summarize(f"raw {label}", seconds, tracer.take(), None),
            },
            out,
        )

    sides = {"engine-first": [ours, raw], "raw-first": [raw, ours], "raw": [raw]}.get(kind, [ours])
    try:
        for label in ("a", "a-again", "new-lengths", "other-lengths"):
            for side in sides:
                side(label, sets["a" if label == "a-again" else label])
    finally:
        retire(engine, loop)
        loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", default="sdpa,trace")
    parser.add_argument("--shapes", default="qwen2.5-0.5b")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument(
        "--host-reps",
        type=int,
        default=3,
        help="runs a side (host, owner), repetitions (provenance)",
    )
    parser.add_argument(
        "--owner-sizes", default="8,32,64", help="batch sizes of the owner probe, commas"
    )
    parser.add_argument("--orders", default="engine-first,raw-first")
    parser.add_argument(
        "--provenance-c", type=int, default=64, help="batch size the provenance probe times"
    )
    parser.add_argument(
        "--provenance-scenarios",
        default=",".join(PROVENANCE_SCENARIOS),
        help="the provenance probe's scenarios, commas",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--scenario", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    if args.scenario is not None:  # a child process: one scenario
        trace_scenario(args.shapes, args.scenario, args.tokens, args.out)
        return
    probes = args.probes.split(",")
    if "trace" in probes:
        check_orders(args.orders.split(","))
    scenarios = tuple(args.provenance_scenarios.split(","))
    if "provenance" in probes:
        check_scenarios(list(scenarios))
    for shape in args.shapes.split(","):
        if "sdpa" in probes:
            sdpa_probe(shape, args.out)
        if "graphs" in probes:
            graphs_probe(args.out)
        if "prefix" in probes:
            prefix_probe(shape, args.out)
        if "turns" in probes:
            turns_probe(shape, args.out)
        if "host" in probes:
            host_probe(shape, args.out, args.tokens, args.host_reps)
        if "neighbour" in probes:
            neighbour_probe(shape, args.out, args.tokens)
        if "pool" in probes:
            pool_probe(shape, args.out, args.tokens)
        if "provenance" in probes:
            provenance_probe(
                shape, args.out, args.tokens, args.host_reps, args.provenance_c, scenarios
            )
        if "owner" in probes:
            sizes = tuple(int(c) for c in args.owner_sizes.split(","))
            owner_probe(shape, args.out, args.tokens, args.host_reps, sizes)
        if "trace" in probes:
            for order in args.orders.split(","):
                cmd = [
                    sys.executable,
                    __file__,
                    "--scenario",
                    order,
                    "--shapes",
                    shape,
                    "--tokens",
                    str(args.tokens),
                ]
                if args.out is not None:
                    cmd += ["--out", str(args.out)]
                done = subprocess.run(cmd, env=os.environ)
                if done.returncode:
                    emit(
                        {"probe": "trace", "order": order, "shape": shape, "exit": done.returncode},
                        args.out,
                    )


if __name__ == "__main__":
    main()
