"""Constrained decoding benchmark: decode speed with a JSON-schema constraint.

Prints, on SmolLM2-135M-Instruct through ``SimpleEngine``:

- decode tokens/s with a JSON-schema constraint divided by unconstrained decoding of
  the same prompt for the same number of tokens, measured side by side in one run:
  requests alternate (constrained, free, free, constrained, ...) so both see the same
  machine load (target >= 0.85). Two figures per pair: from the median time between
  streamed tokens (robust to load spikes on a shared machine) and from the engine's
  mean ``generation_tps``;
- the processor's own cost per token (mask computed by llguidance, applied with MLX),
  replayed on the tokens of a constrained answer, in microseconds;
- whether a full constrained answer validates against the schema.

Run: ``.venv/bin/python bench/bench_constraints.py [--pairs 8 --tokens 40]``
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx_integrations  # noqa: F401  (BLAS preload before mlx.core)
from mlx_integrations.chat.constraints import JsonSchemaConstraint
from mlx_integrations.chat.schemas import validate_json_output
from mlx_integrations.engine import SimpleEngine

TARGET = 0.85

SCHEMA = {
    "type": "object",
    "properties": {
        "cities": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 24},
                    "country": {"type": "string", "maxLength": 24},
                    "population": {"type": "integer", "minimum": 0},
                    "capital": {"type": "boolean"},
                },
                "required": ["name", "country", "population", "capital"],
                "additionalProperties": False,
            },
            "minItems": 3,
            "maxItems": 3,
        }
    },
    "required": ["cities"],
    "additionalProperties": False,
}
MESSAGES = [
    {
        "role": "user",
        "content": "List three large European cities as JSON, with their country, "
        "population and whether each is a capital.",
    }
]


async def timed_request(
    engine: SimpleEngine, tokens: int, constraint: JsonSchemaConstraint | None
) -> tuple[float, float, int]:
    """One request: (tokens/s from the median gap between chunks, engine tokens/s, tokens)."""
    processors = [constraint.make_processor(engine.tokenizer)] if constraint else []
    stamps: list[float] = []
    last = None
    async for out in engine.stream_chat(
        MESSAGES, max_tokens=tokens, temperature=0, logits_processors=processors
    ):
        stamps.append(time.perf_counter())
        last = out
    assert last is not None
    # The first gap holds the prefill; the rest are decode steps.
    gaps = [b - a for a, b in itertools.pairwise(stamps[1:])]
    return 1.0 / statistics.median(gaps), last.generation_tps, len(last.tokens)


def processor_cost_us(
    engine: SimpleEngine, constraint: JsonSchemaConstraint, answer: list[int]
) -> float:
    """Microseconds per call of the processor, replaying a constrained answer (best of 3)."""
    import mlx.core as mx

    tok = engine.tokenizer
    prompt = tok.encode(engine.render_prompt(MESSAGES), add_special_tokens=False)
    width = int(engine.config.get("vocab_size") or len(tok.get_vocab()))
    logits = mx.zeros((1, width))
    mx.eval(logits)
    runs = []
    for _ in range(3):
        processor = constraint.make_processor(tok)
        tokens = mx.array(prompt)
        start = time.perf_counter()
        for t in answer:
            mx.eval(processor(tokens, logits))
            tokens = mx.concatenate([tokens, mx.array([t])])
        runs.append((time.perf_counter() - start) / len(answer) * 1e6)
    return min(runs)


async def main(pairs: int, tokens: int) -> int:
    from tests.support.smollm import ensure_smollm2

    engine = SimpleEngine(ensure_smollm2())
    await engine.start()
    constraint = JsonSchemaConstraint(SCHEMA)
    try:
        # A full constrained answer (also the warm-up of the tokenizer, grammar and kernels).
        full = await engine.chat(
            MESSAGES,
            max_tokens=160,
            temperature=0,
            logits_processors=[constraint.make_processor(engine.tokenizer)],
        )
        try:
            validate_json_output(full.text, SCHEMA, finish_reason=full.finish_reason)
            valid = "valid"
        except ValueError as exc:
            valid = f"INVALID ({exc})"
        await timed_request(engine, 8, None)

        median_ratios, mean_ratios = [], []
        c_rates, u_rates = [], []
        for i in range(pairs):
            order = [constraint, None] if i % 2 == 0 else [None, constraint]
            results = {}
            for which in order:
                results[which is not None] = await timed_request(engine, tokens, which)
            (c_med, c_mean, n), (u_med, u_mean, _) = results[True], results[False]
            median_ratios.append(c_med / u_med)
            mean_ratios.append(c_mean / u_mean)
            c_rates.append(c_med)
            u_rates.append(u_med)
            print(
                f"pair {i + 1}: {n} tokens; per-token median: constrained {c_med:.1f} tok/s, "
                f"free {u_med:.1f} tok/s, ratio {c_med / u_med:.3f}; "
                f"engine mean ratio {c_mean / u_mean:.3f}"
            )
        cost = processor_cost_us(engine, constraint, full.tokens)
    finally:
        await engine.stop()
    ratio = statistics.median(median_ratios)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print()
    print(f"full constrained answer ({len(full.tokens)} tokens, {full.finish_reason}): {valid}")
    print(
        f"decode tok/s (median over pairs): constrained {statistics.median(c_rates):.1f}, "
        f"unconstrained {statistics.median(u_rates):.1f}"
    )
    print(
        f"constrained / unconstrained, median of {pairs} pairs: {ratio:.3f} "
        f"(target >= {TARGET}); from engine means: {statistics.median(mean_ratios):.3f}"
    )
    print(
        f"processor cost per token (llguidance mask + MLX apply): {cost:.0f} us, "
        f"{cost / 1e4 * statistics.median(u_rates):.2f}% of an unconstrained token"
    )
    print(f"load average (1 min) at the end: {load:.2f}")
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=8, help="constrained/free request pairs")
    parser.add_argument("--tokens", type=int, default=40, help="tokens decoded per request")
    args = parser.parse_args()
    raise SystemExit(asyncio.run(main(args.pairs, args.tokens)))
