"""Our engines against vllm-mlx 0.6.0's, measured side by side in one run.

vllm-mlx implements the same ``BaseEngine`` contract (``SimpleEngine``,
``BatchedEngine``). Each figure prints the vllm-mlx value, ours, and ours/vllm-mlx:

1. Single-request decode tokens/s, SimpleEngine against vllm-mlx SimpleEngine: greedy
   ``stream_generate`` of the same prompt and ``max_tokens``, timed from the first
   token to the last (higher is better). The two greedy texts are compared.
2. Time to first token of the second turn of a ~1,500-token conversation whose first
   turn was just served, each engine with its prompt cache on as a user would turn it
   on (lower is better): ours at their defaults; vllm-mlx SimpleEngine with
   ``prefix_trie_cache=True`` (``--prefix-trie-cache``; its system-prompt KV cache is
   on by default); vllm-mlx BatchedEngine with its default memory-aware prefix cache.
   Measured for both engine pairs. Every round is a new conversation, so no round
   reuses another's cache. The cold first turn is printed alongside, and what each
   side reused.
3. Total generated tokens/s of N concurrent greedy ``stream_chat`` requests
   (``--concurrency 1 2 4 8 16`` measures each level; 8 by default),
   BatchedEngine against vllm-mlx BatchedEngine (``SchedulerConfig(max_num_seqs=N)``),
   prefix caches off on both so both do the same prefill and decode work (higher is
   better). The greedy texts are compared request by request.

vllm-mlx pins mlx-lm < 0.32, so it runs from its own virtualenv in one long-lived
worker process (``bench/_vllm_mlx_worker.py``) that speaks JSON lines and times its
engine calls itself, the same way this process times ours, so the pipe is never inside
a measurement. The worker preloads OpenBLAS before MLX as this package does, so both
sides use the same BLAS. One side computes at a time; rounds alternate which side goes
first and medians are compared, so load from other processes hits both sides alike.
When something of vllm-mlx fails, the error is printed and the other figures go on.

Setup of the vllm-mlx virtualenv (once; its full dependency set pulls torch, gradio
and opencv, none of which its engines need):

    python3.11 -m venv /tmp/vllm-venv
    /tmp/vllm-venv/bin/pip install --no-deps "vllm-mlx==0.6.0"
    /tmp/vllm-venv/bin/pip install "mlx[cpu]==0.32.4" "mlx-lm>=0.31.3,<0.32" \\
        "transformers==5.24.0" "tokenizers==0.23.3" jsonschema requests psutil

Run: ``.venv/bin/python bench/bench_vllm_mlx.py [--rounds 5] [--tokens 128] [--smollm]
[--peer-python /tmp/vllm-venv/bin/python]``. The tiny random model (hidden 256, 4 layers,
float32) is always measured; ``--smollm`` adds SmolLM2-135M-Instruct with
``rounds // 2 + 1`` rounds (at least 3) and at most 64 tokens per request. Both sides
load the same model folder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from importlib.metadata import version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _streams import QUESTIONS, timed_stream

import mlx_integrations  # noqa: F401  (preloads OpenBLAS before mlx.core)
from mlx_integrations.engine import BatchedEngine, SimpleEngine
from mlx_integrations.engine.mlx_engine import MLXEngine
from mlx_integrations.runtime import preload_cpu_blas

WORKER = Path(__file__).resolve().parent / "_vllm_mlx_worker.py"
DEFAULT_PEER_PYTHON = "/tmp/vllm-venv/bin/python"
SETUP = f"""\
The vllm-mlx virtualenv is missing or incomplete. Create it with:

    python3.11 -m venv /tmp/vllm-venv
    /tmp/vllm-venv/bin/pip install --no-deps "vllm-mlx==0.6.0"
    /tmp/vllm-venv/bin/pip install "mlx[cpu]=={version("mlx")}" "mlx-lm>=0.31.3,<0.32" \\
        "transformers=={version("transformers")}" "tokenizers=={version("tokenizers")}" \\
        jsonschema requests psutil

