"""One image and a question through ChatMLX and MLXLLM against the engine they run on.

The random Qwen2.5-VL of bench_vision.py (text hidden 512, 8 layers; vision hidden 256,
4 blocks) answers about one 224x224 image. Each round times, in turn:

- engine: ``SimpleEngine.chat`` with a neutral message holding the image's path;
- ChatMLX: ``invoke`` with a LangChain ``{"type": "image", "base64": ...}`` block;
- MLXLLM: ``chat`` with ``ImageBlock(image=<png bytes>)``.

All three share one engine (no prefix cache, so every call encodes the image and
prefills the whole prompt); the adapters' replies must equal the engine's. Medians of
whole-call wall times are compared (adapter / engine).

Run: python bench/bench_vision_adapters.py [--rounds 7] [--tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx_integrations  # noqa: F401  (preloads OpenBLAS before mlx)
from tests.support.tiny_vlm import build_tiny_vlm, make_test_image

QUESTION = "Describe this image in detail."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()

    from langchain_core.messages import HumanMessage
    from llama_index.core.llms import ChatMessage, ImageBlock, TextBlock

    from mlx_integrations.langchain import ChatMLX
    from mlx_integrations.llama_index import MLXLLM

    tmp = Path(tempfile.mkdtemp(prefix="bench-vision-adapters-"))
    model = build_tiny_vlm(
        tmp / "model", hidden_size=512, num_hidden_layers=8, vision_hidden_size=256, vision_depth=4
    )
    image = make_test_image(tmp / "image.png", "stripes", size=224)
    png = image.read_bytes()
    settings = dict(temperature=0, max_tokens=args.tokens, engine_options={"cache_memory_mb": 0})
    lc = ChatMLX(model=str(model), **settings)
    li = MLXLLM(model=str(model), **settings)
    engine = lc.engine
    assert li.engine is engine  # one pooled engine under both adapters

    neutral = [
        {
            "role": "user",
            "content": [{"type": "image", "image": str(image)}, {"type": "text", "text": QUESTION}],
        }
    ]
    lc_message = HumanMessage(
        content=[
            {"type": "image", "base64": base64.b64encode(png).decode(), "mime_type": "image/png"},
            {"type": "text", "text": QUESTION},
        ]
    )
    li_message = ChatMessage(role="user", blocks=[ImageBlock(image=png), TextBlock(text=QUESTION)])

    def run_engine() -> str:
        out = asyncio.run(
            engine.chat(neutral, max_tokens=args.tokens, temperature=0)  # type: ignore[arg-type]
        )
        return str(out.text)

    def run_chatmlx() -> str:
        return str(lc.invoke([lc_message]).content)

    def run_mlxllm() -> str:
        return str(li.chat([li_message]).message.content)

    sides = {"engine": run_engine, "ChatMLX": run_chatmlx, "MLXLLM": run_mlxllm}
    replies = {name: fn() for name, fn in sides.items()}  # warm-up, and the replies
    assert replies["ChatMLX"] == replies["engine"] == replies["MLXLLM"], replies
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, fn in sides.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["engine"])
    print(f"one 224x224 image, {args.tokens} tokens, {args.rounds} rounds (median wall time)")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:8s} {median * 1000:8.1f} ms   {median / base:.3f}x engine")
    print("  replies identical: True")


if __name__ == "__main__":
    main()
