"""Our engines against raw mlx-lm on a GPU, on random-weight Qwen2.5-0.5B and 1.5B shapes.

Four parts, each in a process of its own (a CUDA failure ends only that part); the
timed ones give each figure as ours over raw with the sides alternating
(bench/harness.py): the median of the per-round ratios and their range.

1. **ttft**: time to first token on prompts new to the process, of about
   ``--ttft-lengths`` tokens (32, 512, 1,700, 4,000): ``SimpleEngine`` with the
   device's defaults (``--engine-options`` JSON adds or overrides options) against
   ``mlx_lm.stream_generate``. *cold* is a prompt of a length no earlier request of the
   process had; *repeat* the next prompt of that same length. Also reported: what the
   engine's load and warm-up took against ``mlx_lm.load``, and each side's first
   request. The greedy tokens of both sides are compared after the timing.
2. **single**: greedy decode tokens/s (first token to last) of
   ``SimpleEngine.stream_generate`` against ``mlx_lm.stream_generate`` on one prompt,
   after ``--warmup`` untimed runs a side.
3. **batched**: ``BatchedEngine(max_num_seqs=c)`` serving ``c`` requests at once
   against ``mlx_lm.batch_generate`` with the same batch sizes, for each ``c`` of
   ``--concurrency``: generated tokens over wall time, prefill included, both sides
   from text to text. The first run of each side at each ``c`` (new shapes for both) is
   reported apart, with the engine's load and warm-up seconds.
4. **equality**: greedy tokens of ``SimpleEngine`` and of ``BatchedEngine`` (one
   request at a time) against mlx-lm's ``generate_step``, on ``--equality-prompts``
   new prompts of lengths spread from 8 to 3,000 tokens (past one prefill piece),
   ``--equality-tokens`` tokens each, with ``prefill_buckets`` on and off, the
   ``prefill_step_size`` of raw's default (2048) and no prefix cache, so each prompt is
   computed whole. For each engine and setting: the replies identical to raw's, and
   for each other one the first step that differs, how far apart raw's two best
   logits were there (in bfloat16 steps of the larger, 0 a tie) and whether the engine's
   token was one of those two; *near ties* counts those two steps apart at most.

The models are random bf16 weights of the real shapes (151,936-token tied head) over a
small tokenizer: the embedding rows are zero but those of tokens that read as printable
ASCII alone, so greedy decoding never ends early and both sides make the same tokens.

Run (on the GPU machine): ``python bench/bench_gpu.py --json bench_gpu.json``;
``--quick`` runs a tiny shape with small counts, a check that runs on a CPU in a
minute. ``--budget-s`` skips the parts that would start past it and stops the one
running at it (the batched part keeps the batch sizes it finished).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import Spread, alternate, compare, parser, save

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
SYLLABLES = "ka lo mi ne su ta ri po ve za du fe gi ho ju".split()


def build_model(out: Path, shape: dict[str, int], seed: int = 0) -> Path:
    """A random bf16 Qwen2 model of ``shape`` with a 151,936-token head (see above)."""
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
    flat: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    weights = {k: v.astype(mx.bfloat16) for k, v in flat}
    name = "model.embed_tokens.weight"
    weights[name] = weights[name] * mx.array(keep[:, None], dtype=mx.bfloat16)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def words(n: int, offset: int = 0) -> str:
    return " ".join(WORDS[(i * 7 + offset) % len(WORDS)] for i in range(n))


class Prompts:
    """New prompts: fresh words, and a token count no earlier prompt had."""

    def __init__(self, tokenizer: Any, seed: int = 7):
        self._encode = tokenizer.encode
        self._random = random.Random(seed)
        self.seen: set[int] = set()

    def _words(self, n: int) -> list[str]:
        pick = self._random.choice
        return ["".join(pick(SYLLABLES) for _ in range(1 + len(self.seen) % 3)) for _ in range(n)]

    def new(self, target: int, length: int | None = None) -> tuple[str, list[int]]:
        """About ``target`` tokens of a count no earlier prompt had; or exactly ``length``."""
        want = length or target
        for _ in range(50):
            chosen = self._words(max(1, want // 2))
            while len(self._encode(" ".join(chosen))) < want:
                chosen += self._words(max(1, (want - len(self._encode(" ".join(chosen)))) // 2))
            while len(chosen) > 1 and len(self._encode(" ".join(chosen[:-1]))) >= want:
                chosen.pop()
            text = " ".join(chosen)
            if length is None:
                while len(self._encode(text)) in self.seen:
                    text += " " + self._words(1)[0]
                self.seen.add(len(self._encode(text)))
                return text, self._encode(text)
            if len(self._encode(text)) == length:
                return text, self._encode(text)
        raise RuntimeError(f"no prompt of exactly {length} tokens")


def raw_stream(model: Any, tokenizer: Any, prompt: list[int], tokens: int) -> dict[str, Any]:
    """mlx-lm's stream_generate: TTFT from the call, decode rate from first token to last."""
    from mlx_lm import stream_generate

    start = time.perf_counter()
    first = None
    out = []
    for r in stream_generate(model, tokenizer, prompt, max_tokens=tokens):
        out.append(int(r.token))
        if first is None:
            first = time.perf_counter()
    assert first is not None
    rate = (len(out) - 1) / (time.perf_counter() - first) if len(out) > 1 else 0.0
    return {"tokens": out, "ttft": first - start, "tps": rate}