or pass --peer-python PATH of an interpreter that has vllm-mlx 0.6.0."""

# A continuation that does not end early, so both sides decode the same count.
DECODE_PROMPT = "Count from one to one thousand: one, two, three, four, five, six,"
GREEDY = {"temperature": 0.0, "top_p": 1.0}
Sample = dict[str, Any]


# ------------------------------------------------------------------ the peer process


class PeerError(RuntimeError):
    """Something of vllm-mlx failed (or its worker died)."""

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail


class Peer:
    """The vllm-mlx worker: one long-lived process, one command at a time."""

    def __init__(self, python: str, log_path: Path, timeout: float):
        self.python = python
        self.log_path = log_path
        self.timeout = timeout
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.info: dict[str, Any] = {}
        self._next_id = 0

    def _spawn(self) -> None:
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        log = open(self.log_path, "a")  # the child keeps its own copy
        self.proc = subprocess.Popen(
            [self.python, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
            cwd=tempfile.gettempdir(),
        )
        log.close()
        self.lines = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, self.lines), daemon=True).start()
        self.info = self.call("hello", timeout=120)

    @staticmethod
    def _read(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def log_tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def call(self, cmd: str, timeout: float | None = None, **fields: Any) -> dict[str, Any]:
        """Send one command and wait for its answer; raises PeerError on any failure."""
        if self.proc is None or self.proc.poll() is not None:
            if cmd == "hello":
                self._kill()
                raise PeerError("the vllm-mlx worker exited at start", self.log_tail())
            self._spawn()  # a fresh worker after a crash; its engines are gone
        assert self.proc is not None and self.proc.stdin is not None
        self._next_id += 1
        try:
            self.proc.stdin.write(json.dumps({"id": self._next_id, "cmd": cmd, **fields}) + "\n")
            self.proc.stdin.flush()
            line = self.lines.get(timeout=timeout or self.timeout)
        except queue.Empty:
            self._kill()
            raise PeerError(f"{cmd}: no answer in {timeout or self.timeout:.0f} s") from None
        except OSError:  # the pipe broke: the worker is gone
            line = None
        if line is None:
            self._kill()
            raise PeerError(f"{cmd}: the vllm-mlx worker died", self.log_tail())
        reply = json.loads(line)
        if not reply["ok"]:
            raise PeerError(f"{cmd}: {reply['error']}", reply.get("traceback", ""))
        return reply["result"]

    def start(self) -> None:
        self._spawn()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.call("exit", timeout=120)
            except PeerError:
                pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._kill()
        self.proc = None


# ------------------------------------------------------------------------ our side


async def ours_batch(engine: MLXEngine, requests: list[list[dict]], max_tokens: int) -> Sample:
    calls = [timed_stream(engine.stream_chat(m, max_tokens=max_tokens, **GREEDY)) for m in requests]
    start = time.perf_counter()
    outs = await asyncio.gather(*calls)
    return {"wall_s": time.perf_counter() - start, "outputs": outs}


# ---------------------------------------------------------------------- measuring


@dataclass
class Pair:
    """One figure's samples: the peer's (None once it failed) and ours."""

    peer: list[Any] | None
    ours: list[Any]
    error: PeerError | None = None


async def alternate(
    rounds: int,
    peer_run: Callable[[int], Any],
    ours_run: Callable[[int], Awaitable[Any]],
) -> Pair:
    """Run both sides ``rounds`` times, alternating which goes first."""
    pair = Pair(peer=[], ours=[])
    for r in range(rounds):
        for side in ("peer", "ours") if r % 2 == 0 else ("ours", "peer"):
            if side == "ours":
                pair.ours.append(await ours_run(r))
            elif pair.peer is not None:
                try:
                    pair.peer.append(peer_run(r))
                except PeerError as exc:
                    pair.peer, pair.error = None, exc
    return pair


def print_failure(what: str, exc: PeerError) -> None:
    print(f"    vllm-mlx FAILED ({what}): {exc}")
    for line in exc.detail.strip().splitlines()[-6:]:
        print(f"      | {line}")


class PeerEngine:
    """One vllm-mlx engine in the worker, started (and warmed up) on creation.

    Calling it sends a command to that engine; once its start failed (printed then),
    every call raises PeerError, so the figures that need it print the failure.
    """

    def __init__(
        self,
        peer: Peer,
        name: str,
        kind: str,
        model: Path,
        options: dict[str, Any],
        warmup: tuple[str, dict[str, Any]] | None = None,
    ) -> None:
        self.peer, self.name = peer, name
        self.label = "SimpleEngine" if kind == "simple" else "BatchedEngine"
        self.ok = True
        try:
            peer.call("start", name=name, kind=kind, model=str(model), options=options)
            if warmup is not None:
                self(warmup[0], **warmup[1])
        except PeerError as exc:
            print_failure(f"start {self.label}", exc)
            self.ok = False

    def __call__(self, cmd: str, **fields: Any) -> Sample:
        if not self.ok:
            raise PeerError(f"{self.label} did not start")
        return self.peer.call(cmd, name=self.name, **fields)

    def stop(self, report: Callable[[], None]) -> None:
        """Run ``report`` (which may ask the engine for stats), then stop the engine."""
        if not self.ok:
            return
        try:
            report()
            self("stop")
        except PeerError as exc:
            print_failure(f"{self.label} stats/stop", exc)


def figure(
    label: str,
    title: str,
    pair: Pair,
    value: Callable[[Any], float],
    unit: str,
    higher_is_better: bool,
    note: str = "",
    scale: float = 1.0,
) -> None:
    """One line: the two medians and ours/peer."""
    ours = statistics.median(value(s) for s in pair.ours) * scale
    head = f"{label}  {title}:"
    if pair.peer is None:
        print(f"{head}  vllm-mlx FAILED   ours {ours:9.1f} {unit}")
        if pair.error is not None:
            print_failure(title, pair.error)
        return
    peer = statistics.median(value(s) for s in pair.peer) * scale
    better = "higher" if higher_is_better else "lower"
    print(
        f"{head}  vllm-mlx {peer:9.1f} {unit}   ours {ours:9.1f} {unit}   "
        f"ours/vllm-mlx {ours / peer:6.3f} ({better} is better){note}"
    )


def decode_tps(sample: Sample) -> float:
    return (sample["completion_tokens"] - 1) / sample["decode_s"]


def same_text(a: str, b: str) -> str:
    if a == b:
        return "identical"
    at = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    return f"DIFFER from character {at}"


def peer_cache_summary(stats: dict[str, Any]) -> str:
    """What vllm-mlx says its caches did (the keys that show reuse)."""
    s, cache = stats.get("stats") or {}, stats.get("cache") or {}
    parts = []
    trie = s.get("prefix_trie_cache")
    if isinstance(trie, dict):
        keys = ("lookups", "hits", "misses", "inserts", "skips", "tokens_saved")
        parts.append("prefix trie " + ", ".join(f"{k} {trie.get(k)}" for k in keys))
        if trie.get("enabled") and not trie.get("inserts") and trie.get("skips"):
            parts.append("NOTE: the prefix trie stored nothing (every insert failed)")
    system = (s.get("system_kv_cache") or {}).get("counters")
    if isinstance(system, dict):
        keys = ("hits", "misses", "stores")
        parts.append("system-prompt KV " + ", ".join(f"{k} {system.get(k)}" for k in keys))
    if s.get("engine_type") == "batched" and isinstance(cache, dict):
        keys = ("hits", "misses", "tokens_saved", "entry_count")
        parts.append("prefix cache " + ", ".join(f"{k} {cache.get(k)}" for k in keys))
    return "; ".join(parts) or "no cache statistics"


class Conversations:
    """Long first turns of about ``target`` tokens (ours' tokenizer), one per session."""

    def __init__(self, engine: MLXEngine, target: int):
        self.facts: list[str] = []
        while len(engine.tokenizer.encode(engine.render_prompt(self.history(0)))) < target:
            n = len(self.facts)
            self.facts.append(f"Fact {n}: the lamp of tower {n} burns whale oil.")
        self.tokens = len(engine.tokenizer.encode(engine.render_prompt(self.history(0))))

    def history(self, session: int) -> list[dict]:
        notes = " ".join(self.facts)
        return [
            {"role": "system", "content": "You are a helpful archivist."},
            {
                "role": "user",
                "content": f"Here are my notes from session {session}:\n{notes}\nSummarize them.",
            },
        ]

    def second_turn(self, session: int) -> list[dict]:
        return [
            *self.history(session),
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "Which lamp burns whale oil?"},
        ]


