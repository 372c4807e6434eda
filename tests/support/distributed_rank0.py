"""Rank 0's program in the distributed tests, run by ``mlxi launch``.

``python distributed_rank0.py SCENARIO MODEL [MAX_TOKENS]`` prints one JSON object
(the figures the test checks) as its last stdout line; ``match`` takes a fourth
argument, ``tensor`` (default) or ``pipeline``. Scenarios:

- ``serve``: greedy replies through ChatMLX and MLXLLM on the DistributedEngine and on
  a SimpleEngine of the same model in this process; a stream closed after two chunks,
  then another request; ``abort_request``; per-rank stats; a cache clear on every rank.
- ``match``: only the ChatMLX comparison (for the larger model).
- ``refuse``: the error of a model that cannot be split over the ranks.
- ``kill``: a long stream during which rank 1 is killed (SIGKILL); the error and the
  seconds it took to come are printed, then the program exits 3.
- ``hang``: the same, with rank 1 stopped (SIGSTOP) instead: it hangs, alive.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

import mlx_integrations  # noqa: F401  (preloads the CPU BLAS before mlx.core)
from mlx_integrations.engine import DistributedEngine, DistributedError, SimpleEngine
from mlx_integrations.langchain import ChatMLX

PROMPT = "Hello! What is the capital of France?"


def greedy(engine: object, max_tokens: int) -> dict[str, object]:
    chat = ChatMLX(engine=engine, temperature=0, max_tokens=max_tokens)
    text = chat.invoke(PROMPT).content
    out = asyncio.run(
        engine.chat([{"role": "user", "content": PROMPT}], max_tokens=max_tokens, temperature=0)  # type: ignore[attr-defined]
    )
    return {"text": text, "tokens": out.tokens}


def serve(model: str, max_tokens: int) -> dict[str, object]:
    from mlx_integrations.llama_index import MLXLLM

    engine = DistributedEngine(model, rank_timeout=20)
    reference = SimpleEngine(model)
    result: dict[str, object] = {
        "distributed": greedy(engine, max_tokens),
        "single": greedy(reference, max_tokens),
        "llama_index": MLXLLM(engine=engine, temperature=0, max_tokens=max_tokens)
        .complete(PROMPT)
        .text,
        "llama_index_single": MLXLLM(engine=reference, temperature=0, max_tokens=max_tokens)
        .complete(PROMPT)
        .text,
    }
    # A consumer that stops after two chunks: the request ends on every rank.
    chat = ChatMLX(engine=engine, temperature=0, max_tokens=200)
    stream = chat.stream(PROMPT, logits_processors=no_end(engine))
    chunks = [next(stream), next(stream)]
    stream.close()
    result["cancelled_chunks"] = len(chunks)
    result["after_cancel"] = (
        ChatMLX(engine=engine, temperature=0, max_tokens=max_tokens).invoke(PROMPT).content
    )
    result["abort"] = asyncio.run(abort_one(engine))
    deadline = time.monotonic() + 10  # the other ranks' figures come with their heartbeats
    stats = engine.get_stats()
    while len({r["steps"] for r in stats["ranks"]}) > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
        stats = engine.get_stats()
    result["stats"] = {
        "world_size": stats["world_size"],
        "state": stats["state"],
        "aborted": stats["num_requests_aborted"],
        "running": stats["num_running"],
        "ranks": [
            {"rank": r["rank"], "steps": r["steps"], "alive": r["alive"]} for r in stats["ranks"]
        ],
    }
    result["clear"] = engine.clear_runtime_caches()["ranks"]
    asyncio.run(reference.stop())
    asyncio.run(engine.stop())
    after = engine.get_stats()
    result["stopped_state"], result["stopped_loaded"] = after["state"], after["loaded"]
    return result


def eos_id(engine: DistributedEngine) -> int:
    return int(sorted(engine.tokenizer.eos_token_ids)[0])


def no_end(engine: DistributedEngine) -> list[object]:
    """A logits processor that keeps the reply going (its end tokens never win)."""
    import mlx.core as mx

    ends = mx.array(sorted(engine.tokenizer.eos_token_ids))

    def processor(tokens: object, logits: mx.array) -> mx.array:
        mask = (mx.arange(logits.shape[-1])[:, None] == ends[None, :]).any(axis=1)
        return mx.where(mask, -1e9, logits)

    return [processor]


async def abort_one(engine: DistributedEngine) -> str | None:
    messages = [{"role": "user", "content": PROMPT}]
    stream = engine.stream_chat(
        messages,
        max_tokens=500,
        temperature=0,
        request_id="r-abort",
        logit_bias={eos_id(engine): -100.0},
    )
    last = None
    async for out in stream:
        if last is None:
            await engine.abort_request("r-abort")
        last = out
    return last.finish_reason if last is not None else None


def match(model: str, max_tokens: int, parallel: str = "tensor") -> dict[str, object]:
    engine = DistributedEngine(model, rank_timeout=60, parallel=parallel)  # type: ignore[arg-type]
    reference = SimpleEngine(model)
    result = {
        "distributed": greedy(engine, max_tokens),
        "single": greedy(reference, max_tokens),
        "world_size": engine.get_stats()["world_size"],
    }
    inner = engine._model.model  # which layers rank 0 holds
    result["layers_on_rank0"] = len(getattr(inner, "pipeline_layers", inner.layers))
    asyncio.run(reference.stop())  # engines are stopped before exit (MLX streams)
    asyncio.run(engine.stop())
    return result


def refuse(model: str) -> dict[str, object]:
    engine = DistributedEngine(model, rank_timeout=60)
    try:
        engine.prepare_for_start()
    except ValueError as exc:
        return {"error": str(exc), "type": "ValueError"}
    return {"error": None}


def kill(model: str, sig: signal.Signals = signal.SIGKILL) -> None:
    engine = DistributedEngine(model)  # rank_timeout from mlxi launch --rank-timeout
    chat = ChatMLX(engine=engine, temperature=0, max_tokens=4000)
    started = None
    try:
        for n, _chunk in enumerate(chat.stream(PROMPT, logits_processors=no_end(engine))):
            if n == 3:
                pid = engine.get_stats()["ranks"][1]["pid"]
                os.kill(pid, sig)
                started = time.monotonic()
    except DistributedError as exc:
        waited = time.monotonic() - started if started is not None else None
        print(
            json.dumps({"error": str(exc), "seconds": waited, "state": engine.get_stats()["state"]})
        )
        sys.stdout.flush()
        sys.exit(3)
    print(json.dumps({"error": None}))


def main() -> None:
    scenario, model = sys.argv[1], sys.argv[2]
    max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 12
    if scenario in ("kill", "hang"):
        kill(model, signal.SIGKILL if scenario == "kill" else signal.SIGSTOP)
        return
    if scenario == "match":
        out = match(model, max_tokens, *sys.argv[4:])
    else:
        out = serve(model, max_tokens) if scenario == "serve" else refuse(model)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