async def engine_stream(engine: Any, prompt: str, tokens: int) -> dict[str, Any]:
    start = time.perf_counter()
    first = None
    last: Any = None
    async for out in engine.stream_generate(prompt, max_tokens=tokens, temperature=0.0):
        if first is None:
            first = time.perf_counter()
        last = out
    assert first is not None and last is not None
    n = last.completion_tokens
    rate = (n - 1) / (time.perf_counter() - first) if n > 1 else 0.0
    return {"tokens": list(last.tokens), "ttft": first - start, "tps": rate}


def bf16_steps(a: float, b: float) -> float:
    """``|a - b|`` in bfloat16 steps (units in the last place) at the larger of the two."""
    import math

    top = max(abs(a), abs(b))
    if top == 0:
        return 0.0
    return abs(a - b) / 2.0 ** (math.frexp(top)[1] - 8)


def raw_greedy(model: Any, ids: list[int], tokens: int, step: int) -> dict[str, Any]:
    """mlx-lm's ``generate_step``, greedy: its tokens and, at each step, its two best
    logits and their tokens (read by a logits processor that hands the logits on as
    they are)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    best: list[tuple[Any, Any]] = []

    def read(_: Any, logits: Any) -> Any:
        order = mx.argsort(-logits[0].astype(mx.float32))[:2]
        best.append((order, logits[0][order]))
        return logits

    steps = generate_step(
        mx.array(ids), model, max_tokens=tokens, prefill_step_size=step, logits_processors=[read]
    )
    out = [int(t) for t, _ in steps]
    mx.eval(best)
    top2 = [
        ([int(i) for i in order.tolist()], [float(v) for v in values.astype(mx.float32).tolist()])
        for order, values in best[: len(out)]
    ]
    return {"tokens": out, "top2": top2}


def equality_lengths(n: int, longest: int) -> list[int]:
    """``n`` prompt lengths spread evenly on a log scale from 8 tokens to ``longest``."""
    if n == 1:
        return [longest]
    return [round(8 * (longest / 8) ** (i / (n - 1))) for i in range(n)]


def agreement(raw: list[dict[str, Any]], ours: list[list[int]]) -> dict[str, Any]:
    """How ``ours`` (replies) agree with ``raw`` (``raw_greedy`` of the same prompts)."""
    split = []
    for k, (ref, got) in enumerate(zip(raw, ours, strict=True)):
        if got == ref["tokens"]:
            continue
        at = next(
            (i for i, (a, b) in enumerate(zip(got, ref["tokens"], strict=False)) if a != b), None
        )
        if at is None:  # one reply is the other's start: ended early
            split.append({"prompt": k, "step": min(len(got), len(ref["tokens"])), "ended": True})
            continue
        order, values = ref["top2"][at]
        split.append(
            {
                "prompt": k,
                "step": at,
                "top2_bf16_steps": bf16_steps(*values),
                "ours_among_top2": got[at] in order,
            }
        )
    near = [d for d in split if d.get("top2_bf16_steps", 99) <= 2 and d["ours_among_top2"]]
    return {
        "identical": len(ours) - len(split),
        "prompts": len(ours),
        "diverged_near_ties": len(near),
        "divergences": split,
    }


def bench_equality(path: Path, model: Any, tokenizer: Any, args: Any) -> dict[str, Any]:
    """Greedy tokens of the engines against ``generate_step`` (see the module)."""
    from mlx_integrations.engine import BatchedEngine, SimpleEngine

    step = 2048  # generate_step's default
    prompts = Prompts(tokenizer, seed=11)
    made = [prompts.new(n) for n in equality_lengths(args.equality_prompts, args.equality_longest)]
    raw = [raw_greedy(model, ids, args.equality_tokens, step) for _, ids in made]
    out: dict[str, Any] = {
        "prompt_tokens": [len(ids) for _, ids in made],
        "tokens": args.equality_tokens,
        "prefill_step_size": step,
        "engines": {},
    }
    kinds = {"simple": (SimpleEngine, {}), "batched": (BatchedEngine, {"max_num_seqs": 1})}
    for kind in args.equality_engines:
        for buckets in (True, False):
            cls, extra = kinds[kind]
            engine = cls(
                path,
                cache_memory_mb=0,
                prefill_step_size=step,
                prefill_buckets=buckets,
                **extra,
            )
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(engine.start())
                replies = []
                for text, ids in made:
                    reply = loop.run_until_complete(
                        engine.generate(text, max_tokens=args.equality_tokens, temperature=0.0)
                    )
                    assert reply.prompt_tokens == len(ids), (reply.prompt_tokens, len(ids))
                    replies.append(list(reply.tokens))
            finally:
                loop.run_until_complete(engine.stop())
                loop.close()
            name = f"{kind} prefill_buckets={buckets}"
            out["engines"][name] = agreement(raw, replies)
            save_part(args.part_out, out | {"partial": True})
    return out


def started(engine: Any, loop: asyncio.AbstractEventLoop) -> dict[str, float | None]:
    """Start ``engine``; the seconds its load took, and those of its warm-up within."""
    began = time.perf_counter()
    loop.run_until_complete(engine.start())
    return {"load_s": time.perf_counter() - began, "warmup_s": engine.warmup_seconds}


def bench_ttft(path: Path, model: Any, tokenizer: Any, args: Any) -> dict[str, Any]:
    """Cold and repeat time to first token per length class (see the module)."""
    from mlx_lm import stream_generate

    from mlx_integrations.engine import SimpleEngine

    prompts = Prompts(tokenizer)
    options = {"cache_memory_mb": 0} | json.loads(args.engine_options)
    engine = SimpleEngine(path, **options)
    loop = asyncio.new_event_loop()
    out: dict[str, Any] = {"engine_options": options} | started(engine, loop)

    def raw_ttft(ids: list[int]) -> float:
        return float(raw_stream(model, tokenizer, ids, 2)["ttft"])

    def ours_ttft(text: str) -> float:
        return float(loop.run_until_complete(engine_stream(engine, text, 2))["ttft"])

    try:
        # The first request of each side (what a process and a thread set up), apart.
        out["first_request_s"] = {
            "raw": raw_ttft(prompts.new(9)[1]),
            "ours": ours_ttft(prompts.new(9)[0]),
        }
        out["lengths"] = {}
        for target in args.ttft_lengths:
            times: dict[str, dict[str, list[float]]] = {"cold": {}, "repeat": {}}

            def raw_side(target: int = target) -> tuple[float, float]:
                _, ids = prompts.new(target)
                return raw_ttft(ids), raw_ttft(prompts.new(target, length=len(ids))[1])

            def ours_side(target: int = target) -> tuple[float, float]:
                text, ids = prompts.new(target)
                again = prompts.new(target, length=len(ids))[0]
                return ours_ttft(text), ours_ttft(again)

            got = alternate({"raw": raw_side, "ours": ours_side}, args.ttft_reps)
            for side, pairs in got.items():
                times["cold"][side] = [cold for cold, _ in pairs]
                times["repeat"][side] = [repeat for _, repeat in pairs]
            out["lengths"][str(target)] = {
                kind: compare(t["ours"], t["raw"]) for kind, t in times.items()
            }
            save_part(args.part_out, out | {"partial": True})
        # After the timing: both sides' greedy tokens on the same new prompts.
        same = []
        for target in args.ttft_lengths:
            text, ids = prompts.new(target)
            raw = [int(r.token) for r in stream_generate(model, tokenizer, ids, max_tokens=16)]
            reply = loop.run_until_complete(engine.generate(text, max_tokens=16, temperature=0))
            same.append(list(reply.tokens) == raw)
        out["same_greedy_tokens"] = same
    finally:
        loop.run_until_complete(engine.stop())
        loop.close()
    return out


def bench_single(path: Path, model: Any, tokenizer: Any, args: Any) -> dict[str, Any]:
    """Single-stream greedy decode, ``SimpleEngine`` against raw ``stream_generate``."""
    from mlx_integrations.engine import SimpleEngine

    prompt = words(32)
    ids = tokenizer.encode(prompt)
    engine = SimpleEngine(path, cache_memory_mb=0)
    loop = asyncio.new_event_loop()
    runs: dict[str, list[dict[str, Any]]] = {"raw": [], "ours": []}

    def raw() -> float:
        runs["raw"].append(r := raw_stream(model, tokenizer, ids, args.tokens))
        return float(r["tps"])

    def ours() -> float:
        runs["ours"].append(
            r := loop.run_until_complete(engine_stream(engine, prompt, args.tokens))
        )
        return float(r["tps"])

    try:
        load = started(engine, loop)
        alternate({"raw": raw, "ours": ours}, max(1, args.warmup))
        tps = alternate({"raw": raw, "ours": ours}, args.rounds)
        ref = runs["raw"][0]["tokens"]
        timed = {side: r[-args.rounds :] for side, r in runs.items()}
        return load | {
            "tokens": len(ref),
            "same_tokens": all(r["tokens"] == ref for side in runs.values() for r in side),
            "decode": compare(tps["ours"], tps["raw"]),
            "ttft": compare(*([r["ttft"] for r in timed[k]] for k in ("ours", "raw"))),
        }
    finally:
        loop.run_until_complete(engine.stop())
        loop.close()


def bench_batched(path: Path, model: Any, tokenizer: Any, args: Any) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for k, c in enumerate(args.concurrency):
        results[str(c)] = r = batched_at(c, k, path, model, tokenizer, args)
        first = r["first"]
        print(
            f"    c={c:3d}  ours / raw {Spread(**r['ratio'])}; first runs: ours "
            f"{first['ours_tps']:.1f} raw {first['raw_tps']:.1f} tok/s; load "
            f"{r['load_s']:.1f} s (warm-up {r['warmup_s'] or 0:.1f} s)",
            flush=True,
        )
        save_part(args.part_out, {"concurrency": results, "partial": True})
    return {"concurrency": results}


def batched_at(c: int, k: int, path: Path, model: Any, tokenizer: Any, args: Any) -> dict[str, Any]:
    """``c`` requests at once: BatchedEngine against batch_generate with batch sizes ``c``."""
    from mlx_lm import batch_generate

    from mlx_integrations.engine import BatchedEngine

    prompts = [words(20 + (i % 9), offset=i) for i in range(c)]
    engine = BatchedEngine(path, max_num_seqs=c, cache_memory_mb=0)
    loop = asyncio.new_event_loop()
    counts: dict[str, list[int]] = {"raw": [], "ours": []}

    def raw() -> float:
        start = time.perf_counter()
        ids = [tokenizer.encode(p) for p in prompts]  # text in, as the engine takes it
        response = batch_generate(
            model,
            tokenizer,
            ids,
            max_tokens=args.tokens,
            completion_batch_size=c,
            prefill_batch_size=c,
            return_token_ids=True,
        )
        n = sum(len(ids) for ids in response.token_ids or [])
        counts["raw"].append(n)
        return n / (time.perf_counter() - start)

    async def serve() -> list[Any]:
        calls = [engine.generate(p, max_tokens=args.tokens, temperature=0.0) for p in prompts]
        return list(await asyncio.gather(*calls))

    def ours() -> float:
        start = time.perf_counter()
        n = sum(o.completion_tokens for o in loop.run_until_complete(serve()))
        counts["ours"].append(n)
        return n / (time.perf_counter() - start)

    try:
        load = started(engine, loop)
        # The first run of each side at this batch size (new shapes), the first side
        # alternating from one c to the next.
        first = alternate(
            {"raw": raw, "ours": ours} if k % 2 == 0 else {"ours": ours, "raw": raw}, 1
        )
        tps = alternate({"raw": raw, "ours": ours}, args.batched_rounds)
        warm = {side: sorted(v)[len(v) // 2] for side, v in tps.items()}
        return (
            compare(tps["ours"], tps["raw"])
            | load
            | {
                "first": {
                    "raw_tps": first["raw"][0],
                    "ours_tps": first["ours"][0],
                    "raw_vs_warm": first["raw"][0] / warm["raw"],
                    "ours_vs_warm": first["ours"][0] / warm["ours"],
                },
                "tokens_per_run": counts["ours"][-1],
            }
        )
    finally:
        loop.run_until_complete(engine.stop())
        loop.close()


def save_part(path: Path | None, result: dict[str, Any]) -> None:
    """Write a part's results whole: a part killed mid-write leaves the last save."""
    if path is None:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, path)


