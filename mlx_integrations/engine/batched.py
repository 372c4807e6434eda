"""BatchedEngine: continuous batching on mlx-lm's ``BatchGenerator``.

While requests are queued or running, the owner thread runs one loop: between two
decode steps it runs control calls (cache clears), drops aborted requests, and admits
queued ones into the running batch; then it steps the generator and hands each
sequence's token to that request's :class:`OutputBuilder`. Finished sequences give
their KV cache to the prefix cache, so the next turn of a conversation prefills only
what is new.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from mlx_integrations.engine.generation import (
    MLXGenerationOutput,
    OutputBuilder,
    request_processors,
)
from mlx_integrations.engine.jobs import Job, aborted_output
from mlx_integrations.engine.mlx_engine import MLXEngine
from mlx_integrations.engine.options import EngineOptions
from mlx_integrations.engine.params import SamplingParams
from mlx_integrations.engine.random_state import repair_random_state
from mlx_integrations.engine.stats import EngineStats

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Distinct sampling settings kept as shared samplers; beyond this the table starts over.
_MAX_SHARED_SAMPLERS = 32


class BatchedEngineStats(EngineStats):
    """What ``BatchedEngine.get_stats()`` returns: the common keys and the batch's."""

    max_num_seqs: int
    """Most sequences in the running batch; more requests wait."""
    batch_size: int
    """Sequences in the last decode step."""
    peak_batch_size: int
    """Most sequences seen in one decode step."""
    mean_batch_size: float
    """Tokens decoded per decode step, on average."""
    steps_executed: int
    """Decode steps run since the engine was made."""
    generator_resets: int
    """Times a failed decode step ended the whole batch and the generator was rebuilt."""


class _GuardedProcessors:
    """A request's logits processors run as one; a failure ends only that request.

    An exception raised inside ``BatchGenerator.next()`` would leave the shared batch
    half-stepped, so errors are caught here, remembered, and the logits pass through
    unchanged until the request is taken out of the batch.
    """

    def __init__(self, processors: list[Callable[..., Any]]):
        self.processors = processors
        self.error: Exception | None = None

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx

        if self.error is not None:
            return logits
        try:
            out = logits
            for processor in self.processors:
                out = processor(tokens, out)
            if not isinstance(out, mx.array) or out.shape != logits.shape:
                shape = getattr(out, "shape", type(out).__name__)
                raise TypeError(
                    f"a logits processor returned {shape}, expected an mx.array of shape "
                    f"{logits.shape}"
                )
            return out
        except Exception as exc:
            self.error = exc
            repair_random_state()  # before the samplers of this same step draw from it
            return logits


class _GuardedSampler:
    """A sampler whose failure ends the requests using it, not the batch."""

    def __init__(self, sampler: Callable[[Any], Any]):
        self.sampler = sampler
        self.error: Exception | None = None

    def __call__(self, logprobs: Any) -> Any:
        import mlx.core as mx

        if self.error is None:
            try:
                return self.sampler(logprobs)
            except Exception as exc:
                self.error = exc
                repair_random_state()  # the other samplers of this step draw next
        return mx.argmax(logprobs, axis=-1)


class _SeededSampler:
    """Samples with a request's own random key.

    mlx-lm's samplers draw from MLX's global random state, which every request in
    the batch advances; a private key keeps a seeded request reproducible whatever
    else runs beside it. The filters are mlx-lm's, in ``make_sampler``'s order.
    """

    def __init__(self, p: SamplingParams, seed: int):
        import mlx.core as mx
        from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

        self._key = mx.random.key(seed)
        self._scale = 1.0 / p.temperature
        self._filters: list[Callable[[Any], Any]] = []
        top_p, min_p, top_k = p.top_p, p.min_p, p.top_k
        if 0 < top_p < 1.0:
            self._filters.append(lambda x: apply_top_p(x, top_p))
        if min_p != 0.0:
            self._filters.append(lambda x: apply_min_p(x, min_p))
        if top_k > 0:
            self._filters.append(lambda x: apply_top_k(x, top_k))

    def __call__(self, logprobs: Any) -> Any:
        import mlx.core as mx

        for method in self._filters:
            logprobs = method(logprobs)
        self._key, key = mx.random.split(self._key)
        return mx.random.categorical(logprobs * self._scale, key=key)


@dataclass
class _Active:
    """A request inside the generator (prefilling or decoding)."""

    job: Job
    builder: OutputBuilder
    processors: _GuardedProcessors | None
    sampler: _GuardedSampler | None

    def error(self) -> Exception | None:
        if self.processors is not None and self.processors.error is not None:
            return self.processors.error
        if self.sampler is not None and self.sampler.error is not None:
            return self.sampler.error
        return None


