"""DistributedEngine over 2 and 3 local ranks against one process, on SmolLM2-135M.

1. Decode tokens/s of ``DistributedEngine`` (tensor parallel, ranks started by
   ``mlx_integrations.engine.distributed.launch``) divided by ``SimpleEngine`` in one process, both
   timed in rank 0's process, alternating (distributed, single, ...), medians compared.
   On one machine the ranks share its cores and add collectives, so the ratio is below
   1: the figure is the overhead, the point is a model larger than one machine.
   SmolLM2's 9 heads do not split in 2: the 2-rank run uses a random model of its
   width, depth and FFN with 8 heads (and a 512-token vocabulary).
2. Collective time per token: ``collective_s_per_token`` (rank 0 sharing each sampled
   token, waiting for the slowest rank included), and one ``all_sum`` of a hidden-size
   vector (two per layer in a tensor-parallel forward pass) timed on its own.

Run: python bench/bench_distributed.py [--model PATH] [--rounds 3] [--tokens 32]
[--ranks 2 3]
(without --model it converts SmolLM2 as the tests do, into their cache).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx_integrations  # noqa: F401  (preloads OpenBLAS before mlx)

PROMPT = "Write a short story about a lighthouse keeper."


async def decode_tps(engine, tokens: int) -> float:
    """Decode tokens/s of one greedy reply, as the engine measures it (first token on)."""
    messages = [{"role": "user", "content": PROMPT}]
    # The end tokens never win: every reply runs to ``tokens`` (a random model's would not).
    never = {t: -1e9 for t in engine.tokenizer.eos_token_ids}
    stream = engine.stream_chat(messages, max_tokens=tokens, temperature=0.0, logit_bias=never)
    out = None
    async for out in stream:  # noqa: B007
        pass
    assert out is not None and out.completion_tokens == tokens, out
    return float(out.generation_tps)


def rank0(model: str, rounds: int, tokens: int) -> None:
    """Rank 0's side: both engines in this process, alternating."""
    from mlx_integrations.engine import DistributedEngine, SimpleEngine

    dist = DistributedEngine(model, rank_timeout=120)
    single = SimpleEngine(model, cache_memory_mb=0)
    asyncio.run(decode_tps(dist, 4))  # load and warm both
    asyncio.run(decode_tps(single, 4))
    dist_tps, single_tps = [], []
    for _ in range(rounds):
        dist_tps.append(asyncio.run(decode_tps(dist, tokens)))
        single_tps.append(asyncio.run(decode_tps(single, tokens)))
    stats = dist.get_stats()
    print(
        json.dumps(
            {
                "ranks": stats["world_size"],
                "distributed_tps": statistics.median(dist_tps),
                "single_tps": statistics.median(single_tps),
                "ratio": statistics.median(
                    d / s for d, s in zip(dist_tps, single_tps, strict=True)
                ),
                "collective_s_per_token": stats["collective_s_per_token"],
            }
        ),
        flush=True,
    )
    asyncio.run(single.stop())
    asyncio.run(dist.stop())


def allsum_rank(hidden: int, count: int) -> None:
    """Every rank: time ``count`` all_sums of a (1, 1, hidden) float32 vector."""
    import mlx.core as mx

    group = mx.distributed.init(strict=True, backend="ring")
    x = mx.ones((1, 1, hidden))
    for _ in range(20):
        mx.eval(mx.distributed.all_sum(x, group=group))
    start = time.perf_counter()
    for _ in range(count):
        mx.eval(mx.distributed.all_sum(x, group=group))
    if group.rank() == 0:
        print(json.dumps({"allsum_s": (time.perf_counter() - start) / count}), flush=True)


def time_allsum(ranks: int, hidden: int) -> float:
    """One all_sum's seconds over ``ranks`` local processes (MLX's ring variables)."""
    from mlx_integrations.engine.distributed.launch import free_ports

    with tempfile.TemporaryDirectory() as tmp:
        hostfile = Path(tmp) / "hosts.json"
        hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(ranks)]))
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--allsum", str(hidden)],
                env={**os.environ, "MLX_RANK": str(r), "MLX_HOSTFILE": str(hostfile)},
                stdout=subprocess.PIPE,
                text=True,
            )
            for r in range(ranks)
        ]
        outs = [p.communicate(timeout=300)[0] for p in procs]
    return float(json.loads(outs[0].strip().splitlines()[-1])["allsum_s"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--rank0", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--allsum", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.allsum:
        allsum_rank(args.allsum, 200)
        return
    if args.model is None:
        from tests.support.smollm import ensure_smollm2

        args.model = str(ensure_smollm2())
    if args.rank0:
        rank0(args.model, args.rounds, args.tokens)
        return

    from mlx_integrations.engine.distributed.launch import launch

    with tempfile.TemporaryDirectory() as tmp:
        for ranks in args.ranks:
            model = args.model
            config = json.loads((Path(model) / "config.json").read_text())
            if config["num_attention_heads"] % ranks or config["num_key_value_heads"] % ranks:
                model = str(shaped_like(config, ranks, Path(tmp) / f"shaped-{ranks}"))
                print(
                    f"{ranks} ranks: {config['num_attention_heads']} heads do not divide by "
                    f"{ranks}; a random model of the same shape with "
                    f"{json.loads((Path(model) / 'config.json').read_text())['num_attention_heads']}"
                    " heads instead",
                    flush=True,
                )
            command = [__file__, "--rank0", "--model", model]
            command += ["--rounds", str(args.rounds), "--tokens", str(args.tokens)]
            result = launch(command, num_ranks=ranks, rank_timeout=120)
            if result.exit_code:
                sys.exit(f"{ranks} ranks failed: {result.failure}")
            hidden, layers = config["hidden_size"], config["num_hidden_layers"]
            allsum = time_allsum(ranks, hidden)
            print(
                f"{ranks} ranks: one all_sum of {hidden} floats {allsum * 1e6:.0f} us, "
                f"x {2 * layers} per token = {2 * layers * allsum * 1e3:.1f} ms/token",
                flush=True,
            )


def shaped_like(config: dict, ranks: int, out: Path) -> Path:
    """A random model of ``config``'s width, depth and FFN whose heads divide by ``ranks``."""
    from tests.support.tiny_models import build_tiny_model

    heads = config["num_attention_heads"] // ranks * ranks
    return build_tiny_model(
        out,
        hidden_size=config["hidden_size"],
        num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=ranks * max(1, config["num_key_value_heads"] // ranks),
        intermediate_size=config["intermediate_size"],
        tie_word_embeddings=False,
    )


if __name__ == "__main__":
    main()
