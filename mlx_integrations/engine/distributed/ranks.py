"""The ranks of a distributed engine: joining the group, sharing work, following rank 0.

Every rank runs the same generation loop, since each forward pass of a sharded model
holds collectives that all ranks must join. Rank 0 (the :class:`DistributedEngine`
serving callers) decides: it shares each request, then each sampled token together
with whether to go on, and the others follow. ``mx.distributed`` has no broadcast, so
rank 0 shares a message as an ``all_sum`` in which every other rank adds zeros.

``python -m mlx_integrations.engine.distributed.ranks`` is the program ``mlxi launch`` runs on
ranks 1 and above: it joins the group, loads the model rank 0 names, and follows.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mlx_integrations.engine.decoding import prefill as feed
from mlx_integrations.engine.distributed.control import ControlClient, ControlServer, listen
from mlx_integrations.engine.stats import memory_stats

Parallel = Literal["tensor", "pipeline"]

ENV_CONTROL = "MLXI_CONTROL"
"""``host:port`` where rank 0 listens for the other ranks (set by ``mlxi launch``)."""
ENV_WORLD_SIZE = "MLXI_WORLD_SIZE"
ENV_BACKEND = "MLXI_BACKEND"
ENV_RANK_TIMEOUT = "MLXI_RANK_TIMEOUT"
ENV_START_TIMEOUT = "MLXI_START_TIMEOUT"
DEFAULT_RANK_TIMEOUT = 30.0
DEFAULT_START_TIMEOUT = 120.0


@dataclass(frozen=True)
class RankEnv:
    """Where this process stands in the group, read from the environment."""

    rank: int
    world_size: int
    backend: str
    leader_host: str
    """Rank 0's address for the side channel."""
    control_port: int | None
    """Rank 0's side-channel port when the launcher chose it; None: rank 0 picks one."""


def rank_env(environ: dict[str, str] | None = None) -> RankEnv:
    """Read the rank, the group size and rank 0's address (ring or MPI variables)."""
    env = dict(os.environ if environ is None else environ)
    rank = int(env.get("MLX_RANK") or env.get("OMPI_COMM_WORLD_RANK") or env.get("PMI_RANK") or 0)
    hosts: list[Any] = []
    if env.get("MLX_HOSTFILE"):
        hosts = json.loads(Path(env["MLX_HOSTFILE"]).read_text())
    size = int(env.get(ENV_WORLD_SIZE) or env.get("OMPI_COMM_WORLD_SIZE") or len(hosts) or 1)
    backend = env.get(ENV_BACKEND) or (
        "ring" if hosts else "mpi" if "OMPI_COMM_WORLD_SIZE" in env else "any"
    )
    leader, port = "127.0.0.1", None
    if hosts:
        leader = str(hosts[0][0]).rsplit(":", 1)[0]
    if env.get(ENV_CONTROL):
        host, _, text = env[ENV_CONTROL].rpartition(":")
        leader, port = host or leader, int(text)
    return RankEnv(rank, size, backend, leader, port)


def launched_ranks() -> int:
    """The number of ranks when ``mlxi launch`` started this process, else 0."""
    if ENV_CONTROL not in os.environ:
        return 0
    return int(os.environ.get(ENV_WORLD_SIZE) or 0)


def positive_seconds(name: str, value: Any) -> float:
    """``value`` as seconds: a finite number above 0 (a bool is no number).

    Raises:
        ValueError: Naming ``name`` and the value.
    """
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from the environment, or ``default``."""
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan  # refused below, with the variable's name
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {text!r}")
    return value


class RankGroup:
    """An ``mx.distributed`` group and this rank's side channel to the others."""

    def __init__(
        self,
        group: Any,
        server: ControlServer | None = None,
        client: ControlClient | None = None,
    ):
        self.group = group
        self.rank: int = group.rank()
        self.size: int = group.size()
        self.server = server
        self.client = client
        self.collective_s = 0.0
        """Seconds rank 0 spent sharing tokens (waiting for the others included)."""
        self.steps = 0

    def _sum(self, values: Any) -> Any:
        import mlx.core as mx

        out = mx.distributed.all_sum(mx.array(values), group=self.group, stream=mx.cpu)
        mx.eval(out)
        return out

    def share(self, message: dict[str, Any] | None) -> dict[str, Any]:
        """Rank 0's ``message`` on every rank (the others pass None)."""
        import numpy as np

        if self.server is not None:
            self.server.send_all({"op": "work"})
        elif self.client is not None:
            self.client.wait_work()
        data = json.dumps(message).encode() if self.rank == 0 else b""
        length = int(self._sum(np.array([len(data)], dtype=np.int32)).item())
        payload = np.zeros(length, dtype=np.uint8)
        if self.rank == 0:
            payload[:] = np.frombuffer(data, dtype=np.uint8)
        shared: dict[str, Any] = json.loads(bytes(memoryview(self._sum(payload))))
        return shared

    def share_step(self, token: int, go: bool) -> tuple[int, bool]:
        """Rank 0's sampled token and whether to feed it back, on every rank."""
        import numpy as np

        started = time.perf_counter()
        mine = [token, int(go)] if self.rank == 0 else [0, 0]
        shared = self._sum(np.array(mine, dtype=np.int32)).tolist()
        self.collective_s += time.perf_counter() - started
        self.steps += 1
        return int(shared[0]), bool(shared[1])

    def gather(self, values: list[float]) -> list[list[float]]:
        """Each rank's ``values`` (same length everywhere), on every rank, by rank."""
        import numpy as np

        width = len(values)
        mine = np.zeros(self.size * width, dtype=np.float64)
        mine[self.rank * width : (self.rank + 1) * width] = values
        flat = self._sum(mine.astype(np.float32)).tolist()
        return [flat[r * width : (r + 1) * width] for r in range(self.size)]