def read_part(path: Path) -> dict[str, Any]:
    """What a part saved, or nothing."""
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


PARTS = {
    "ttft": bench_ttft,
    "single": bench_single,
    "batched": bench_batched,
    "equality": bench_equality,
}


def run_part(args: Any) -> None:
    """One part on one shape, in this process; its JSON to ``--part-out``."""
    from mlx_lm import load

    path = build_model(args.models / args.shape, SHAPES[args.shape])
    began = time.perf_counter()
    model, tokenizer = load(str(path))[:2]
    load_s = time.perf_counter() - began
    result = PARTS[args.run_part](path, model, tokenizer, args)
    save_part(args.part_out, result | {"mlx_lm_load_s": load_s})


def brief(part: str, r: dict[str, Any]) -> str:
    """One line for the log."""
    if "error" in r:
        return f"error: {r['error'][-300:]}"
    if part == "ttft":
        cells = [
            f"{n}: cold {Spread(**row['cold']['ratio'])}, repeat {Spread(**row['repeat']['ratio'])}"
            for n, row in r.get("lengths", {}).items()
        ]
        return f"load {r['load_s']:.2f} s (mlx_lm.load {r['mlx_lm_load_s']:.2f} s); " + "; ".join(
            cells
        )
    if part == "single":
        return f"decode {Spread(**r['decode']['ratio'])}, same tokens {r['same_tokens']}"
    if part == "equality":
        return "; ".join(
            f"{name}: {e['identical']}/{e['prompts']} identical "
            f"({e['diverged_near_ties']} of the rest at near-ties)"
            for name, e in r.get("engines", {}).items()
        )
    return "; ".join(f"c={c}: {Spread(**x['ratio'])}" for c, x in r.get("concurrency", {}).items())


