"""SimpleEngine against raw mlx-lm, measured side by side in one run.

1. Decode tokens/s of ``SimpleEngine.stream_generate`` divided by raw
   ``mlx_lm.stream_generate`` on the same model and prompt (target >= 0.95), for a tiny
   model (hidden 256) and for SmolLM2-135M.
2. Time to first token of the second turn of a ~1,500-token conversation with KV reuse,
   divided by the same turn without reuse (target <= 0.3).
3. ``--batched``: total tokens/s of ``BatchedEngine(max_num_seqs=c)`` serving ``c``
   requests at once (``generate``) divided by raw ``mlx_lm.batch_generate`` with the
   same batch sizes, c = 8 and 64, on a very small model (hidden 64, 2 layers, 512-token
   vocabulary), where a step costs little and the host work per request shows. Both
   sides start from the prompts' text (raw's run tokenizes them) and end with text.

Runs alternate (raw, ours, raw, ours, ...) and the medians are compared, so load from
other processes hits both sides alike.

Run: python bench/bench_engine.py [--rounds 5] [--tokens 128] [--skip-smollm] [--batched]
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
from mlx_integrations.engine import SimpleEngine


def decode_tps_raw(model, tokenizer, prompt: str, tokens: int) -> float:
    from mlx_lm import stream_generate

    # Timed the same way as the engine: from the first token to the last.
    first = None
    count = 0
    for response in stream_generate(model, tokenizer, prompt, max_tokens=tokens):
        count = response.generation_tokens
        if first is None:
            first = time.perf_counter()
    assert first is not None
    return (count - 1) / (time.perf_counter() - first)


async def decode_tps_engine(engine: SimpleEngine, prompt: str, tokens: int) -> float:
    first = None
    count = 0
    async for out in engine.stream_generate(prompt, max_tokens=tokens, temperature=0.0, top_p=1.0):
        count = out.completion_tokens
        if first is None:
            first = time.perf_counter()
    elapsed = time.perf_counter() - first
    return (count - 1) / elapsed


def bench_decode(path: Path, label: str, rounds: int, tokens: int) -> float:
    from mlx_lm import load

    model, tokenizer = load(str(path))
    engine = SimpleEngine(path, cache_memory_mb=0)
    # A continuation that does not end early, so both sides decode the same count.
    prompt = "Count from one to one thousand: one, two, three, four, five, six,"
    asyncio.run(engine.start())
    decode_tps_raw(model, tokenizer, prompt, 8)  # warm up both
    asyncio.run(decode_tps_engine(engine, prompt, 8))
    raw, ours = [], []
    for _ in range(rounds):
        raw.append(decode_tps_raw(model, tokenizer, prompt, tokens))
        ours.append(asyncio.run(decode_tps_engine(engine, prompt, tokens)))
    ratio = statistics.median(ours) / statistics.median(raw)
    print(
        f"{label}: decode tokens/s  raw mlx-lm {statistics.median(raw):8.1f}   "
        f"SimpleEngine {statistics.median(ours):8.1f}   ratio {ratio:.3f} (target >= 0.95)"
    )
    asyncio.run(engine.stop())
    return ratio


async def _second_turn_ttft(engine: SimpleEngine, history: list[dict], question: dict) -> float:
    await engine.chat(history, max_tokens=1)  # turn one fills the cache
    start = time.perf_counter()
    async for _ in engine.stream_chat(
        [*history, {"role": "assistant", "content": "Noted."}, question],
        max_tokens=1,
        temperature=0,
    ):
        return time.perf_counter() - start
    return float("nan")


def bench_kv_reuse(path: Path, label: str, rounds: int, target_tokens: int = 1500) -> float:
    reuse = SimpleEngine(path)
    fresh = SimpleEngine(path, cache_memory_mb=0)
    facts: list[str] = []

    def conversation() -> list[dict]:
        notes = " ".join(facts)
        return [
            {"role": "system", "content": "You are a helpful archivist."},
            {"role": "user", "content": f"Here are my notes:\n{notes}\nSummarize them."},
        ]

    # Grow the notes until the conversation is about target_tokens long for this tokenizer.
    while len(reuse.tokenizer.encode(reuse.render_prompt(conversation()))) < target_tokens:
        facts.append(f"Fact {len(facts)}: the lamp of tower {len(facts)} burns whale oil.")
    history = conversation()
    question = {"role": "user", "content": "Which lamp burns whale oil?"}
    tokens = len(reuse.tokenizer.encode(reuse.render_prompt(history)))
    with_reuse, without = [], []
    for _ in range(rounds):
        reuse.clear_runtime_caches()
        with_reuse.append(asyncio.run(_second_turn_ttft(reuse, history, question)))
        without.append(asyncio.run(_second_turn_ttft(fresh, history, question)))
    ratio = statistics.median(with_reuse) / statistics.median(without)
    print(
        f"{label}: second-turn TTFT of a {tokens}-token conversation  with KV reuse "
        f"{statistics.median(with_reuse) * 1000:7.1f} ms   without "
        f"{statistics.median(without) * 1000:7.1f} ms   ratio {ratio:.3f} (target <= 0.3)"
    )
    asyncio.run(reuse.stop())
    asyncio.run(fresh.stop())
    return ratio


def bench_batched_raw(path: Path, levels: list[int], rounds: int, tokens: int) -> None:
    from mlx_lm import load

    model, tokenizer = load(str(path))
    for c in levels:
        r_tps, o_tps, ratios = batched_vs_raw(path, model, tokenizer, c, rounds, tokens)
        print(
            f"c={c:3d}: total tokens/s  batch_generate {statistics.median(r_tps):8.0f}   "
            f"BatchedEngine {statistics.median(o_tps):8.0f}   ratio median "
            f"{statistics.median(ratios):.3f} ({min(ratios):.3f} to {max(ratios):.3f})"
        )


def batched_vs_raw(path: Path, model, tokenizer, c: int, rounds: int, tokens: int):
    """Total tokens/s of both sides over ``rounds`` alternating rounds, and their ratios."""
    from mlx_lm import batch_generate

    from mlx_integrations.engine import BatchedEngine

    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly box".split()
    prompts = [" ".join(words[(i + j) % len(words)] for j in range(20 + i % 9)) for i in range(c)]
    engine = BatchedEngine(path, max_num_seqs=c, cache_memory_mb=0)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(engine.start())

    def raw() -> float:
        # Text in, text out on both sides: the engine tokenizes each request.
        start = time.perf_counter()
        ids = [tokenizer.encode(p) for p in prompts]
        out = batch_generate(
            model,
            tokenizer,
            ids,
            max_tokens=tokens,
            completion_batch_size=c,
            prefill_batch_size=c,
            return_token_ids=True,
        )
        return sum(map(len, out.token_ids)) / (time.perf_counter() - start)

    async def serve() -> list:
        calls = [engine.generate(p, max_tokens=tokens, temperature=0.0) for p in prompts]
        return list(await asyncio.gather(*calls))

    def ours() -> float:
        start = time.perf_counter()
        outs = loop.run_until_complete(serve())
        return sum(o.completion_tokens for o in outs) / (time.perf_counter() - start)

    raw(), ours()  # warm-up at this batch size
    r_tps, o_tps, ratios = [], [], []
    for i in range(rounds):
        pair = (raw, ours) if i % 2 == 0 else (ours, raw)
        got = {f.__name__: f() for f in pair}
        r_tps.append(got["raw"])
        o_tps.append(got["ours"])
        ratios.append(got["ours"] / got["raw"])
    loop.run_until_complete(engine.stop())
    loop.close()
    return r_tps, o_tps, ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--skip-smollm", action="store_true")
    parser.add_argument("--batched", action="store_true", help="only part 3")
    args = parser.parse_args()
    from tests.support.tiny_models import build_tiny_model

    if args.batched:
        with tempfile.TemporaryDirectory() as tmp:
            small = build_tiny_model(Path(tmp) / "tiny64", tie_word_embeddings=False)
            bench_batched_raw(small, [8, 64], args.rounds, args.tokens)
        return

    with tempfile.TemporaryDirectory() as tmp:
        tiny = build_tiny_model(
            Path(tmp) / "tiny256",
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
        )
        bench_decode(tiny, "tiny (hidden 256)", args.rounds, args.tokens)
        bench_kv_reuse(tiny, "tiny (hidden 256)", args.rounds)
    if not args.skip_smollm:
        from tests.support.smollm import ensure_smollm2

        smol = ensure_smollm2()
        bench_decode(smol, "SmolLM2-135M", max(2, args.rounds // 2), min(args.tokens, 64))
        bench_kv_reuse(smol, "SmolLM2-135M", max(2, args.rounds // 2))


if __name__ == "__main__":
    main()
