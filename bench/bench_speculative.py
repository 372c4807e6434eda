"""Speculative decoding in SimpleEngine against plain decoding, measured side by side.

1. Prompt lookup on SmolLM2-135M-Instruct, with a copy-heavy RAG prompt (a passage
   and the instruction to quote it): decode tokens/s with ``prompt_lookup=N`` divided
   by plain decoding, the acceptance rate, and whether the greedy replies are identical;
   then the same on a story, whose reply quotes nothing (the cost of prompt lookup
   where it cannot pay: rounds only where a match is expected to pay, plain steps
   pipelined elsewhere); then both for ``BatchedEngine(prompt_lookup=N)``, which drafts
   for a request that runs alone, against plain ``SimpleEngine``; then ``--concurrency`` RAG
   requests sharing one ``BatchedEngine`` batch, prompt lookup on and off: tokens/s
   of the whole batch (completion tokens over the wall time of the gathered
   requests, prefill included), and whether every greedy reply is identical.
2. The same shared-batch comparison on a tiny random model (hidden 256, own head)
   with prompts its replies copy from.
   Then the tiny model's batch with a draft model: the model itself as its draft
   (every draft kept) and a copy with noise on its output head (some kept).
3. Draft-model overhead on a tiny random model (hidden 256, own output head): the
   model as its own draft (every draft accepted) and a different-seed draft (few
   accepted), each divided by plain decoding; the replies must be identical.

Sides alternate round by round in one process (bench/harness.py); each ratio is the
median of the per-round ratios, with their range.

Run: python bench/bench_speculative.py [--rounds 5] [--tokens 160] [--lookup 8]
     [--concurrency 4] [--skip-smollm] [--only-batch | --only-alone] [--json FILE]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import alternate, compare, parser, ratio, save

import mlx_integrations  # noqa: F401  (preloads OpenBLAS before mlx)
from mlx_integrations.engine import BatchedEngine, SimpleEngine
from mlx_integrations.engine.mlx_engine import MLXEngine
from tests.support.prompts import PASSAGE, RAG_MESSAGES

STORY_MESSAGES = [
    {"role": "user", "content": "Write a short story about a dragon who learns to bake bread."}
]
TINY_MESSAGES = [{"role": "user", "content": "Write about the weather in Paris and Rome."}]
# Requests of one batch: the same passage, each asked to quote it in its own words.
RAG_ASKS = [
    "Quote the passage above word for word, then stop.",
    "Copy the passage above exactly, sentence by sentence.",
    "Repeat the passage above verbatim.",
    "Write the passage above out again, unchanged.",
    "Quote the first half of the passage above exactly.",
    "Quote the passage above word for word, with no comment.",
    "Reproduce the passage above as it is.",
    "Give the passage above back word for word.",
]
# Each measurement's figures, by its label, for --json.
FIGURES: dict[str, Any] = {}
TINY_COPY = [
    "The quick brown fox jumps over the lazy dog. Repeat it: The quick",
    "The capital of France is Paris. The capital of Italy is Rome. The",
    "What is the weather in Paris? It is sunny in Paris.",
    "Hello! How can I help you today? I am a helpful assistant. Hello!",
]


async def timed(engine: MLXEngine, messages: list[dict], tokens: int) -> tuple[float, object]:
    """Decode tokens/s (first token to last, as bench_engine.py times it) and the reply."""
    first = None
    last = None
    async for out in engine.stream_chat(messages, max_tokens=tokens, temperature=0):
        if first is None:
            first = time.perf_counter()
        last = out
    assert first is not None and last is not None
    elapsed = time.perf_counter() - first
    return (last.completion_tokens - 1) / elapsed, last


def speculation_vs_plain(
    label: str, plain: MLXEngine, fast: MLXEngine, messages: list, rounds: int, tokens: int
) -> None:
    asyncio.run(timed(plain, messages, 8))  # warm up both
    asyncio.run(timed(fast, messages, 8))
    replies: dict[str, list[Any]] = {"plain": [], "fast": []}

    def side(name: str, engine: MLXEngine) -> float:
        tps, out = asyncio.run(timed(engine, messages, tokens))
        replies[name].append(out)
        return tps

    tps = alternate(
        {"plain": lambda: side("plain", plain), "fast": lambda: side("fast", fast)}, rounds
    )
    ref = replies["plain"][0].tokens
    same = all(o.tokens == ref for o in replies["plain"] + replies["fast"])
    drafted = sum(o.mtp_drafts for o in replies["fast"])
    accepted = sum(o.mtp_accepted for o in replies["fast"])
    rate = accepted / drafted if drafted else 0.0
    print(
        f"{label}: tok/s plain {statistics.median(tps['plain']):7.1f}  speculative "
        f"{statistics.median(tps['fast']):7.1f}  ratio {ratio(tps['fast'], tps['plain'])}  "
        f"acceptance {rate:.2f} ({accepted}/{drafted})  "
        f"{replies['fast'][-1].completion_tokens} tokens  identical greedy: {same}"
    )
    FIGURES[label] = compare(tps["fast"], tps["plain"]) | {
        "drafted": drafted,
        "accepted": accepted,
        "identical_greedy": same,
    }


def bench_prompt_lookup(path: Path, rounds: int, tokens: int, lookup: int) -> None:
    plain = SimpleEngine(path, cache_memory_mb=0)
    fast = SimpleEngine(path, cache_memory_mb=0, prompt_lookup=lookup)
    # BatchedEngine drafts for a request that runs alone.
    batched = BatchedEngine(path, cache_memory_mb=0, prompt_lookup=lookup)
    try:
        for what, messages in (("RAG quote", RAG_MESSAGES), ("story", STORY_MESSAGES)):
            speculation_vs_plain(
                f"SmolLM2-135M, {what}, prompt_lookup={lookup}",
                plain,
                fast,
                messages,
                rounds,
                tokens,
            )
            reply = asyncio.run(fast.chat(messages, max_tokens=tokens, temperature=0))
            print(f"  reply begins: {reply.text[:100]!r}")
        for what, messages in (("RAG quote", RAG_MESSAGES), ("story", STORY_MESSAGES)):
            speculation_vs_plain(
                f"SmolLM2-135M, {what}, BatchedEngine prompt_lookup={lookup} / plain Simple",
                plain,
                batched,
                messages,
                rounds,
                tokens,
            )
    finally:
        for engine in (plain, fast, batched):
            asyncio.run(engine.stop())


def rag_batch(concurrency: int) -> list[list[dict]]:
    return [
        [RAG_MESSAGES[0], {"role": "user", "content": f"Passage:\n{PASSAGE}\n\n{ask}"}]
        for ask in (RAG_ASKS * concurrency)[:concurrency]
    ]


def tiny_batch(concurrency: int) -> list[list[dict]]:
    return [[{"role": "user", "content": t}] for t in (TINY_COPY * concurrency)[:concurrency]]


async def batch_run(engine: MLXEngine, batch: list[list[dict]], tokens: int):
    """Tokens/s of the batch (all completion tokens over the gather's wall time), replies."""
    start = time.perf_counter()
    outs = await asyncio.gather(*[engine.chat(m, max_tokens=tokens, temperature=0) for m in batch])
    elapsed = time.perf_counter() - start
    return sum(o.completion_tokens for o in outs) / elapsed, outs


def bench_shared_batch(
    label: str, path: Path, batch: list[list[dict]], rounds: int, tokens: int, options: dict
) -> None:
    """``len(batch)`` requests in one BatchedEngine batch, speculation off and on
    (``options``: ``prompt_lookup`` or ``draft_model`` and ``num_draft_tokens``)."""
    plain = BatchedEngine(path, cache_memory_mb=0, max_num_seqs=len(batch))
    fast = BatchedEngine(path, cache_memory_mb=0, max_num_seqs=len(batch), **options)
    source = ", ".join(f"{k}={Path(str(v)).name}" for k, v in options.items())
    replies: dict[str, list[Any]] = {"plain": [], "fast": []}

    def side(name: str, engine: MLXEngine) -> float:
        tps, outs = asyncio.run(batch_run(engine, batch, tokens))
        replies[name].append(outs)
        return tps

    try:
        for engine in (plain, fast):  # warm up
            asyncio.run(batch_run(engine, batch, 8))
        before = {id(e): e.get_stats() for e in (plain, fast)}
        tps = alternate(
            {"plain": lambda: side("plain", plain), "fast": lambda: side("fast", fast)}, rounds
        )
        after = {id(e): e.get_stats() for e in (plain, fast)}
    finally:
        for engine in (plain, fast):
            asyncio.run(engine.stop())
    ref = [o.tokens for o in replies["plain"][0]]
    same = all([o.tokens for o in outs] == ref for outs in replies["plain"] + replies["fast"])
    drafted = sum(o.mtp_drafts for outs in replies["fast"] for o in outs)
    accepted = sum(o.mtp_accepted for outs in replies["fast"] for o in outs)
    rate = accepted / drafted if drafted else 0.0

    def per_round(engine: MLXEngine, key: str) -> float:
        return (after[id(engine)][key] - before[id(engine)][key]) / rounds

    print(
        f"{label}: batch tok/s plain {statistics.median(tps['plain']):7.1f}  {source} "
        f"{statistics.median(tps['fast']):7.1f}  ratio {ratio(tps['fast'], tps['plain'])}  "
        f"acceptance {rate:.2f} ({accepted}/{drafted})  "
        f"{sum(o.completion_tokens for o in replies['fast'][-1])} tokens/round  "
        f"identical greedy: {same}\n"
        f"  decode steps per round: plain {per_round(plain, 'steps_executed'):.0f}, "
        f"drafting {per_round(fast, 'steps_executed'):.0f}; tokens of a request left alone "
        f"per round: plain {per_round(plain, 'solo_tokens'):.0f}, "
        f"drafting {per_round(fast, 'solo_tokens'):.0f}"
    )
    FIGURES[f"{label}, {source}"] = compare(tps["fast"], tps["plain"]) | {
        "drafted": drafted,
        "accepted": accepted,
        "identical_greedy": same,
    }


def bench_draft_model(rounds: int, tokens: int, num_draft: int) -> None:
    from tests.support.tiny_models import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        kwargs = {"hidden_size": 256, "num_hidden_layers": 4, "tie_word_embeddings": False}
        target = build_tiny_model(Path(tmp) / "target", **kwargs)
        other = build_tiny_model(Path(tmp) / "other", seed=5, **kwargs)
        plain = SimpleEngine(target, cache_memory_mb=0)
        for label, draft in (("identical draft", target), ("different-seed draft", other)):
            fast = SimpleEngine(
                target, cache_memory_mb=0, draft_model=str(draft), num_draft_tokens=num_draft
            )
            try:
                speculation_vs_plain(
                    f"tiny (hidden 256), {label}, num_draft_tokens={num_draft}",
                    plain,
                    fast,
                    TINY_MESSAGES,
                    rounds,
                    tokens,
                )
            finally:
                asyncio.run(fast.stop())
        asyncio.run(plain.stop())


def main() -> None:
    p = parser(__doc__, rounds=5)
    p.add_argument("--tokens", type=int, default=160)
    p.add_argument("--lookup", type=int, default=8, help="prompt_lookup for SmolLM2")
    p.add_argument("--num-draft", type=int, default=3, help="num_draft_tokens (tiny)")
    p.add_argument("--concurrency", type=int, default=4, help="requests in one batch")
    p.add_argument("--only-batch", action="store_true", help="the shared-batch parts only")
    p.add_argument("--only-alone", action="store_true", help="SmolLM2 alone, no batch")
    p.add_argument("--skip-smollm", action="store_true")
    args = p.parse_args()
    try:
        run(args)
    finally:
        save(args.json, "bench_speculative", FIGURES)


def run(args: Any) -> None:
    c = args.concurrency
    if not args.skip_smollm:
        from tests.support.smollm import ensure_smollm2

        smollm = ensure_smollm2()
        if not args.only_batch:
            bench_prompt_lookup(smollm, args.rounds, args.tokens, args.lookup)
        if args.only_alone:
            return
        label = f"SmolLM2-135M, {c} RAG quotes in one BatchedEngine batch"
        lookup = {"prompt_lookup": args.lookup}
        bench_shared_batch(label, smollm, rag_batch(c), args.rounds, args.tokens, lookup)
    from tests.support.tiny_models import build_tiny_model, noisy_copy

    with tempfile.TemporaryDirectory() as tmp:
        kwargs = {"hidden_size": 256, "num_hidden_layers": 4, "tie_word_embeddings": False}
        tiny = build_tiny_model(Path(tmp) / "tiny", **kwargs)
        label = f"tiny (hidden 256), {c} copying prompts in one BatchedEngine batch"
        batch = tiny_batch(c)
        bench_shared_batch(label, tiny, batch, args.rounds, args.tokens, {"prompt_lookup": 4})
        # A draft model in the batch: the model itself (every draft kept: the upper
        # bound) and a copy with noise on its output head (some kept).
        noisy = noisy_copy(tiny, Path(tmp) / "noisy")
        for draft in (tiny, noisy):
            options = {"draft_model": str(draft), "num_draft_tokens": args.num_draft}
            bench_shared_batch(label, tiny, batch, args.rounds, args.tokens, options)
    if not args.only_batch:
        bench_draft_model(args.rounds, args.tokens, args.num_draft)


if __name__ == "__main__":
    main()