def main() -> None:
    p = parser(__doc__, rounds=9)
    p.add_argument("--shapes", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-1.5b"])
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    p.add_argument("--ttft-lengths", type=int, nargs="+", default=[32, 512, 1700, 4000])
    p.add_argument("--ttft-reps", type=int, default=3, help="ttft rounds a length")
    p.add_argument("--engine-options", default="{}", help="JSON engine options of the ttft part")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--warmup", type=int, default=2, help="untimed single-stream runs a side")
    p.add_argument("--batched-rounds", type=int, default=5)
    p.add_argument("--concurrency", type=int, nargs="+", default=[8, 32, 64])
    p.add_argument("--equality-prompts", type=int, default=40, help="prompts a shape")
    p.add_argument("--equality-longest", type=int, default=3000, help="longest prompt, tokens")
    p.add_argument("--equality-tokens", type=int, default=32, help="greedy tokens a prompt")
    p.add_argument(
        "--equality-engines",
        nargs="+",
        default=["simple", "batched"],
        choices=["simple", "batched"],
    )
    p.add_argument("--models", type=Path, default=Path("/tmp/bench-gpu-models"))
    p.add_argument("--budget-s", type=float, default=86400.0, help="skip parts past this")
    p.add_argument("--quick", action="store_true", help="a tiny shape and small counts")
    p.add_argument("--run-part", choices=list(PARTS), help=argparse.SUPPRESS)
    p.add_argument("--shape", help=argparse.SUPPRESS)
    p.add_argument("--part-out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.shapes, args.tokens, args.rounds, args.batched_rounds = ["tiny"], 24, 2, 1
        args.concurrency, args.warmup = [1, 4], 1
        args.ttft_lengths, args.ttft_reps = [32, 200], 2
        args.equality_prompts, args.equality_longest, args.equality_tokens = 5, 300, 8
    if args.run_part:
        return run_part(args)

    began = time.perf_counter()
    figures: dict[str, Any] = {"tokens": args.tokens, "shapes": {}}
    forwarded = ["--tokens", str(args.tokens), "--rounds", str(args.rounds)]
    forwarded += ["--models", str(args.models), "--warmup", str(args.warmup)]
    forwarded += ["--batched-rounds", str(args.batched_rounds)]
    forwarded += ["--concurrency", *map(str, args.concurrency)]
    forwarded += ["--ttft-lengths", *map(str, args.ttft_lengths)]
    forwarded += ["--ttft-reps", str(args.ttft_reps), "--engine-options", args.engine_options]
    forwarded += ["--equality-prompts", str(args.equality_prompts)]
    forwarded += ["--equality-longest", str(args.equality_longest)]
    forwarded += ["--equality-tokens", str(args.equality_tokens)]
    forwarded += ["--equality-engines", *args.equality_engines]
    for shape in args.shapes:
        r: dict[str, Any] = figures["shapes"].setdefault(shape, {})
        for part in args.parts:
            left = args.budget_s - (time.perf_counter() - began)
            if left < 20:
                r[part] = {"error": "skipped: out of time"}
                continue
            start = time.perf_counter()
            out = Path(f"/tmp/bench-gpu-{os.getpid()}-{shape}-{part}.json")
            cmd = [sys.executable, __file__, "--run-part", part, "--shape", shape]
            cmd += ["--part-out", str(out), *forwarded]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=left)
                r[part] = read_part(out)
                if done.returncode != 0 or not r[part]:
                    r[part]["error"] = f"exit {done.returncode}: {done.stderr[-1500:]}"
            except subprocess.TimeoutExpired:
                r[part] = read_part(out) | {"error": "timed out"}
            out.unlink(missing_ok=True)
            r[f"{part}_s"] = round(time.perf_counter() - start, 1)
            save(args.json, "bench_gpu", figures)
            print(f"  {shape} {part} ({r[f'{part}_s']} s): {brief(part, r[part])}", flush=True)


if __name__ == "__main__":
    main()
