"""``mlxi serve`` against ``mlx_lm.server`` and vllm-mlx's server, under the same client load.

Each server runs as its own process on 127.0.0.1, serving the same model folder; all
are started first, then measured one after the other at each concurrency, the order
rotating from level to level, so load from other processes falls on every server alike.
The client (this process, httpx) sends streaming chat completions
(``stream_options.include_usage``) with the model's end tokens banned by ``logit_bias``,
so every reply is ``--tokens`` long on every server. At each concurrency c:

1. ``c`` conversations start together; each sends ``--rounds`` first turns one after
   the other (a new question each). Aggregate tokens/s = completion tokens of all
   replies / the wall time of the phase (higher is better); TTFT = from sending a
   request to its first text, p50 and p99 over the phase (lower is better).
2. Each conversation then sends a second turn that extends its last first turn (the
   question, the reply, a follow-up): the TTFT of that turn shows whether the server
   reused the prefix it had just computed.

Ratios are ours/peer for tokens/s and peer/ours for TTFT, so > 1.0 is ours ahead.

Peers:

- ``mlx_lm.server`` (mlx-lm, this virtualenv; it batches up to 32 requests); its
  ``/v1/models`` needs ``~/.cache/huggingface/hub`` to exist, which this script makes.
- vllm-mlx 0.6.0 (``vllm-mlx serve --continuous-batching``), from its own virtualenv
  (it pins mlx-lm < 0.32; its full dependency set pulls torch, gradio and opencv, which
  its server does not need)::

      python3.11 -m venv /tmp/vllm-venv
      /tmp/vllm-venv/bin/pip install --no-deps "vllm-mlx==0.6.0"
      /tmp/vllm-venv/bin/pip install "mlx[cpu]==0.32.4" "mlx-lm>=0.31.3,<0.32" \\
          "transformers==5.24.0" "tokenizers==0.23.3" jsonschema requests psutil \\
          fastapi uvicorn "starlette>=1.0.1" prometheus-client pyyaml pillow tqdm \\
          tabulate llguidance pytz

Run: ``.venv/bin/python bench/bench_serve.py [--smollm] [--concurrency 1 4 8 16 32]
[--tokens 64] [--rounds 2] [--peers mlx_lm vllm_mlx] [--json FILE] [--plot FILE.png]``.
A peer that fails to start is reported and left out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import QUESTIONS, percentile, save

DEFAULT_PEER_PYTHON = "/tmp/vllm-venv/bin/python"
FOLLOW_UP = "Thank you. Now say it again, in other words."


@dataclass
class Server:
    """One server process and how to talk to it."""

    name: str
    command: list[str]
    model_id: str
    port: int
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, log_dir: Path, timeout: float) -> None:
        self.log = log_dir / (re.sub(r"[^A-Za-z0-9._-]+", "_", self.name) + ".log")
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}")
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not answer within {timeout:.0f} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def end_token_bias(model: Path) -> dict[str, float]:
    """A logit_bias banning the model's end tokens (from tokenizer.json and config)."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        try:
            value = json.loads((model / name).read_text()).get("eos_token_id")
        except (OSError, ValueError):
            continue
        ids.update([value] if isinstance(value, int) else value or [])
    added = json.loads((model / "tokenizer.json").read_text()).get("added_tokens", [])
    ends = {"<|endoftext|>", "<|im_end|>", "</s>", "<|eot_id|>", "<|end|>"}
    ids.update(t["id"] for t in added if t["content"] in ends)
    return {str(i): -100.0 for i in sorted(ids)}


# ------------------------------------------------------------------ the client


@dataclass
class Reply:
    ttft: float
    tokens: int
    text: str


async def chat(
    client: httpx.AsyncClient,
    server: Server,
    messages: list[dict[str, str]],
    tokens: int,
    bias: dict[str, float],
) -> Reply:
    """One streamed chat completion: time to first text, completion tokens, the text."""
    body = {
        "model": server.model_id,
        "messages": messages,
        "max_tokens": tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logit_bias": bias,
    }
    for attempt in range(3):
        try:
            return await _chat_once(client, server, body)
        except (httpx.ReadError, httpx.RemoteProtocolError):
            # A kept-alive connection the server had closed as idle: send it again.
            if attempt == 2:
                raise
            RETRIES[server.name] = RETRIES.get(server.name, 0) + 1
    raise AssertionError("unreachable")


RETRIES: dict[str, int] = {}


async def _chat_once(client: httpx.AsyncClient, server: Server, body: dict[str, Any]) -> Reply:
    start = time.perf_counter()
    first = None
    text = []
    counted = 0
    usage = None
    try:
        async with client.stream(
            "POST", f"{server.url}/v1/chat/completions", json=body
        ) as response:
            if response.status_code != 200:
                raise RuntimeError(
                    f"{server.name}: HTTP {response.status_code} {await response.aread()!r}"
                )
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content") or ""
                    if piece:
                        if first is None:
                            first = time.perf_counter() - start
                        text.append(piece)
                        counted += 1
    except httpx.HTTPError as exc:
        if first is not None:  # cut mid-reply: not a stale connection, not sent again
            raise RuntimeError(f"{server.name}: the stream broke: {exc!r}") from exc
        raise
    if first is None:
        raise RuntimeError(f"{server.name} sent no text")
    return Reply(first, int(usage["completion_tokens"]) if usage else counted, "".join(text))