@dataclass
class Settings:
    label: str
    model: Path
    rounds: int
    tokens: int
    batch_tokens: int
    concurrency: int
    context: int


async def bench_simple(peer: Peer, s: Settings) -> None:
    """Figures 1 and 2 on SimpleEngine against vllm-mlx SimpleEngine."""
    ours = SimpleEngine(s.model)
    warmup = ("generate", {"prompt": DECODE_PROMPT, "max_tokens": 8, **GREEDY})
    theirs = PeerEngine(peer, "simple", "simple", s.model, {"prefix_trie_cache": True}, warmup)
    await ours.start()
    await timed_stream(ours.stream_generate(DECODE_PROMPT, max_tokens=8, **GREEDY))

    # 1. decode tokens/s
    pair = await alternate(
        s.rounds,
        lambda r: theirs("generate", prompt=DECODE_PROMPT, max_tokens=s.tokens, **GREEDY),
        lambda r: timed_stream(ours.stream_generate(DECODE_PROMPT, max_tokens=s.tokens, **GREEDY)),
    )
    note = ""
    if pair.peer:
        p, o = pair.peer[-1], pair.ours[-1]
        note = (
            f"; greedy texts {same_text(p['text'], o['text'])} "
            f"({p['completion_tokens']} / {o['completion_tokens']} tokens)"
        )
    figure(
        s.label,
        f"1. decode, SimpleEngine, {s.tokens} tokens",
        pair,
        decode_tps,
        "tok/s",
        True,
        note,
    )

    # 2. second-turn TTFT with the first turn cached
    await bench_second_turn(s, ours, "SimpleEngine", theirs)
    await ours.stop()
    theirs.stop(
        lambda: print(f"    vllm-mlx SimpleEngine caches: {peer_cache_summary(theirs('stats'))}")
    )