class BatchedEngine(MLXEngine):
    """Serve many requests at once: new ones join the running batch between steps.

    Each decode step advances every running sequence by one token in one forward
    pass, so N concurrent requests cost far less than N requests one after the
    other. Requests beyond ``max_num_seqs`` wait for a free place. A shared prefix
    cache (with a memory budget) gives each request the KV of the longest cached
    prefix of its prompt. Greedy results match :class:`SimpleEngine`'s up to float
    rounding; a seeded request draws from its own random key.

    The context window, sampling limits and failures behave as described in
    :class:`MLXEngine`: a failed decode step ends only its own request. Speculative
    decoding (``draft_model``, ``prompt_lookup``) is refused with ``ValueError``: the
    batch advances every sequence one token per step; use :class:`SimpleEngine` for it.
    So is a quantized KV cache (``kv_bits``): mlx-lm's batch generator has none. So is
    a vision-language model: :class:`SimpleEngine` serves those, one request at a time.

    Example:
        >>> import asyncio
        >>> from mlx_integrations.engine import BatchedEngine
        >>> async def main():
        ...     engine = BatchedEngine("path/to/mlx-model", max_num_seqs=8)
        ...     questions = ["Capital of France?", "Capital of Italy?", "2 + 2?"]
        ...     outs = await asyncio.gather(*[
        ...         engine.chat([{"role": "user", "content": q}], max_tokens=32, temperature=0)
        ...         for q in questions
        ...     ])
        ...     for out in outs:
        ...         print(out.text)
        ...     await engine.stop()
        >>> asyncio.run(main())  # doctest: +SKIP

    Args:
        model: A model folder, or a name the model store resolves.
        max_num_seqs: Most requests in the running batch; more wait in line (or, with
            ``admission="fail_fast"``, are refused with :class:`EngineBusy`).
        options: How the engine serves the model
            (:class:`~mlx_integrations.engine.options.EngineOptions`).
        **kwargs: Fields of ``EngineOptions`` as keywords (``admission``,
            ``cache_memory_mb``, ``prefill_step_size``...); they override ``options``.
    """

    engine_type = "batched"

    def __init__(
        self,
        model: str | Path,
        *,
        max_num_seqs: int = 8,
        options: EngineOptions | None = None,
        **kwargs: Any,
    ):
        if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int):
            raise TypeError(f"max_num_seqs must be an integer, got {max_num_seqs!r}")
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {max_num_seqs}")
        super().__init__(model, options=options, **kwargs)
        if self._vision:
            # mlx-vlm batches with its own generator (per-row image inputs and mRoPE
            # state); this engine is built on mlx-lm's.
            raise ValueError(
                f"{self._name!r} is a vision-language model; BatchedEngine serves text "
                "models only: use SimpleEngine (engine_type='simple') for it"
            )
        if self._options.speculation != "off":
            source = (
                f"draft_model={self._options.draft_model!r}"
                if self._options.draft_model is not None
                else f"prompt_lookup={self._options.prompt_lookup}"
            )
            raise ValueError(
                f"BatchedEngine cannot decode speculatively ({source}): its batch steps "
                "every sequence one token at a time; use SimpleEngine (engine_type="
                "'simple') for speculative decoding, or drop the option"
            )
        if self._options.kv_bits is not None:
            # mlx-lm's BatchGenerator batches only KVCache layers (QuantizedKVCache has
            # no merge) and takes no kv_bits.
            raise ValueError(
                f"BatchedEngine cannot quantize its KV cache (kv_bits="
                f"{self._options.kv_bits}): mlx-lm's batch generator has no quantized "
                "batch cache; use SimpleEngine (engine_type='simple') for kv_bits, or "
                "drop the option"
            )
        self._max_num_seqs = max_num_seqs
        # Under the state lock: the wait line, control calls, and whether the owner
        # thread is running the loop (it runs while there is work, then returns).
        self._inbox: deque[Job] = deque()
        self._calls: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._serving = False
        # Owner thread only.
        self._generator: Any = None
        self._eos: Any = None
        self._active: dict[int, _Active] = {}
        self._samplers: dict[tuple[float, float, float, int], _GuardedSampler] = {}
        # Under the state lock.
        self._steps = 0
        self._decoded = 0
        self._last_batch = 0
        self._peak_batch = 0
        self._resets = 0

    @property
    def max_num_seqs(self) -> int:
        """Most requests in the running batch."""
        return self._max_num_seqs

    def get_stats(self) -> BatchedEngineStats:  # type: ignore[override]
        stats = super().get_stats()
        with self._state_lock:
            return BatchedEngineStats(
                **stats,
                max_num_seqs=self._max_num_seqs,
                batch_size=self._last_batch,
                peak_batch_size=self._peak_batch,
                mean_batch_size=self._decoded / self._steps if self._steps else 0.0,
                steps_executed=self._steps,
                generator_resets=self._resets,
            )

    # ------------------------------------------------------- engine hooks

    def _is_full(self) -> bool:
        return len(self._jobs) >= self._max_num_seqs

    def _busy_message(self) -> str:
        return (
            f"BatchedEngine for {self._name!r} is running max_num_seqs="
            f"{self._max_num_seqs} requests; retry later, raise max_num_seqs, or create "
            "the engine with admission='wait' to queue requests"
        )

    def _dispatch(self, executor: ThreadPoolExecutor, job: Job) -> None:
        # The state lock is held.
        if not self._serving:
            executor.submit(self._serve)  # raises once the interpreter is exiting
            self._serving = True
        self._inbox.append(job)

    def _on_loaded(self, executor: ThreadPoolExecutor) -> None:
        from mlx_lm.generate import StopSequences

        self._eos = StopSequences([[t] for t in self._tokenizer.eos_token_ids])

    def _on_owner(self, executor: ThreadPoolExecutor, fn: Callable[[], T]) -> Future[T]:
        with self._state_lock:
            if self._serving:  # run between two steps rather than after the batch drains
                future: Future[T] = Future()
                self._calls.append((fn, future))
                return future
        return executor.submit(fn)

    def _unload(self) -> None:
        self._close_generator()
        self._samplers.clear()
        super()._unload()

    # ------------------------------------------------------- the owner loop

    def _serve(self) -> None:
        """The owner thread's loop: runs while requests are queued or running.

        It returns when there is nothing left to do, so the owner thread is free
        for other work (loading, unloading) and for the interpreter's exit.
        """
        try:
            while True:
                with self._state_lock:
                    calls = list(self._calls)
                    self._calls.clear()
                    if not (calls or self._inbox or self._active):
                        self._serving = False
                        return
                for fn, future in calls:
                    _run_call(fn, future)
                try:
                    self._drop_aborted()
                    self._admit()
                    if self._active:
                        self._step()
                except BaseException as exc:  # keep serving: only the batch in flight is lost
                    self._reset(exc)
        except BaseException:
            with self._state_lock:  # the next request starts the loop again
                self._serving = False
            raise

    def _drop_aborted(self) -> None:
        """Answer aborted queued requests; take aborted running ones out of the batch."""
        with self._state_lock:
            dropped = [job for job in self._inbox if job.abort.is_set()]
            if dropped:
                self._inbox = deque(job for job in self._inbox if not job.abort.is_set())
        for job in dropped:
            self._finish(job, aborted_output(job))
        aborted = {
            uid: act.builder.finish("abort")
            for uid, act in self._active.items()
            if act.job.abort.is_set()
        }
        if aborted:
            self._retire(aborted)

    def _admit(self) -> None:
        """Move queued requests into the generator while the batch has room."""
        while len(self._active) < self._max_num_seqs:
            with self._state_lock:
                if not self._inbox:
                    return
                job = self._inbox.popleft()
            if job.abort.is_set():
                self._finish(job, aborted_output(job))
                continue
            self._mark_running(job)
            try:
                self._insert(job)
            except Exception as exc:
                logger.debug("Request %s failed", job.params.request_id, exc_info=True)
                repair_random_state()
                self._finish(job, exc)

    def _insert(self, job: Job) -> None:
        p = job.params
        cache, reused = self._prefix.take(job.tokens)
        if cache is not None and not all(hasattr(layer, "merge") for layer in cache):
            # This cache type cannot join a batch; prefill the whole prompt instead.
            self._prefix.put(job.tokens[:reused], cache)
            cache, reused = None, 0
        try:
            user = request_processors(p)
            processors = _GuardedProcessors(user) if user else None
            sampler = self._sampler(p)
            builder = self._output_builder(job, reused)
            (uid,) = self._batch_generator().insert(
                [job.tokens[reused:]],
                max_tokens=[p.max_tokens],
                caches=[cache],
                all_tokens=[job.tokens[:reused]],
                samplers=[sampler],
                logits_processors=[[processors] if processors else []],
                stop_sequences=[self._eos],
            )
        except BaseException:
            if cache is not None:
                self._prefix.put(job.tokens[:reused], cache)
            raise
        self._active[uid] = _Active(job, builder, processors, sampler)

    def _sampler(self, p: SamplingParams) -> _GuardedSampler | None:
        """None (the generator's shared greedy sampler) for temperature 0.

        Requests with the same settings share one sampler object, so the generator
        samples them in one call.
        """
        from mlx_lm.sample_utils import make_sampler

        if p.temperature == 0:
            return None
        if p.seed is not None:
            return _GuardedSampler(_SeededSampler(p, p.seed))
        key = (p.temperature, p.top_p, p.min_p, p.top_k)
        sampler = self._samplers.get(key)
        if sampler is None or sampler.error is not None:
            if len(self._samplers) >= _MAX_SHARED_SAMPLERS:
                self._samplers.clear()
            sampler = _GuardedSampler(
                make_sampler(p.temperature, top_p=p.top_p, min_p=p.min_p, top_k=p.top_k)
            )
            self._samplers[key] = sampler
        return sampler

    def _batch_generator(self) -> Any:
        if self._generator is None:
            from mlx_lm.generate import BatchGenerator

            self._generator = BatchGenerator(
                self._model,
                completion_batch_size=self._max_num_seqs,
                prefill_batch_size=self._max_num_seqs,
                prefill_step_size=self._prefill_step_size,
            )
        return self._generator

    def _step(self) -> None:
        """One generator step: prefill pieces of newcomers and one token for the rest."""
        _, responses = self._generator.next()  # a failure here resets the batch (see _serve)
        if responses:
            with self._state_lock:
                self._steps += 1
                self._decoded += len(responses)
                self._last_batch = len(responses)
                self._peak_batch = max(self._peak_batch, len(responses))
        # Sequences the generator already took out (EOS, max_tokens): (final, cache, tokens).
        done: dict[int, tuple[MLXGenerationOutput, Any, Any]] = {}
        # Sequences we take out: stop strings and failures.
        retire: dict[int, MLXGenerationOutput | BaseException] = {}
        for r in responses:
            act = self._active.get(r.uid)
            if act is None:
                continue
            error = act.error()
            if error is not None:
                retire[r.uid] = error
                continue
            out = act.builder.add(int(r.token))
            if r.finish_reason is not None:
                if not act.builder.finished:
                    out = act.builder.finish(r.finish_reason)
                assert out is not None
                done[r.uid] = (out, r.prompt_cache, r.all_tokens)
            elif act.builder.finished:
                assert out is not None
                retire[r.uid] = out
            elif out is not None:
                act.job.emit(out)
        # A newcomer's processors run during this step before it returned any token.
        for uid, act in self._active.items():
            if uid not in retire and uid not in done:
                error = act.error()
                if error is not None:
                    retire[uid] = error
        for uid, (out, cache, tokens) in done.items():
            act = self._active.pop(uid)
            retire.pop(uid, None)
            if cache is not None and tokens:
                self._prefix.put(list(tokens), cache)
            self._finish(act.job, out)
        if retire:
            self._retire(retire)

    def _retire(self, results: Mapping[int, MLXGenerationOutput | BaseException]) -> None:
        """Take sequences out of the batch; keep the KV of those that did not fail."""
        caches = self._generator.remove(list(results), return_prompt_caches=True)
        for uid, result in results.items():
            act = self._active.pop(uid)
            if not isinstance(result, BaseException) and uid in caches:
                cache, tokens = caches[uid]
                self._prefix.put(list(tokens), cache)
            if isinstance(result, BaseException):
                logger.debug("Request %s failed: %r", act.job.params.request_id, result)
            self._finish(act.job, result)

    def _reset(self, exc: BaseException) -> None:
        """A step failed inside the generator: its state is unknown, so start over.

        Every request in the batch fails; queued requests go on in a new generator.
        """
        logger.warning("A decode step of %s failed; dropping its batch: %r", self._name, exc)
        self._close_generator()  # the batch's caches go with it, never to the prefix cache
        repair_random_state()
        active, self._active = self._active, {}
        with self._state_lock:
            self._resets += 1
        for act in active.values():
            error = act.error()
            if error is None:
                error = RuntimeError(
                    f"Request {act.job.params.request_id!r} was dropped: the decode batch "
                    f"it ran in failed ({exc!r}); retry it"
                )
                error.__cause__ = exc
            self._finish(act.job, error)

    def _close_generator(self) -> None:
        if self._generator is not None:
            self._generator.close()
            self._generator = None


def _run_call(fn: Callable[[], Any], future: Future[Any]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn())
    except BaseException as exc:
        future.set_exception(exc)
