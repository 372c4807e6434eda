"""Speculative decoding in SimpleEngine against plain decoding, measured side by side.

1. Prompt lookup on SmolLM2-135M-Instruct, with a copy-heavy RAG prompt (a passage
   and the instruction to quote it): decode tokens/s with ``prompt_lookup=N`` divided
   by plain decoding, the acceptance rate, and whether the greedy replies are identical;
   then the same for ``BatchedEngine(prompt_lookup=N)``, which drafts for a request
   that runs alone, against plain ``SimpleEngine``.
2. Draft-model overhead on a tiny random model (hidden 256, own output head): the
   model as its own draft (every draft accepted) and a different-seed draft (few
   accepted), each divided by plain decoding; the replies must be identical.

Runs alternate (plain, speculative, plain, ...) in one process and the medians are
compared, so load from other programs hits both sides alike.

Run: python bench/bench_speculative.py [--rounds 5] [--tokens 160] [--lookup 8]
     [--skip-smollm]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx_integrations  # noqa: F401  (preloads OpenBLAS before mlx)
from mlx_integrations.engine import BatchedEngine, SimpleEngine
from mlx_integrations.engine.mlx_engine import MLXEngine

PASSAGE = (
    "The Great Barrier Reef is the world's largest coral reef system, composed of over "
    "2,900 individual reefs and 900 islands stretching for over 2,300 kilometres over an "
    "area of approximately 344,400 square kilometres. The reef is located in the Coral "
    "Sea, off the coast of Queensland, Australia. It can be seen from outer space and is "
    "the world's biggest single structure made by living organisms. This reef structure "
    "is composed of and built by billions of tiny organisms, known as coral polyps. It "
    "supports a wide diversity of life and was selected as a World Heritage Site in 1981."
)
RAG_MESSAGES = [
    {"role": "system", "content": "You answer from the given passage only."},
    {
        "role": "user",
        "content": f"Passage:\n{PASSAGE}\n\nQuote the passage above word for word, then stop.",
    },
]
TINY_MESSAGES = [{"role": "user", "content": "Write about the weather in Paris and Rome."}]


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


def compare(
    label: str, plain: MLXEngine, fast: MLXEngine, messages: list, rounds: int, tokens: int
) -> float:
    asyncio.run(timed(plain, messages, 8))  # warm up both
    asyncio.run(timed(fast, messages, 8))
    base, spec = [], []
    same = True
    drafted = accepted = completion = 0
    for _ in range(rounds):
        tps, ref = asyncio.run(timed(plain, messages, tokens))
        base.append(tps)
        tps, out = asyncio.run(timed(fast, messages, tokens))
        spec.append(tps)
        same &= out.tokens == ref.tokens
        drafted += out.mtp_drafts
        accepted += out.mtp_accepted
        completion = out.completion_tokens
    ratio = statistics.median(spec) / statistics.median(base)
    rate = accepted / drafted if drafted else 0.0
    print(
        f"{label}: tok/s plain {statistics.median(base):7.1f}  speculative "
        f"{statistics.median(spec):7.1f}  ratio {ratio:.2f}  acceptance {rate:.2f} "
        f"({accepted}/{drafted})  {completion} tokens  identical greedy: {same}"
    )
    return ratio


def bench_prompt_lookup(path: Path, rounds: int, tokens: int, lookup: int) -> None:
    plain = SimpleEngine(path, cache_memory_mb=0)
    fast = SimpleEngine(path, cache_memory_mb=0, prompt_lookup=lookup)
    # BatchedEngine drafts for a request that runs alone.
    batched = BatchedEngine(path, cache_memory_mb=0, prompt_lookup=lookup)
    try:
        compare(
            f"SmolLM2-135M, RAG quote, prompt_lookup={lookup}",
            plain,
            fast,
            RAG_MESSAGES,
            rounds,
            tokens,
        )
        reply = asyncio.run(fast.chat(RAG_MESSAGES, max_tokens=tokens, temperature=0))
        print(f"  reply begins: {reply.text[:100]!r}")
        compare(
            f"SmolLM2-135M, RAG quote, BatchedEngine prompt_lookup={lookup} / plain Simple",
            plain,
            batched,
            RAG_MESSAGES,
            rounds,
            tokens,
        )
    finally:
        for engine in (plain, fast, batched):
            asyncio.run(engine.stop())


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
                compare(
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--lookup", type=int, default=8, help="prompt_lookup for SmolLM2")
    parser.add_argument("--num-draft", type=int, default=3, help="num_draft_tokens (tiny)")
    parser.add_argument("--skip-smollm", action="store_true")
    args = parser.parse_args()
    if not args.skip_smollm:
        from tests.support.smollm import ensure_smollm2

        bench_prompt_lookup(ensure_smollm2(), args.rounds, args.tokens, args.lookup)
    bench_draft_model(args.rounds, args.tokens, args.num_draft)


if __name__ == "__main__":
    main()