async def bench_second_turn(
    s: Settings,
    ours: MLXEngine,
    kind: str,
    peer_call: Callable[..., Sample],
) -> None:
    # Each round is a new conversation (session r), the same on both sides.
    talks = Conversations(ours, s.context)

    def peer_run(r: int) -> tuple[Sample, Sample]:
        first = peer_call("chat", messages=talks.history(r), max_tokens=1, **GREEDY)
        second = peer_call("chat", messages=talks.second_turn(r), max_tokens=1, **GREEDY)
        return first, second

    async def ours_run(r: int) -> tuple[Sample, Sample]:
        first = await timed_stream(ours.stream_chat(talks.history(r), max_tokens=1, **GREEDY))
        second = await timed_stream(ours.stream_chat(talks.second_turn(r), max_tokens=1, **GREEDY))
        return first, second

    pair = await alternate(s.rounds, peer_run, ours_run)
    first, second = pair.ours[-1]
    cached = statistics.median(run[1]["cached_tokens"] or 0 for run in pair.ours)
    note = (
        f"; prompts {first['prompt_tokens']} then {second['prompt_tokens']} tokens, "
        f"ours reused {cached:.0f}"
    )
    if pair.peer:
        p_first, p_second = pair.peer[-1]
        note += f" (vllm-mlx prompts {p_first['prompt_tokens']} / {p_second['prompt_tokens']})"
    figure(
        s.label,
        f"2. 2nd-turn TTFT, {kind}, cached 1st turn",
        pair,
        lambda run: run[1]["ttft_s"],
        "ms",
        False,
        note,
        scale=1000,
    )
    if pair.peer is not None:
        figure(
            s.label,
            f"   (cold 1st turn, {kind}, for context)",
            pair,
            lambda run: run[0]["ttft_s"],
            "ms",
            False,
            scale=1000,
        )


async def bench_batched_ttft(peer: Peer, s: Settings) -> None:
    """Figure 2 on BatchedEngine against vllm-mlx BatchedEngine, prefix caches on."""
    ours = BatchedEngine(s.model, max_num_seqs=s.concurrency)
    options = {"scheduler": {"max_num_seqs": s.concurrency}}
    theirs = PeerEngine(peer, "batched_cache", "batched", s.model, options)
    await ours.start()
    await bench_second_turn(s, ours, "BatchedEngine", theirs)
    await ours.stop()
    theirs.stop(
        lambda: print(f"    vllm-mlx BatchedEngine caches: {peer_cache_summary(theirs('stats'))}")
    )


