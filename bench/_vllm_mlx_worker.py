"""The vllm-mlx side of ``bench_vllm_mlx.py``: serves its engines over JSON lines.

Runs under the interpreter of a separate virtualenv holding vllm-mlx (it pins an older
mlx-lm than this repository), so it must not import ``mlx_integrations``. It reads one
JSON command per line on stdin and answers one JSON line on stdout:

    {"id": 1, "cmd": "start", "name": "simple", "kind": "simple", "model": "/path",
     "options": {...}}            -> {"id": 1, "ok": true, "result": {"load_s": 1.2}}
    {"id": 2, "cmd": "generate", "name": "simple", "prompt": "...", "max_tokens": 64}
    {"id": 3, "cmd": "chat", "name": "simple", "messages": [...], "max_tokens": 1}
    {"id": 4, "cmd": "batch", "name": "batched", "requests": [[...], ...], "max_tokens": 64}
    {"id": 5, "cmd": "stats", "name": "simple"}
    {"id": 6, "cmd": "stop", "name": "simple"}
    {"id": 7, "cmd": "exit"}

Failures answer ``{"ok": false, "error": "...", "traceback": "..."}`` and the worker
keeps serving. Timings are taken here, around the engine calls, the same way the bench
times its own engines, so the pipe is never inside a measurement.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import sys
import time
import traceback
from typing import Any

_OPENBLAS_NAMES = ("libopenblas.so.0", "libopenblas.so", "libopenblasp-r0.so")


def preload_blas() -> str | None:
    """Load OpenBLAS globally before MLX, as ``mlx_integrations`` does on import.

    Honours the same ``MLXI_BLAS`` variable (``off`` or a library path), so both sides
    of the comparison run their matmuls on the same BLAS.
    """
    if not sys.platform.startswith("linux") or "mlx.core" in sys.modules:
        return None
    choice = os.environ.get("MLXI_BLAS", "")
    if choice.lower() in {"off", "0", "none"}:
        return None
    for name in (choice,) if choice else _OPENBLAS_NAMES:
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        return name
    return None


BLAS = preload_blas()

from _streams import timed_stream  # noqa: E402  (the benchmarks' timing, standard library only)

# Nothing else in this folder belongs on the peer's import path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

# The protocol owns the real stdout; anything else printing (libraries, C code)
# goes to stderr so it cannot corrupt a reply.
_PROTO = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

ENGINES: dict[str, Any] = {}


def reply(message: dict[str, Any]) -> None:
    _PROTO.write(json.dumps(message, default=str) + "\n")
    _PROTO.flush()


def versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {}
    for dist in ("vllm-mlx", "mlx", "mlx-lm", "transformers"):
        try:
            out[dist] = version(dist)
        except Exception:
            out[dist] = "?"
    return out


def make_engine(kind: str, model: str, options: dict[str, Any]) -> Any:
    if kind == "simple":
        from vllm_mlx.engine.simple import SimpleEngine

        return SimpleEngine(model, **options)
    if kind == "batched":
        from vllm_mlx.engine.batched import BatchedEngine
        from vllm_mlx.scheduler import SchedulerConfig

        options = dict(options)
        scheduler = SchedulerConfig(**options.pop("scheduler", {}))
        return BatchedEngine(model, scheduler_config=scheduler, **options)
    raise ValueError(f"unknown engine kind {kind!r}")


async def handle(msg: dict[str, Any]) -> Any:
    cmd = msg["cmd"]
    if cmd == "hello":
        import vllm_mlx.engine.batched
        import vllm_mlx.engine.simple  # noqa: F401  (fail here, not mid-bench)

        return {"blas": BLAS, "python": sys.version.split()[0], "versions": versions()}
    if cmd == "start":
        if msg["name"] in ENGINES:
            raise ValueError(f"engine {msg['name']!r} is already started")
        engine = make_engine(msg["kind"], msg["model"], msg.get("options") or {})
        begin = time.perf_counter()
        await engine.start()
        ENGINES[msg["name"]] = engine
        return {"load_s": time.perf_counter() - begin}
    if cmd == "exit":
        for name in list(ENGINES):
            await ENGINES.pop(name).stop()
        return {}
    engine = ENGINES[msg["name"]]
    sampling = {"temperature": msg.get("temperature", 0.0), "top_p": msg.get("top_p", 1.0)}
    if cmd == "generate":
        return await timed_stream(
            engine.stream_generate(msg["prompt"], max_tokens=msg["max_tokens"], **sampling)
        )
    if cmd == "chat":
        return await timed_stream(
            engine.stream_chat(msg["messages"], max_tokens=msg["max_tokens"], **sampling)
        )
    if cmd == "batch":
        calls = [
            timed_stream(engine.stream_chat(m, max_tokens=msg["max_tokens"], **sampling))
            for m in msg["requests"]
        ]
        begin = time.perf_counter()
        outs = await asyncio.gather(*calls)
        return {"wall_s": time.perf_counter() - begin, "outputs": outs}
    if cmd == "stats":
        return {"stats": engine.get_stats(), "cache": engine.get_cache_stats()}
    if cmd == "stop":
        await ENGINES.pop(msg["name"]).stop()
        return {}
    raise ValueError(f"unknown command {cmd!r}")


async def serve() -> None:
    loop = asyncio.get_running_loop()
    while True:
        # Read off the loop: a BatchedEngine steps on this loop between commands.
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        msg: dict[str, Any] = {}
        try:
            msg = json.loads(line)
            reply({"id": msg.get("id"), "ok": True, "result": await handle(msg)})
        except Exception as exc:
            reply(
                {
                    "id": msg.get("id"),
                    "ok": False,
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(),
                }
            )
        if msg.get("cmd") == "exit":
            break
    for name in list(ENGINES):
        await ENGINES.pop(name).stop()


if __name__ == "__main__":
    asyncio.run(serve())
