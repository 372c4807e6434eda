"""A quantized KV cache (``kv_bits``) in SimpleEngine against the unquantized one.

On SmolLM2-135M-Instruct (context 8,192) with a ~4,096-token context (a prompt of
numbered facts and 64 generated tokens), for kv_bits 8 and 4 against None:

- KV cache bytes held by the prefix cache entry of that context, divided by the
  unquantized entry's (target <= 0.35 at 4 bits);
- prefill tokens/s (prompt tokens over the time to the first token) and decode tokens/s
  (first token to last), each divided by the unquantized engine's;
- greedy agreement over the first 64 tokens: tokens before the first difference, and
  positions that agree.

Runs alternate (None, 8, 4, None, ...) in one process and the medians are compared,
so load from other programs hits every side alike. The prefix cache is cleared after
each run, so every run prefills the whole prompt.

``--batched`` measures ``BatchedEngine`` at concurrency 4 instead, kv_bits 4 against
None, side by side (alternating) in one run: four chats of numbered facts of different
lengths (about ``--context`` tokens each, so the batch is left-padded) sent at once, EOS
banned so each generates ``--tokens``; reported are the KV bytes of the four contexts
(the prefix cache's entries after the batch, quantized ones at their real size) and
the decode tokens/s of the batch (tokens generated after the last request's first
token, over the time from then to the end), each as a ratio to the unquantized side
(the median of the per-round ratios). A first untimed run per side prefills the
contexts; later runs take them from the prefix cache, so a round is mostly decoding.

Sides alternate round by round (bench/harness.py); ``--json FILE`` writes the figures.

Run: python bench/bench_kv_cache.py [--rounds 3] [--context 4096] [--tokens 64]
(on a 2-core CPU a round takes about six minutes; the README figures are of one round)
or: python bench/bench_kv_cache.py --batched [--rounds 3] [--context 1024] [--tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import alternate, compare, parser, ratio, save

import mlx_integrations  # noqa: F401  (preloads OpenBLAS before mlx)
from mlx_integrations.engine import BatchedEngine, SimpleEngine

BITS = (None, 8, 4)
QUESTION = "List every item above in order, with its city and weight, one per line."


def fact(rng: random.Random, i: int) -> str:
    colour = rng.choice(["red", "blue", "green", "yellow", "black", "white", "grey"])
    animal = rng.choice(["fox", "owl", "horse", "otter", "crane", "badger", "lynx", "heron"])
    city = rng.choice(["Paris", "Rome", "Oslo", "Lima", "Cairo", "Osaka", "Quito", "Perth"])
    return (
        f"Item {i}: the {colour} {animal} seen in {city} weighs {rng.randint(2, 90)} "
        f"kilograms and was counted on day {rng.randint(1, 365)}."
    )


def messages_for(
    engine: SimpleEngine | BatchedEngine, prompt_tokens: int, seed: int = 0
) -> tuple[list[dict], int]:
    """A chat of numbered facts and a question, about ``prompt_tokens`` tokens long."""
    rng = random.Random(seed)
    lines: list[str] = []

    def build() -> list[dict]:
        return [{"role": "user", "content": "\n".join(lines) + "\n\n" + QUESTION}]

    count = 0
    while count < prompt_tokens:
        lines.extend(fact(rng, len(lines) + 1) for _ in range(8))
        count = len(engine.tokenizer.encode(engine.render_prompt(build())))
    while count > prompt_tokens and len(lines) > 1:
        lines.pop()
        count = len(engine.tokenizer.encode(engine.render_prompt(build())))
    return build(), count


@dataclass
class Side:
    bits: int | None
    engine: SimpleEngine
    prefill: list[float] = field(default_factory=list)
    decode: list[float] = field(default_factory=list)
    nbytes: float = 0.0
    tokens: list[int] = field(default_factory=list)


async def timed_run(side: Side, messages: list[dict], tokens: int) -> None:
    start = time.perf_counter()
    first = None
    last = None
    async for out in side.engine.stream_chat(messages, max_tokens=tokens, temperature=0):
        if first is None:
            first = time.perf_counter()
        last = out
    assert first is not None and last is not None
    end = time.perf_counter()
    side.prefill.append(last.prompt_tokens / (first - start))
    if last.completion_tokens > 1:
        side.decode.append((last.completion_tokens - 1) / (end - first))
    side.nbytes = side.engine.get_cache_stats()["current_memory_mb"]
    side.tokens = list(last.tokens)
    side.engine.clear_runtime_caches()
    print(
        f"  kv_bits={side.bits}: prefill {side.prefill[-1]:.1f} tok/s, "
        f"{last.completion_tokens} tokens, {side.nbytes:.1f} MB",
        file=sys.stderr,
        flush=True,
    )


def run_one(side: Side, messages: list[dict], tokens: int) -> None:
    asyncio.run(timed_run(side, messages, tokens))


def agreement(a: list[int], b: list[int]) -> tuple[int, int, int]:
    """(tokens before the first difference, positions that agree, positions compared)."""
    n = min(len(a), len(b))
    prefix = next((i for i in range(n) if a[i] != b[i]), n)
    return prefix, sum(x == y for x, y in zip(a[:n], b[:n], strict=True)), n


@dataclass
class BatchSide:
    bits: int | None
    engine: BatchedEngine
    decode: list[float] = field(default_factory=list)
    nbytes: float = 0.0
    tokens: list[list[int]] = field(default_factory=list)


async def batched_run(side: BatchSide, chats: list[list[dict]], tokens: int) -> None:
    """The chats at once; decode tok/s from the last first token to the end."""
    eos = next(iter(side.engine.tokenizer.eos_token_ids))
    firsts: list[float] = []
    # (time, tokens so far) of every chunk of every request.
    marks: list[list[tuple[float, int]]] = [[] for _ in chats]

    async def one(i: int, messages: list[dict]) -> list[int]:
        last = None
        stream = side.engine.stream_chat(
            messages, max_tokens=tokens, temperature=0, logit_bias={eos: -1e9}
        )
        async for out in stream:
            if last is None:
                firsts.append(time.perf_counter())
            marks[i].append((time.perf_counter(), out.completion_tokens))
            last = out
        assert last is not None and last.completion_tokens == tokens
        return list(last.tokens)

    side.tokens = list(await asyncio.gather(*[one(i, m) for i, m in enumerate(chats)]))
    end = time.perf_counter()
    start = max(firsts)
    before = [max((n for t, n in m if t <= start), default=0) for m in marks]
    side.decode.append((len(chats) * tokens - sum(before)) / (end - start))
    side.nbytes = side.engine.get_cache_stats()["current_memory_mb"]
    assert side.engine.get_stats()["batch_size"] == len(chats)
    print(
        f"  BatchedEngine kv_bits={side.bits}: decode {side.decode[-1]:.1f} tok/s, "
        f"{side.nbytes:.1f} MB",
        file=sys.stderr,
        flush=True,
    )


def run_batch(side: BatchSide, chats: list[list[dict]], tokens: int) -> None:
    asyncio.run(batched_run(side, chats, tokens))


def main_batched(path: Path, args: argparse.Namespace) -> None:
    sides = [
        BatchSide(bits, BatchedEngine(path, kv_bits=bits, max_num_seqs=4, cache_memory_mb=4096))
        for bits in (None, 4)
    ]
    try:
        asyncio.run(sides[0].engine.start())
        # Contexts of different lengths (about 7/8 to 8/8 of --context): left padding.
        made = [
            messages_for(sides[0].engine, args.context * (7 + i / 3) // 8 - args.tokens, i)
            for i in range(4)
        ]
        chats = [m for m, _ in made]
        for side in sides:  # prefills the contexts into the prefix cache
            asyncio.run(batched_run(side, chats, args.tokens))
            side.decode.clear()
        alternate(
            {
                str(side.bits): functools.partial(run_batch, side, chats, args.tokens)
                for side in sides
            },
            args.rounds,
        )
        base, quantized = sides
        decode = [statistics.median(s.decode) for s in sides]
        agree = [agreement(a, b)[0] for a, b in zip(base.tokens, quantized.tokens, strict=True)]
        print(
            f"SmolLM2-135M, BatchedEngine at concurrency 4, prompts of "
            f"{', '.join(str(n) for _, n in made)} tokens + {args.tokens} generated, "
            f"{args.rounds} rounds (medians)"
        )
        print(
            f"KV of the four contexts: kv_bits=4 {quantized.nbytes:.1f} MB / unquantized "
            f"{base.nbytes:.1f} MB = {quantized.nbytes / base.nbytes:.2f}x"
        )
        print(
            f"decode tok/s: kv_bits=4 {decode[1]:.1f} / unquantized {decode[0]:.1f}; "
            f"per-round ratio {ratio(quantized.decode, base.decode)}"
        )
        print(f"greedy agreement with unquantized, tokens before the first difference: {agree}")
        save(
            args.json,
            "bench_kv_cache",
            {
                "batched": True,
                "prompt_tokens": [n for _, n in made],
                "kv_bytes_ratio": quantized.nbytes / base.nbytes,
                "decode": compare(quantized.decode, base.decode),
                "agreement": agree,
            },
        )
    finally:
        for side in sides:
            asyncio.run(side.engine.stop())


def main() -> None:
    p = parser(__doc__, rounds=3)
    p.add_argument("--context", type=int, help="prompt + generated tokens (4096; 1024)")
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per run")
    p.add_argument(
        "--batched", action="store_true", help="BatchedEngine at concurrency 4, kv_bits=4"
    )
    args = p.parse_args()

    from tests.support.smollm import ensure_smollm2

    path = ensure_smollm2()
    if args.batched:
        args.context = args.context or 1024
        main_batched(path, args)
        return
    args.context = args.context or 4096
    sides = [Side(bits, SimpleEngine(path, kv_bits=bits, cache_memory_mb=4096)) for bits in BITS]
    try:
        asyncio.run(sides[0].engine.start())
        messages, prompt_tokens = messages_for(sides[0].engine, args.context - args.tokens)
        warm = [{"role": "user", "content": "Hello!"}]
        for side in sides:
            asyncio.run(side.engine.chat(warm, max_tokens=4, temperature=0))
            side.engine.clear_runtime_caches()
        alternate(
            {
                str(side.bits): functools.partial(run_one, side, messages, args.tokens)
                for side in sides
            },
            args.rounds,
        )
        base = sides[0]
        figures: dict[str, Any] = {"prompt_tokens": prompt_tokens, "tokens": args.tokens}
        print(
            f"SmolLM2-135M, {prompt_tokens} prompt + {args.tokens} generated tokens, "
            f"{args.rounds} rounds (medians)"
        )
        for side in sides:
            prefill, decode = statistics.median(side.prefill), statistics.median(side.decode)
            prefix, same, n = agreement(base.tokens, side.tokens)
            memory = side.nbytes / base.nbytes
            prefill_ratio = prefill / statistics.median(base.prefill)
            decode_ratio = decode / statistics.median(base.decode)
            print(
                f"kv_bits={side.bits!s:4}  KV {side.nbytes:6.1f} MB ({memory:.2f}x)"
                f"  prefill {prefill:7.1f} tok/s ({prefill_ratio:.2f}x)"
                f"  decode {decode:6.1f} tok/s ({decode_ratio:.2f}x)"
                f"  greedy agreement: first {prefix}/{n} tokens, {same}/{n} positions"
            )
            figures[f"kv_bits={side.bits}"] = {
                "kv_mb": side.nbytes,
                "kv_ratio": memory,
                "prefill": compare(side.prefill, base.prefill),
                "decode": compare(side.decode, base.decode),
                "first_tokens_agreeing": prefix,
            }
        save(args.json, "bench_kv_cache", figures)
    finally:
        for side in sides:
            asyncio.run(side.engine.stop())


if __name__ == "__main__":
    main()