async def bench_batched_throughput(peer: Peer, s: Settings) -> None:
    """Figure 3: total tokens/s of concurrent requests, prefix caches off on both."""
    requests = [
        [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}] for i in range(s.concurrency)
    ]
    ours = BatchedEngine(
        s.model, max_num_seqs=s.concurrency, cache_memory_mb=0, load_warm_caches=False
    )
    scheduler = {"max_num_seqs": s.concurrency, "enable_prefix_cache": False}
    warmup = ("batch", {"requests": requests, "max_tokens": 8, **GREEDY})
    theirs = PeerEngine(peer, "batched", "batched", s.model, {"scheduler": scheduler}, warmup)
    await ours.start()
    await ours_batch(ours, requests, 8)  # warm up outside the timings

    def peer_run(r: int) -> Sample:
        return theirs("batch", requests=requests, max_tokens=s.batch_tokens, **GREEDY)

    pair = await alternate(s.rounds, peer_run, lambda r: ours_batch(ours, requests, s.batch_tokens))

    def total_tps(run: Sample) -> float:
        return sum(o["completion_tokens"] for o in run["outputs"]) / run["wall_s"]

    note = ""
    if pair.peer:
        p, o = pair.peer[-1]["outputs"], pair.ours[-1]["outputs"]
        same = sum(a["text"] == b["text"] for a, b in zip(p, o, strict=True))
        p_tok = sum(x["completion_tokens"] for x in p)
        o_tok = sum(x["completion_tokens"] for x in o)
        note = f"; greedy texts identical {same}/{len(p)} ({p_tok} / {o_tok} tokens)"
    figure(
        s.label,
        f"3. {s.concurrency} concurrent x {s.batch_tokens} tokens, BatchedEngine",
        pair,
        total_tps,
        "tok/s",
        True,
        note,
    )
    steps = ours.get_stats()
    await ours.stop()
    line = [f"    ours: mean decode batch {steps['mean_batch_size']:.2f}"]

    def peer_steps() -> None:
        done = theirs("stats")["stats"].get("steps_executed")
        line.append(f"; vllm-mlx: {done} scheduler steps in all")

    theirs.stop(peer_steps)
    print("".join(line))


async def bench_model(peer: Peer, s: Settings, levels: list[int], only_batched: bool) -> None:
    if not only_batched:
        await bench_simple(peer, s)
        await bench_batched_ttft(peer, replace(s, concurrency=max(levels)))
    for level in levels:
        await bench_batched_throughput(peer, replace(s, concurrency=level))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-python", default=DEFAULT_PEER_PYTHON)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128, help="decode tokens (figure 1)")
    parser.add_argument("--batch-tokens", type=int, default=128, help="per request (figure 3)")
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[8], help="levels of figure 3"
    )
    parser.add_argument("--only-batched", action="store_true", help="figure 3 alone")
    parser.add_argument("--context", type=int, default=1500, help="first-turn tokens (fig. 2)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument(
        "--smollm", action="store_true", help="also SmolLM2-135M-Instruct (fewer rounds, tokens)"
    )
    parser.add_argument("--peer-timeout", type=float, default=900, help="seconds per command")
    args = parser.parse_args()
    if not Path(args.peer_python).exists():
        print(SETUP, file=sys.stderr)
        sys.exit(2)

    from tests.support.tiny_models import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        peer = Peer(args.peer_python, Path(tmp) / "vllm-mlx-worker.log", args.peer_timeout)
        try:
            peer.start()
        except PeerError as exc:
            print(f"vllm-mlx does not start under {args.peer_python}: {exc}", file=sys.stderr)
            print(exc.detail or peer.log_tail(), file=sys.stderr)
            print(SETUP, file=sys.stderr)
            sys.exit(2)
        try:
            pv = peer.info["versions"]
            print(
                f"ours:     mlx {version('mlx')}, mlx-lm {version('mlx-lm')}, "
                f"BLAS {preload_cpu_blas()}, Python {sys.version.split()[0]}"
            )
            print(
                f"vllm-mlx: {pv['vllm-mlx']}, mlx {pv['mlx']}, mlx-lm {pv['mlx-lm']}, "
                f"BLAS {peer.info['blas']}, Python {peer.info['python']}"
            )
            print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
            tiny = build_tiny_model(
                Path(tmp) / "tiny",
                hidden_size=args.hidden,
                num_hidden_layers=args.layers,
                num_attention_heads=8,
                num_key_value_heads=4,
            )
            models = [
                Settings(
                    f"[tiny h{args.hidden}]",
                    tiny,
                    args.rounds,
                    args.tokens,
                    args.batch_tokens,
                    0,
                    args.context,
                )
            ]
            if args.smollm:
                from tests.support.smollm import ensure_smollm2

                models.append(
                    Settings(
                        "[SmolLM2-135M]",
                        ensure_smollm2(),
                        max(3, args.rounds // 2 + 1),
                        min(args.tokens, 64),
                        min(args.batch_tokens, 64),
                        0,
                        args.context,
                    )
                )
            print("medians of alternated rounds; ratios are ours / vllm-mlx\n")
            for settings in models:
                asyncio.run(bench_model(peer, settings, args.concurrency, args.only_batched))
            print(f"load average at end: {os.getloadavg()[0]:.2f}")
        finally:
            peer.close()


if __name__ == "__main__":
    main()
