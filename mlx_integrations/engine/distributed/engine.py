"""DistributedEngine: one model sharded over several processes or machines.

Rank 0 serves the engine contract (the adapters talk to it as to any engine); the
other ranks run :mod:`mlx_integrations.engine.distributed.ranks` and follow its generation loop,
since every forward pass of a sharded model holds collectives that all ranks join.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from mlx_integrations.chat.fields import RequestError
from mlx_integrations.chat.template import probe_template
from mlx_integrations.chat.tool_formats import detect_format
from mlx_integrations.engine.cache.prefix_cache import MiB
from mlx_integrations.engine.distributed.options import DistributedOptions
from mlx_integrations.engine.distributed.ranks import (
    DEFAULT_RANK_TIMEOUT,
    DEFAULT_START_TIMEOUT,
    ENV_RANK_TIMEOUT,
    ENV_START_TIMEOUT,
    Parallel,
    RankGroup,
    check_tensor_split,
    env_seconds,
    join_as_leader,
    load_shard,
    next_logits,
    positive_seconds,
    prefill,
    rank_env,
    serve_follower,
)
from mlx_integrations.engine.distributed.stats import (
    DistributedClearStats,
    DistributedStats,
    RankClearStats,
    RankStats,
)
from mlx_integrations.engine.generation import MLXGenerationOutput, request_processors
from mlx_integrations.engine.jobs import Job
from mlx_integrations.engine.logprobs import PromptLogprobs
from mlx_integrations.engine.options import EngineOptions
from mlx_integrations.engine.serial import SerialEngine
from mlx_integrations.engine.stats import MemoryStats, memory_stats
from mlx_integrations.models.resolve import lease_model
from mlx_integrations.runtime.owner import (
    close_at_exit,
    join_owner_thread,
    make_owner_thread,
    stop_owner_thread,
)

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


class DistributedError(RuntimeError):
    """A rank of a distributed engine was lost; the engine serves no more requests."""

    code = "distributed_rank_lost"


class _CollectiveError(Exception):
    """A collective raised: a peer is gone (MLX's ring reports a lost connection)."""


class DistributedEngine(SerialEngine):
    """Serve one model sharded over the ranks of an ``mx.distributed`` group.

    Start every rank with ``mlxi launch`` (or by hand with MLX's ring variables,
    ``MLX_RANK`` and ``MLX_HOSTFILE``, running the same program everywhere); the
    engine on rank 0 serves requests one at a time, like :class:`SimpleEngine`, and
    the other ranks follow each request: rank 0 shares the prompt, then every sampled
    token, so sampling settings, seeds, penalties and constraints apply on rank 0 alone
    and every rank sees the same tokens. ``parallel="tensor"`` splits each layer
    (mlx-lm's ``shard``: attention heads, KV heads and FFN width must divide by the
    number of ranks); ``"pipeline"`` gives each rank a run of layers (mlx-lm's
    ``pipeline``, where the model type has it). Streaming, ``abort_request`` and
    cancelling a consumer stop the request on every rank between two tokens.

    A rank that exits, or sends no heartbeat for ``rank_timeout`` seconds, fails the
    running request on rank 0 with :class:`DistributedError`, and every later one; the
    remaining ranks are told to exit. On a rank other than 0, starting the engine
    serves rank 0 until it stops and then ends the process. There is no prefix cache
    (each request prefills its prompt) and no speculative decoding or quantized KV.

    Examples:
        >>> # mlxi launch -n 2 chat.py, where chat.py holds:
        >>> from mlx_integrations.engine import DistributedEngine
        >>> from mlx_integrations.langchain import ChatMLX
        >>> engine = DistributedEngine("path/to/mlx-model")  # doctest: +SKIP
        >>> ChatMLX(engine=engine).invoke("Hello!").content  # doctest: +SKIP

    Args:
        model: A model folder (the same path on every machine), or a store name.
        options: :class:`~mlx_integrations.engine.distributed.options.DistributedOptions`
            (``parallel``, the timeouts, ``admission``, ``prefill_step_size``, ...).
        **kwargs: Fields of ``DistributedOptions`` as keywords: ``parallel``
            (``"tensor"`` or ``"pipeline"``), ``rank_timeout`` (seconds of silence after
            which a rank counts as lost; default ``$MLXI_RANK_TIMEOUT`` or 30),
            ``start_timeout`` (seconds to wait for every rank to join; default
            ``$MLXI_START_TIMEOUT`` or 120)...; and ``pinned``. A
            ``keep_alive`` other than forever (-1 or None) is refused with
            ``ValueError``: the ranks cannot load the model again, so the engine keeps
            it until :meth:`stop`, and the memory budget never unloads it.

    Raises:
        ValueError: An unknown ``parallel``, a timeout that is not a positive number,
            speculative or KV-quantization options; at load, a model that cannot be
            split over this many ranks (the message names its sizes).
    """

    engine_type = "distributed"
    options_type = DistributedOptions
    _options: DistributedOptions
    _fixed_residency = (
        "a DistributedEngine stays loaded until stop(), since its ranks cannot load the "
        "model again; give keep_alive=-1 or None"
    )

    def __init__(self, model: str | Path, *, options: EngineOptions | None = None, **kwargs: Any):
        super().__init__(model, options=options, **kwargs)
        if self._vision:
            raise ValueError(
                f"DistributedEngine serves text models; {self._name!r} is a vision model: "
                "serve it with SimpleEngine on one machine"
            )
        opts = self._options
        self._parallel: Parallel = opts.parallel
        self._rank_timeout = _seconds("rank_timeout", opts.rank_timeout, ENV_RANK_TIMEOUT)
        self._start_timeout = _seconds("start_timeout", opts.start_timeout, ENV_START_TIMEOUT)
        self._env = rank_env()
        self._group: RankGroup | None = None
        self._failure: Exception | None = None
        self._stopped = False
        self._busy_since: float | None = None

    @property
    def rank(self) -> int:
        """This process's rank (the engine serves requests on rank 0)."""
        return self._env.rank

    @property
    def world_size(self) -> int:
        return self._group.size if self._group is not None else self._env.world_size

    @property
    def parallel(self) -> str:
        return self._parallel

    @property
    def failure(self) -> Exception | None:
        """Why the engine serves no more requests, or None."""
        return self._failure

    # -------------------------------------------------------------- lifecycle

    def prepare_for_start(self) -> None:
        if self._failure is not None:
            raise self._failure
        with self._start_lock:
            if self._executor is None and self._model is None:
                self._executor = make_owner_thread(f"mlxi-owner-{self._path.name}", daemon=True)
                close_at_exit(self, _close_at_exit)
        super().prepare_for_start()

    async def stop(self) -> None:
        """Tell every rank to exit, then free the model. The engine cannot start again."""
        with self._state_lock:
            for job in self._jobs.values():
                job.abort.set()
            executor = self._executor
        if executor is not None and self._group is not None and self._failure is None:
            order = executor.submit(self._order_exit, 0, "")
            try:  # after the running request ends; bounded in case a rank is lost meanwhile
                await asyncio.wait_for(asyncio.wrap_future(order), self._rank_timeout + 5)
            except Exception as exc:
                logger.warning("Could not tell the other ranks to exit: %s", exc)
        if self._failure is not None and not self._stopped:
            # A rank was lost: the owner may be stuck in a collective, so no waiting on it.
            with self._state_lock:
                executor, self._executor = self._executor, None
            self._release_lease()
            if executor is not None:
                stop_owner_thread(executor)
                await asyncio.to_thread(join_owner_thread, executor, 5)
            return
        await super().stop()
        await asyncio.to_thread(join_owner_thread, executor, 5)

    def _order_exit(self, code: int, reason: str) -> None:
        """Owner thread: every rank leaves its loop; no request can follow."""
        group = self._group
        if group is None:
            return
        with self._state_lock:
            self._stopped = True
            if self._failure is None:
                self._failure = DistributedError(
                    f"DistributedEngine for {self._name!r} was stopped and its other ranks "
                    "have exited; start the ranks again (mlxi launch) to serve more requests"
                )
        _order_leave(group, code, reason)
        if group.server is not None:
            group.server.close(code, reason or "rank 0 stopped")

    def _load(self) -> None:
        env = self._env
        if env.rank != 0:
            # Ends the process when rank 0 stops.
            serve_follower(env, rank_timeout=self._rank_timeout, start_timeout=self._start_timeout)
        group = join_as_leader(
            env,
            rank_timeout=self._rank_timeout,
            start_timeout=self._start_timeout,
            on_failure=self._fail,
            stalled=self._stalled,
        )
        self._group = group
        self._lease = lease_model(self._path)
        try:
            if self._parallel == "tensor":
                try:
                    check_tensor_split(self._config, group.size, self._name)
                except ValueError as exc:
                    self._failure = exc
                    _order_leave(group, 1, str(exc))
                    raise
            if group.size > 1:
                group.share({"op": "load", "path": str(self._path), "parallel": self._parallel})
            error: Exception | None = None
            try:
                model, tokenizer = load_shard(self._path, group.group, self._parallel)
            except Exception as exc:
                error = self._failure = exc
            if group.size > 1:
                failed = [
                    r for r, row in enumerate(group.gather([float(error is not None)])) if row[0]
                ]
                if failed:  # every rank waits for this exit order, which names the cause
                    error = error if error is not None else self._load_failure(failed)
                    self._failure = error
                    _order_leave(group, 1, str(error))
            if error is not None:
                raise error
            self._capabilities = probe_template(tokenizer)
            self._tool_format = detect_format(tokenizer, self._options.tool_format)
            if self._options.preserve_native_tool_format is None:
                self._preserve_native_tool_format = self._capabilities.renders_tool_messages
            if self._vocab_size is None:
                self._vocab_size = getattr(getattr(model, "args", None), "vocab_size", None)
        except BaseException:
            self._release_lease()
            if group.server is not None:
                group.server.close(1, "rank 0 could not load the model")
            raise
        self._model, self._tokenizer = model, tokenizer

    def _load_failure(self, ranks: list[int]) -> DistributedError:
        server = self._group.server if self._group is not None else None
        # The rank's own words come on the side channel, sent before the gather.
        reasons = server.wait_errors(ranks, self._rank_timeout) if server is not None else []
        said = "; ".join(
            f"rank {r}: {why or 'failed'}" for r, why in zip(ranks, reasons, strict=False)
        )
        error = DistributedError(
            f"DistributedEngine for {self._name!r}: the model did not load on every rank "
            f"({said or ranks}); check that {self._path} exists on every machine"
        )
        self._failure = error
        return error

    # --------------------------------------------------------------- requests

    async def prompt_logprobs(
        self, prompt: str | Sequence[int], top_logprobs: int = 0
    ) -> PromptLogprobs:
        """Not here: every rank would have to run the scoring pass in step."""
        raise RequestError(
            f"DistributedEngine does not score prompts ({self._name!r}); serve the model "
            "with SimpleEngine or BatchedEngine for prompt log-probabilities",
            "prompt",
        )

    def _dispatch(self, executor: ThreadPoolExecutor, job: Job) -> None:
        if self._failure is not None:
            raise self._failure
        super()._dispatch(executor, job)

    def _refusal(self, job: Job) -> MLXGenerationOutput | BaseException | None:
        return self._failure or super()._refusal(job)

    def _ends_engine(self, exc: Exception) -> bool:
        if isinstance(exc, _CollectiveError):  # a lost rank: every request ends
            self._fail(self._lost_rank(exc))
            return True
        return False

    def _collective(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise _CollectiveError(str(exc)) from exc

    def _generate(self, job: Job) -> MLXGenerationOutput:
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache
        from mlx_lm.sample_utils import make_sampler

        group, model, p = self._group, self._model, job.params
        assert group is not None
        s = p.sampling
        if s.seed is not None:
            mx.random.seed(s.seed)
        sampler = make_sampler(s.temperature, top_p=s.top_p, min_p=s.min_p, top_k=s.top_k)
        processors = request_processors(p)
        builder = self._output_builder(job, 0)
        self._busy_since = time.monotonic()
        try:
            if group.size > 1:
                message = {
                    "op": "generate",
                    "tokens": job.tokens,
                    "prefill_step_size": self._prefill_step_size,
                }
                self._collective(group.share, message)
            cache = make_prompt_cache(model)
            y = self._collective(prefill, model, job.tokens, cache, self._prefill_step_size)
            history = mx.array(job.tokens)
            while True:
                logits = next_logits(model, y, cache)
                self._collective(mx.eval, logits)
                token, go, out, error = 0, False, None, None
                aborted = job.abort.is_set()  # read once: every rank must see one decision
                try:  # sampling runs on rank 0 only: a failure here ends this request only
                    for processor in processors:
                        logits = processor(history, logits)
                    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
                    sampled: Any = sampler(logprobs)
                    token = int(sampled.item())
                    out = builder.add(token)
                    go = not builder.finished and not aborted
                except Exception as exc:
                    error = exc
                if group.size > 1:
                    self._collective(group.share_step, token, go)
                else:
                    group.steps += 1
                self._busy_since = time.monotonic()
                if error is not None:
                    raise error
                if builder.finished:
                    assert out is not None
                    return out
                if out is not None:
                    job.emit(out)
                if aborted:
                    return builder.finish("abort")
                y = mx.array([token])
                if processors:
                    history = mx.concatenate([history, y])
        finally:
            self._busy_since = None

    def _stalled(self) -> float | None:
        since = self._busy_since
        return None if since is None else time.monotonic() - since

    def _lost_rank(self, exc: Exception) -> str:
        """Name the lost rank: the side channel knows it, mostly at once (a closed
        connection), at the latest within ``rank_timeout`` (silence)."""
        server = self._group.server if self._group is not None else None
        lost = server.wait_lost(self._rank_timeout) if server is not None else {}
        if server is not None and lost:
            rank, why = next(iter(lost.items()))
            return f"rank {rank} of {server.world_size} {why} ({exc})"
        return f"a collective failed: {exc}"

    def _fail(self, reason: str) -> None:
        """A rank is lost: fail every request, now and later; the others must exit."""
        error = DistributedError(
            f"DistributedEngine for {self._name!r}: {reason}. The other ranks were told "
            "to exit; the engine serves no more requests: start all ranks again "
            "(mlxi launch)"
        )
        with self._state_lock:
            first = self._failure is None
            failure = self._failure = self._failure or error
            jobs = list(self._jobs.values())
        if first:
            logger.error("%s", failure)
        for job in jobs:
            self._finish(job, failure)
        group = self._group
        if group is not None and group.server is not None:
            group.server.close(1, reason)

    def _finish(self, job: Job, result: MLXGenerationOutput | BaseException) -> None:
        with self._state_lock:
            if job.params.request_id not in self._jobs:
                return  # already failed by the watchdog
        super()._finish(job, result)

    # ------------------------------------------------------------ stats, caches

    def clear_runtime_caches(self) -> DistributedClearStats:  # type: ignore[override]
        """Return MLX's buffer pool to the system on every rank (between requests)."""
        if self._failure is not None and not self._stopped:
            raise self._failure
        stats = super().clear_runtime_caches()
        if "ranks" in stats:  # cleared on the owner thread, every rank with it
            return stats  # type: ignore[return-value]
        only = RankClearStats(rank=0, freed_buffer_pool_mb=stats["freed_buffer_pool_mb"])
        return DistributedClearStats(**stats, ranks=[only])

    def _clear(self) -> DistributedClearStats:
        import mlx.core as mx

        group = self._group
        if group is not None and group.size > 1:
            self._collective(group.share, {"op": "clear"})
        before = mx.get_cache_memory()
        mx.clear_cache()
        freed = float(before - mx.get_cache_memory())
        rows = group.gather([freed]) if group is not None and group.size > 1 else [[freed]]
        ranks = [
            RankClearStats(rank=r, freed_buffer_pool_mb=row[0] / MiB) for r, row in enumerate(rows)
        ]
        return DistributedClearStats(
            dropped_entries=0,
            freed_cache_mb=0.0,
            freed_buffer_pool_mb=sum(r["freed_buffer_pool_mb"] for r in ranks),
            ranks=ranks,
        )

    def get_stats(self) -> DistributedStats:  # type: ignore[override]
        base = super().get_stats()
        group = self._group
        steps = group.steps if group is not None else 0
        ranks = [
            RankStats(
                rank=0,
                host=_hostname(),
                pid=_pid(),
                alive=self._failure is None or self._stopped,
                last_heartbeat_s=0.0,
                steps=steps,
                memory=memory_stats(),
            )
        ]
        server = group.server if group is not None else None
        now = time.monotonic()
        for rank, peer in sorted((server.peers if server is not None else {}).items()):
            stats = peer.stats
            ranks.append(
                RankStats(
                    rank=rank,
                    host=peer.host,
                    pid=peer.pid,
                    alive=rank not in server.lost and not self._stopped,  # type: ignore[union-attr]
                    last_heartbeat_s=now - peer.last_seen,
                    steps=int(stats.get("steps", 0)),
                    memory=MemoryStats(
                        active_mb=float(stats.get("active_mb", 0.0)),
                        peak_mb=float(stats.get("peak_mb", 0.0)),
                        cache_mb=float(stats.get("cache_mb", 0.0)),
                    ),
                )
            )
        if self._stopped:
            state = "stopped"
        elif self._failure is not None:
            state = "failed"
        else:
            state = "serving" if self._model is not None else "idle"
        return DistributedStats(
            **base,
            world_size=self.world_size,
            parallel=self._parallel,
            state=state,
            error=None if self._failure is None or self._stopped else str(self._failure),
            collective_s_per_token=group.collective_s / steps if group and steps else 0.0,
            ranks=ranks,
        )


def _seconds(name: str, value: float | None, env: str) -> float:
    default = DEFAULT_RANK_TIMEOUT if name == "rank_timeout" else DEFAULT_START_TIMEOUT
    if value is None:
        return env_seconds(env, default)
    return positive_seconds(name, value)


def _hostname() -> str:
    import socket

    return socket.gethostname()


def _pid() -> int:
    import os

    return os.getpid()


def _order_leave(group: RankGroup, code: int, reason: str) -> None:
    """Rank 0 orders every rank out of its loop, through MLX. Their connections close
    as they go: the side channel expects that first, or a fast rank's exit would read
    as a lost rank and the others would be told a wrong reason and status."""
    if group.server is not None:
        group.server.expect_exits()
    if group.size > 1:
        try:
            group.share({"op": "exit", "code": code, "reason": reason})
        except Exception as exc:  # the side channel's exit order follows (close)
            logger.warning("Could not share the exit order through MLX: %s", exc)


def _close_at_exit(engine: DistributedEngine) -> None:
    """At exit: the other ranks of an engine nobody stopped exit too."""
    group = engine._group
    if group is not None and group.server is not None:
        group.server.close(0, "rank 0 exited")
    with engine._state_lock:
        executor, engine._executor = engine._executor, None
    if executor is not None:
        stop_owner_thread(executor)
        join_owner_thread(executor, 5)
