"""One image and a question: SimpleEngine on a vision-language model against raw mlx-vlm.

A random Qwen2.5-VL of a real shape (built like the test fixture, larger: text hidden
512, 8 layers; vision hidden 256, 4 blocks) answers about one 224x224 image (64 image
tokens). Both sides start from the image file and the question:

- ours: ``SimpleEngine.stream_chat`` (the image decoded at the boundary, the prompt
  formatted by mlx-vlm, the processor and the decode loop on the owner thread);
- raw: ``mlx_vlm.apply_chat_template`` and ``mlx_vlm.stream_generate`` on the caller's
  thread.

Time to first token is the wall time from the call to the first token; decode
tokens/s counts the tokens after the first over the time after it. Sides alternate round
by round in one process (bench/harness.py), and the greedy tokens of the two sides must
be the same.

A second turn (the first question, its answer and a follow-up) is also timed on the
engine that keeps the first turn's KV cache and on one made with ``cache_memory_mb=0``,
which prefills the whole conversation and encodes the image again.

Run: python bench/bench_vision.py [--rounds 15] [--tokens 64] [--json FILE] (about 40 s on
a 2-core CPU)
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
from tests.support.tiny_vlm import build_tiny_vlm, make_test_image

QUESTION = "Describe this image in detail."


def first_turn(image: Path) -> list[dict]:
    parts = [{"type": "image", "image": str(image)}, {"type": "text", "text": QUESTION}]
    return [{"role": "user", "content": parts}]


async def second_turn_ttft(engine: SimpleEngine, image: Path, tokens: int) -> float:
    """TTFT of a follow-up question, right after the first turn on the same engine."""
    one = await engine.chat(first_turn(image), max_tokens=tokens, temperature=0)
    messages = [
        *first_turn(image),
        {"role": "assistant", "content": one.text},
        {"role": "user", "content": "And what colors are there?"},
    ]
    start = time.perf_counter()
    async for _ in engine.stream_chat(messages, max_tokens=1, temperature=0):
        return time.perf_counter() - start
    raise AssertionError("no token")


async def ours(engine: SimpleEngine, image: Path, tokens: int) -> tuple[float, float, list[int]]:
    messages = first_turn(image)
    start = time.perf_counter()
    first_at = first_n = None
    last = None
    async for chunk in engine.stream_chat(messages, max_tokens=tokens, temperature=0):
        now = time.perf_counter()
        if first_at is None:
            first_at, first_n = now, chunk.completion_tokens
        last = chunk
    end = time.perf_counter()
    assert last is not None and first_at is not None and first_n is not None
    # The first chunk comes with the first token that has text (nearly always the first).
    ttft = first_at - start
    tps = (last.completion_tokens - first_n) / (end - first_at)
    return ttft, tps, last.tokens


def raw(model: Any, processor: Any, image: Path, tokens: int) -> tuple[float, float, list[int]]:
    from mlx_vlm import apply_chat_template, stream_generate

    start = time.perf_counter()
    prompt = apply_chat_template(processor, model.config, QUESTION, num_images=1)
    first_at = None
    got: list[int] = []
    for result in stream_generate(
        model, processor, prompt, image=[str(image)], max_tokens=tokens, temperature=0.0
    ):
        if first_at is None:
            first_at = time.perf_counter()
        if result.finish_reason is None:
            got.append(int(result.token))
    end = time.perf_counter()
    assert first_at is not None
    return first_at - start, (len(got) - 1) / (end - first_at), got


def main() -> None:
    p = parser(__doc__, rounds=15)
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args()
    import mlx.core as mx
    from mlx_vlm import load

    with tempfile.TemporaryDirectory() as tmp:
        folder = build_tiny_vlm(
            Path(tmp) / "vlm",
            hidden_size=512,
            num_hidden_layers=8,
            vision_hidden_size=256,
            vision_depth=4,
        )
        image = make_test_image(Path(tmp) / "image.png", "checker", size=224)
        engine = SimpleEngine(folder)
        engine.prepare_for_start()
        cold = SimpleEngine(folder, cache_memory_mb=0)
        cold.prepare_for_start()
        model, processor = load(str(folder))
        # Warm both (first calls compile and fill MLX's buffer pool).
        asyncio.run(ours(engine, image, 4))
        raw(model, processor, image, 4)
        results = alternate(
            {
                "ours": lambda: asyncio.run(ours(engine, image, args.tokens)),
                "raw": lambda: raw(model, processor, image, args.tokens),
            },
            args.rounds,
        )
        asyncio.run(second_turn_ttft(cold, image, 4))  # warm-up
        second = alternate(
            {
                "reuse": lambda: asyncio.run(second_turn_ttft(engine, image, args.tokens)),
                "cold": lambda: asyncio.run(second_turn_ttft(cold, image, args.tokens)),
            },
            args.rounds,
        )
        asyncio.run(engine.stop())
        asyncio.run(cold.stop())
    ttft = {k: [r[0] for r in v] for k, v in results.items()}
    tps = {k: [r[1] for r in v] for k, v in results.items()}
    same = results["ours"][0][2][: len(results["raw"][0][2])] == results["raw"][0][2]
    print(f"device: {mx.default_device()}, {args.rounds} rounds, {args.tokens} tokens")
    print(f"prompt: 1 image 224x224 (64 image tokens) + question; greedy tokens equal: {same}")
    print(
        f"TTFT  ours {statistics.median(ttft['ours']) * 1000:.1f} ms, raw mlx-vlm "
        f"{statistics.median(ttft['raw']) * 1000:.1f} ms, ours/raw {ratio(ttft['ours'], ttft['raw'])}"
    )
    print(
        f"decode ours {statistics.median(tps['ours']):.1f} tok/s, raw mlx-vlm "
        f"{statistics.median(tps['raw']):.1f} tok/s, ours/raw {ratio(tps['ours'], tps['raw'])}"
    )
    print(
        f"second-turn TTFT, first turn's cache reused {statistics.median(second['reuse']) * 1000:.1f}"
        f" ms, cold {statistics.median(second['cold']) * 1000:.1f} ms, reuse/cold "
        f"{ratio(second['reuse'], second['cold'])}"
    )
    save(
        args.json,
        "bench_vision",
        {
            "ttft": compare(ttft["ours"], ttft["raw"]),
            "decode": compare(tps["ours"], tps["raw"]),
            "second_turn_ttft": compare(second["reuse"], second["cold"]),
            "same_greedy_tokens": same,
        },
    )


if __name__ == "__main__":
    main()
