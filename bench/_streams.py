"""What the engine benchmarks share: the request texts and how one stream is timed.

Imports nothing beyond the standard library, so the vllm-mlx worker (another
virtualenv, without this package) times its engine's streams with the same code as
the benchmarks time ours.
"""

from __future__ import annotations

import time
from typing import Any

# Short, varied chat requests for concurrent runs.
QUESTIONS = [
    "What is the weather in Paris?",
    "Hello! How can I help you today?",
    "The capital of France is Paris. The capital of Italy is",
    "Call get_weather for Rome, in celsius please.",
    "The quick brown fox jumps over the lazy dog.",
    "0123456789 + - * / = ( ) [ ] { }",
    "Tools: You may call one or more functions.",
    "Unicode: café, naïve, 東京, Привет",
]


async def timed_stream(stream: Any) -> dict[str, Any]:
    """Consume one output stream; time the first chunk and the span of the rest."""
    start = time.perf_counter()
    first = last = None
    out = None
    chunks = 0
    async for chunk in stream:
        out = chunk
        last = time.perf_counter()
        if first is None:
            first = last
        chunks += 1
    if out is None or first is None or last is None:
        raise RuntimeError("the engine produced no output")
    return {
        "text": out.text,
        "completion_tokens": int(out.completion_tokens),
        "prompt_tokens": int(out.prompt_tokens),
        "cached_tokens": getattr(out, "cached_tokens", None),
        "finish_reason": out.finish_reason,
        "chunks": chunks,
        "ttft_s": first - start,
        "decode_s": last - first,
        "total_s": last - start,
    }