def _init_group(env: RankEnv) -> Any:
    import mlx.core as mx

    if env.world_size <= 1:
        return mx.distributed.init()
    return mx.distributed.init(strict=True, backend=env.backend)


def join_as_leader(
    env: RankEnv,
    *,
    rank_timeout: float,
    start_timeout: float,
    on_failure: Callable[[str], None],
    stalled: Callable[[], float | None],
) -> RankGroup:
    """Form the group as rank 0 and accept every other rank's side channel.

    Raises:
        TimeoutError: A rank did not connect within ``start_timeout``.
    """

    def server(sock: Any, size: int) -> ControlServer:
        return ControlServer(sock, size, rank_timeout, on_failure, stalled)

    if env.control_port is not None:  # started by mlxi launch: channels first, then MLX
        control = server(listen(env.leader_host, env.control_port), env.world_size)
        try:
            control.accept_all(start_timeout)
            control.send_all({"op": "go"})
            group = RankGroup(_init_group(env), server=control)
        except BaseException as exc:
            control.close(1, f"rank 0 could not form the group: {exc}")
            raise
        control.start()
        return group
    group = RankGroup(_init_group(env))
    if group.size > 1:
        sock = listen(env.leader_host)
        control = server(sock, group.size)
        group._sum([control.address[1]])  # every rank learns the port
        try:
            control.accept_all(start_timeout)
        except BaseException as exc:
            control.close(1, f"rank 0 could not form the group: {exc}")
            raise
        control.start()
        control.send_all({"op": "go"})  # rank 0 beats now: the others count its silence
        group.server = control
    return group


def join_as_follower(env: RankEnv, *, rank_timeout: float, start_timeout: float) -> RankGroup:
    """Join rank 0's group; the side channel starts heartbeats at once, and counts
    rank 0's silence once the group is formed (see :meth:`ControlClient.arm`)."""
    if env.control_port is not None:
        client = ControlClient.connect(
            env.leader_host, env.control_port, env.rank, rank_timeout, start_timeout
        )
        client.start(_rank_stats)
        client.wait_go(start_timeout)
        group = RankGroup(_init_group(env), client=client)
    else:
        group = RankGroup(_init_group(env))
        port = int(group._sum([0]).item())
        client = ControlClient.connect(env.leader_host, port, env.rank, rank_timeout, start_timeout)
        client.start(_rank_stats)
        client.wait_go(start_timeout)
        group.client = client
    client.arm()
    global _steps_of
    _steps_of = group
    return group


_steps_of: RankGroup | None = None


def _rank_stats() -> dict[str, Any]:
    stats: dict[str, Any] = dict(memory_stats())
    stats["steps"] = _steps_of.steps if _steps_of is not None else 0
    return stats


# ------------------------------------------------------------------- model shards


def check_tensor_split(config: dict[str, Any], ranks: int, name: str) -> None:
    """Raise ValueError unless heads, KV heads and FFN width divide by ``ranks``."""
    section = config.get("text_config") or config
    heads = section.get("num_attention_heads")
    sizes = {
        "attention heads": heads,
        "KV heads": section.get("num_key_value_heads") or heads,
        "FFN width (intermediate_size)": section.get("intermediate_size"),
    }
    known = {label: int(v) for label, v in sizes.items() if isinstance(v, int) and v > 0}
    bad = {label: v for label, v in known.items() if v % ranks}
    if not bad:
        return
    common = math.gcd(*known.values())
    fits = [str(n) for n in range(2, common + 1) if common % n == 0]
    described = ", ".join(f"{v} {label}" for label, v in known.items())
    raise ValueError(
        f"{name!r} cannot be split over {ranks} ranks by tensor parallelism: it has "
        f"{described}, and {', '.join(f'{v} {label}' for label, v in bad.items())} do "
        f"not divide by {ranks}; use a rank count that divides them all "
        f"({', '.join(fits) if fits else 'none above 1'}), or parallel='pipeline' where "
        "the model supports it"
    )