async def level(
    server: Server, c: int, rounds: int, tokens: int, bias: dict[str, float]
) -> dict[str, Any]:
    """Phase 1 (first turns) and phase 2 (second turns) at concurrency ``c``."""
    limits = httpx.Limits(max_connections=c + 4, max_keepalive_connections=c + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        histories: list[list[dict[str, str]]] = [[] for _ in range(c)]

        async def conversation(i: int) -> list[Reply]:
            replies = []
            for r in range(rounds):
                question = f"{QUESTIONS[(i + r * c) % len(QUESTIONS)]} (#{i}.{r}.{c})"
                messages = [{"role": "user", "content": question}]
                reply = await chat(client, server, messages, tokens, bias)
                replies.append(reply)
                histories[i] = [*messages, {"role": "assistant", "content": reply.text}]
            return replies

        start = time.perf_counter()
        first = [r for rs in await asyncio.gather(*(conversation(i) for i in range(c))) for r in rs]
        wall = time.perf_counter() - start
        second = await asyncio.gather(
            *(
                chat(client, server, [*h, {"role": "user", "content": FOLLOW_UP}], tokens, bias)
                for h in histories
            )
        )
    return {
        "tokens_per_s": sum(r.tokens for r in first) / wall,
        "ttft_p50": percentile([r.ttft for r in first], 50),
        "ttft_p99": percentile([r.ttft for r in first], 99),
        "turn2_ttft_p50": percentile([r.ttft for r in second], 50),
        "turn2_ttft_p99": percentile([r.ttft for r in second], 99),
        "tokens_each": sorted({r.tokens for r in first}),
    }


# --------------------------------------------------------------------- run


def servers(
    model: Path, peers: list[str], peer_python: str, variants: list[str] | None = None
) -> list[Server]:
    """``mlxi serve``, then one more ``mlxi serve`` per variant (its extra arguments, as
    one shell-quoted string), then the peers."""
    import shlex

    python = sys.executable
    made = [
        Server(
            "mlxi serve" + (f" {extra}" if extra else ""),
            [
                python,
                "-m",
                "mlx_integrations.cli",
                "serve",
                str(model),
                *shlex.split(extra),
                "--log-level",
                "warning",
                "--port",
            ],
            str(model),
            free_port(),
        )
        for extra in ["", *(variants or [])]
    ]
    if "mlx_lm" in peers:
        Path("~/.cache/huggingface/hub").expanduser().mkdir(parents=True, exist_ok=True)
        made.append(
            Server(
                "mlx_lm.server",
                [
                    python,
                    "-m",
                    "mlx_lm",
                    "server",
                    "--model",
                    str(model),
                    "--log-level",
                    "WARNING",
                    "--port",
                ],
                str(model),
                free_port(),
            )
        )
    if "vllm_mlx" in peers:
        made.append(
            Server(
                "vllm-mlx",
                [
                    peer_python,
                    "-m",
                    "vllm_mlx.cli",
                    "serve",
                    str(model),
                    "--continuous-batching",
                    "--served-model-name",
                    "bench",
                    "--port",
                ],
                "bench",
                free_port(),
                env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
            )
        )
    for server in made:
        server.command.append(str(server.port))
    return made


def plot(results: dict[str, dict[int, dict[str, Any]]], path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib is not installed: no plot)")
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name, by_c in results.items():
        levels = sorted(by_c)
        axes[0].plot(levels, [by_c[c]["tokens_per_s"] for c in levels], marker="o", label=name)
        axes[1].plot(levels, [by_c[c]["ttft_p99"] * 1000 for c in levels], marker="o", label=name)
        axes[2].plot(
            levels, [by_c[c]["turn2_ttft_p50"] * 1000 for c in levels], marker="o", label=name
        )
    for ax, label in zip(
        axes, ("aggregate tokens/s", "TTFT p99 (ms)", "second-turn TTFT p50 (ms)"), strict=True
    ):
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--smollm", action="store_true", help="SmolLM2-135M-Instruct instead of the tiny model."
    )
    parser.add_argument("--model", type=Path, help="Another model folder.")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    parser.add_argument("--tokens", type=int, default=64, help="Tokens per reply.")
    parser.add_argument("--rounds", type=int, default=2, help="First turns per conversation.")
    parser.add_argument("--peers", nargs="*", default=["mlx_lm", "vllm_mlx"])
    parser.add_argument("--peer-python", default=DEFAULT_PEER_PYTHON)
    parser.add_argument(
        "--variants",
        nargs="*",
        default=[],
        help="Another mlxi serve for each: its extra arguments, e.g. '--max-num-seqs 32'.",
    )
    parser.add_argument("--plot", type=Path, help="Write a plot (PNG) here.")
    parser.add_argument("--json", type=Path, help="Write the figures here.")
    args = parser.parse_args()
    if len(set(args.variants)) != len(args.variants) or "" in args.variants:
        parser.error(f"--variants must be distinct and non-empty, got {args.variants}")

    if args.model is not None:
        model, title = args.model, args.model.name
    elif args.smollm:
        from tests.support.smollm import ensure_smollm2

        model, title = ensure_smollm2(), "SmolLM2-135M-Instruct"
    else:
        from tests.support.tiny_models import build_tiny_model, cached_build

        model = cached_build(
            "bench-serve-tiny",
            build_tiny_model,
            [Path(__file__)],
            hidden_size=256,
            num_hidden_layers=4,
        )
        title = "tiny random Llama (hidden 256, 4 layers)"
    bias = end_token_bias(model)
    if "vllm_mlx" in args.peers and not Path(args.peer_python).exists():
        print(f"vllm-mlx left out: {args.peer_python} does not exist (see the docstring)")
        args.peers = [p for p in args.peers if p != "vllm_mlx"]
    log_dir = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    running = []
    for server in servers(model, args.peers, args.peer_python, args.variants):
        try:
            server.start(log_dir, timeout=300)
            asyncio.run(
                chat(
                    httpx.AsyncClient(timeout=600),
                    server,
                    [{"role": "user", "content": "Hi"}],
                    8,
                    bias,
                )
            )
            running.append(server)
            print(f"{server.name} ready at {server.url}", flush=True)
        except Exception as exc:  # a peer that fails is reported, the rest go on
            print(f"{server.name} left out: {exc} (log: {server.log})")
            server.stop()
    if not running or running[0].name != "mlxi serve":
        sys.exit("mlxi serve did not start")
    results: dict[str, dict[int, dict[str, Any]]] = {s.name: {} for s in running}
    try:
        for k, c in enumerate(args.concurrency):
            order = running[k % len(running) :] + running[: k % len(running)]
            for server in order:
                try:
                    results[server.name][c] = r = asyncio.run(
                        level(server, c, args.rounds, args.tokens, bias)
                    )
                    print(
                        f"  {server.name} c={c}: {r['tokens_per_s']:.1f} tok/s, TTFT p50 "
                        f"{r['ttft_p50'] * 1000:.0f} ms, p99 {r['ttft_p99'] * 1000:.0f} ms, "
                        f"turn 2 p50 {r['turn2_ttft_p50'] * 1000:.0f} ms",
                        flush=True,
                    )
                except Exception as exc:  # reported; the other figures go on
                    print(f"{server.name} at c={c} failed: {type(exc).__name__}: {exc}")
    finally:
        for server in running:
            server.stop()
    print(f"\n{title}: {args.tokens} tokens a reply, {args.rounds} first turns per client, greedy")
    header = f"{'server':15} {'c':>3} {'tok/s':>8} {'TTFT p50':>9} {'p99':>8} {'turn-2 p50':>10} {'p99':>8}"
    print(header)
    for name, by_c in results.items():
        for c, r in sorted(by_c.items()):
            print(
                f"{name:15} {c:>3} {r['tokens_per_s']:8.1f} {r['ttft_p50'] * 1000:8.1f}ms "
                f"{r['ttft_p99'] * 1000:6.1f}ms {r['turn2_ttft_p50'] * 1000:8.1f}ms "
                f"{r['turn2_ttft_p99'] * 1000:6.1f}ms  tokens/reply {r['tokens_each']}"
            )
    if RETRIES:
        print(f"requests sent again after a closed idle connection: {RETRIES}")
    ours = results["mlxi serve"]
    for name, by_c in results.items():
        if name == "mlxi serve":
            continue
        print(f"\nmlxi serve / {name} (> 1.0: ours ahead)")
        print(f"{'c':>3} {'tok/s':>7} {'TTFT p50':>9} {'TTFT p99':>9} {'turn-2 p50':>10}")
        for c in sorted(set(by_c) & set(ours)):
            a, b = ours[c], by_c[c]
            print(
                f"{c:>3} {a['tokens_per_s'] / b['tokens_per_s']:7.2f} {b['ttft_p50'] / a['ttft_p50']:9.2f} "
                f"{b['ttft_p99'] / a['ttft_p99']:9.2f} {b['turn2_ttft_p50'] / a['turn2_ttft_p50']:10.2f}"
            )
    figures: dict[str, Any] = {"model": title, "tokens": args.tokens, "results": results}
    figures["ratios"] = {
        f"mlxi serve / {name}": {
            c: {
                "tokens_per_s": ours[c]["tokens_per_s"] / by_c[c]["tokens_per_s"],
                "ttft_p50": by_c[c]["ttft_p50"] / ours[c]["ttft_p50"],
                "turn2_ttft_p50": by_c[c]["turn2_ttft_p50"] / ours[c]["turn2_ttft_p50"],
            }
            for c in sorted(set(by_c) & set(ours))
        }
        for name, by_c in results.items()
        if name != "mlxi serve"
    }
    save(args.json, "bench_serve", figures)
    if args.plot is not None:
        plot(results, args.plot, f"{title}, {args.tokens} tokens a reply")


if __name__ == "__main__":
    main()
