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

Sides alternate round by round (bench/harness.py); each ratio is the median of the
per-round ratios, with their range.

Run: python bench/bench_engine.py [--rounds 5] [--tokens 128] [--skip-smollm] [--batched]
     [--json FILE]
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
    assert first is not None
    elapsed = time.perf_counter() - first
    return (count - 1) / elapsed


def bench_decode(path: Path, label: str, rounds: int, tokens: int) -> dict[str, Any]:
    from mlx_lm import load

    model, tokenizer = load(str(path))[:2]
    engine = SimpleEngine(path, cache_memory_mb=0)
    # A continuation that does not end early, so both sides decode the same count.
    prompt = "Count from one to one thousand: one, two, three, four, five, six,"
    asyncio.run(engine.start())
    decode_tps_raw(model, tokenizer, prompt, 8)  # warm up both
    asyncio.run(decode_tps_engine(engine, prompt, 8))
    tps = alternate(
        {
            "raw": lambda: decode_tps_raw(model, tokenizer, prompt, tokens),
            "ours": lambda: asyncio.run(decode_tps_engine(engine, prompt, tokens)),
        },
        rounds,
    )
    print(
        f"{label}: decode tokens/s  raw mlx-lm {statistics.median(tps['raw']):8.1f}   "
        f"SimpleEngine {statistics.median(tps['ours']):8.1f}   "
        f"ratio {ratio(tps['ours'], tps['raw'])} (target >= 0.95)"
    )
    asyncio.run(engine.stop())
    return compare(tps["ours"], tps["raw"])


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


def bench_kv_reuse(
    path: Path, label: str, rounds: int, target_tokens: int = 1500
) -> dict[str, Any]:
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

    def with_reuse() -> float:
        reuse.clear_runtime_caches()
        return asyncio.run(_second_turn_ttft(reuse, history, question))

    ttft = alternate(
        {
            "reuse": with_reuse,
            "fresh": lambda: asyncio.run(_second_turn_ttft(fresh, history, question)),
        },
        rounds,
    )
    print(
        f"{label}: second-turn TTFT of a {tokens}-token conversation  with KV reuse "
        f"{statistics.median(ttft['reuse']) * 1000:7.1f} ms   without "
        f"{statistics.median(ttft['fresh']) * 1000:7.1f} ms   "
        f"ratio {ratio(ttft['reuse'], ttft['fresh'])} (target <= 0.3)"
    )
    asyncio.run(reuse.stop())
    asyncio.run(fresh.stop())
    return compare(ttft["reuse"], ttft["fresh"]) | {"prompt_tokens": tokens}


def bench_batched_raw(path: Path, levels: list[int], rounds: int, tokens: int) -> dict[str, Any]:
    from mlx_lm import load

    model, tokenizer = load(str(path))[:2]
    figures = {}
    for c in levels:
        tps = batched_vs_raw(path, model, tokenizer, c, rounds, tokens)
        print(
            f"c={c:3d}: total tokens/s  batch_generate {statistics.median(tps['raw']):8.0f}   "
            f"BatchedEngine {statistics.median(tps['ours']):8.0f}   "
            f"ratio {ratio(tps['ours'], tps['raw'])}"
        )
        figures[f"c{c}"] = compare(tps["ours"], tps["raw"])
    return figures


def batched_vs_raw(
    path: Path, model: Any, tokenizer: Any, c: int, rounds: int, tokens: int
) -> dict[str, list[float]]:
    """Total tokens/s of both sides over ``rounds`` alternating rounds."""
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
        return sum(len(ids) for ids in out.token_ids or []) / (time.perf_counter() - start)

    async def serve() -> list:
        calls = [engine.generate(p, max_tokens=tokens, temperature=0.0) for p in prompts]
        return list(await asyncio.gather(*calls))

    def ours() -> float:
        start = time.perf_counter()
        outs = loop.run_until_complete(serve())
        return sum(o.completion_tokens for o in outs) / (time.perf_counter() - start)

    raw(), ours()  # warm-up at this batch size
    tps = alternate({"raw": raw, "ours": ours}, rounds)
    loop.run_until_complete(engine.stop())
    loop.close()
    return tps


def main() -> None:
    p = parser(__doc__, rounds=5)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--skip-smollm", action="store_true")
    p.add_argument("--batched", action="store_true", help="only part 3")
    args = p.parse_args()
    from tests.support.tiny_models import build_tiny_model

    figures: dict[str, Any] = {"tokens": args.tokens}
    if args.batched:
        with tempfile.TemporaryDirectory() as tmp:
            small = build_tiny_model(Path(tmp) / "tiny64", tie_word_embeddings=False)
            figures["batched_vs_batch_generate"] = bench_batched_raw(
                small, [8, 64], args.rounds, args.tokens
            )
        save(args.json, "bench_engine", figures)
        return

    with tempfile.TemporaryDirectory() as tmp:
        tiny = build_tiny_model(
            Path(tmp) / "tiny256",
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
        )
        figures["tiny"] = {
            "decode": bench_decode(tiny, "tiny (hidden 256)", args.rounds, args.tokens),
            "second_turn_ttft": bench_kv_reuse(tiny, "tiny (hidden 256)", args.rounds),
        }
    if not args.skip_smollm:
        from tests.support.smollm import ensure_smollm2

        smol = ensure_smollm2()
        rounds = max(2, args.rounds // 2)
        figures["smollm2"] = {
            "decode": bench_decode(smol, "SmolLM2-135M", rounds, min(args.tokens, 64)),
            "second_turn_ttft": bench_kv_reuse(smol, "SmolLM2-135M", rounds),
        }
    save(args.json, "bench_engine", figures)


if __name__ == "__main__":
    main()