def load_shard(path: Path, group: Any, parallel: Parallel) -> tuple[Any, Any]:
    """Load this rank's part of the model (only its weights are read) and the tokenizer.

    Raises:
        ValueError: The model has no ``shard`` (tensor) or ``pipeline`` method, or it
            has fewer layers than there are ranks.
    """
    import mlx.core as mx
    import mlx_lm

    loaded = mlx_lm.load(str(path), lazy=True)
    model, tokenizer = loaded[0], loaded[1]
    size = group.size()
    if parallel == "tensor":
        if not hasattr(model, "shard"):
            raise ValueError(
                f"{path.name}: this model type has no tensor-parallel split in mlx-lm; "
                "try parallel='pipeline'"
            )
        if size > 1:
            model.shard(group)
    else:
        inner: Any = getattr(model, "model", None)
        if not hasattr(inner, "pipeline"):
            raise ValueError(
                f"{path.name}: this model type has no pipeline split in mlx-lm; "
                "try parallel='tensor'"
            )
        layers = len(inner.layers)
        if layers < size:
            raise ValueError(
                f"{path.name} has {layers} layers, fewer than the {size} ranks; use "
                f"at most {layers} ranks"
            )
        if size > 1:
            inner.pipeline(group)
    mx.eval(model.parameters())
    return model, tokenizer


def prefill(model: Any, tokens: list[int], cache: list[Any], step: int) -> Any:
    """Run all but the last prompt token through the model, ``step`` at a time.

    Returns:
        The last token, as the input of the first decode step.
    """
    import mlx.core as mx

    feed(model, cache, tokens[:-1], step)
    return mx.array(tokens[-1:])


def next_logits(model: Any, y: Any, cache: list[Any]) -> Any:
    """The logits of the token after ``y`` (one decode step)."""
    return model(y[None], cache=cache)[:, -1, :]


# ---------------------------------------------------------------------- followers


def follow(group: RankGroup) -> int:
    """Serve rank 0 until it stops; return the process exit code."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    model: Any = None
    while True:
        message = group.share(None)
        op = message.get("op")
        if op == "load":
            failed = 0.0
            try:
                model, _ = load_shard(Path(message["path"]), group.group, message["parallel"])
            except Exception as exc:  # told to rank 0, which raises it to its caller
                failed = 1.0
                if group.client is not None:
                    group.client.send({"error": f"could not load the model: {exc}"})
            # A failed load anywhere: rank 0 orders the exit next (it names the cause;
            # leaving now would read as a lost rank there).
            group.gather([failed])
        elif op == "generate":
            cache = make_prompt_cache(model)
            y = prefill(model, message["tokens"], cache, int(message["prefill_step_size"]))
            while True:
                mx.eval(next_logits(model, y, cache))
                token, go = group.share_step(0, False)
                if not go:
                    break
                y = mx.array([token])
            del cache
        elif op == "clear":
            before = mx.get_cache_memory()
            mx.clear_cache()
            group.gather([float(before - mx.get_cache_memory())])
        elif op == "exit":
            reason = message.get("reason")
            if reason:
                print(f"rank {group.rank}: {reason}", file=sys.stderr, flush=True)
            return int(message.get("code", 0))
        else:
            print(f"rank {group.rank}: unknown order {op!r}; exiting", file=sys.stderr)
            return 1


def serve_follower(
    env: RankEnv, *, rank_timeout: float | None = None, start_timeout: float | None = None
) -> None:
    """Join the group as a follower, follow rank 0, then end the process.

    The timeouts default to ``$MLXI_RANK_TIMEOUT`` and ``$MLXI_START_TIMEOUT``.
    """
    group = join_as_follower(
        env,
        rank_timeout=rank_timeout or env_seconds(ENV_RANK_TIMEOUT, DEFAULT_RANK_TIMEOUT),
        start_timeout=start_timeout or env_seconds(ENV_START_TIMEOUT, DEFAULT_START_TIMEOUT),
    )
    try:
        code = follow(group)
    except Exception as exc:  # a collective that lost a peer, mostly
        print(f"rank {env.rank}: {exc}", file=sys.stderr, flush=True)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # threads may still be inside collectives or sockets


def main() -> None:
    """Entry point of ``python -m mlx_integrations.engine.distributed.ranks``."""
    env = rank_env()
    if env.rank == 0:
        sys.exit(
            "mlx_integrations.engine.distributed.ranks follows rank 0; rank 0 runs the program "
            "that creates the DistributedEngine (see mlxi launch)"
        )
    try:
        serve_follower(env)
    except TimeoutError as exc:
        sys.exit(str(exc))


if __name__ == "__main__":
    main()
