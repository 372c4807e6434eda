"""BatchedEngine: continuous batching on mlx-lm's ``BatchGenerator``.

While requests are queued or running, the owner thread runs one loop: between two
decode steps it runs control calls (cache clears), drops aborted requests, and admits
queued ones into the running batch; then it steps the generator and hands each
sequence's token to that request's :class:`OutputBuilder`. Finished sequences give
their KV cache to the prefix cache, so the next turn of a conversation prefills only
what is new. A request alone runs outside the generator (:mod:`.alone`, :mod:`.solo`)
until another arrives.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from mlx_integrations.engine.batched.active import Active
from mlx_integrations.engine.batched.alone import LoneRequests
from mlx_integrations.engine.batched.arrivals import (
    SPARE,
    drop_placeholders,
    placeholder_prompts,
)
from mlx_integrations.engine.batched.options import BatchedOptions
from mlx_integrations.engine.batched.sampling import (
    GuardedProcessors,
    SharedSamplers,
)
from mlx_integrations.engine.batched.solo import SoloDecode, prefill_joining
from mlx_integrations.engine.batched.speculation import BatchSpeculation, add_token
from mlx_integrations.engine.batched.warmup import warm_batch
from mlx_integrations.engine.cache.kv_quantization import (
    check_kv_at_load,
)
from mlx_integrations.engine.decoding import repair_random_state
from mlx_integrations.engine.generation import (
    MLXGenerationOutput,
    request_processors,
)
from mlx_integrations.engine.jobs import (
    ABORT_SCAN_S,
    Job,
    abort_mark,
    aborted_output,
    run_call,
)
from mlx_integrations.engine.mlx_engine import MLXEngine
from mlx_integrations.engine.options import EngineOptions
from mlx_integrations.engine.speculative.draft_model import DraftModel
from mlx_integrations.engine.speculative.pace import LookupPace
from mlx_integrations.engine.stats import BatchedEngineStats, ClearStats
from mlx_integrations.runtime.owner import run_aside

logger = logging.getLogger(__name__)

T = TypeVar("T")


class BatchedEngine(LoneRequests, MLXEngine):
    """Serve many requests at once: new ones join the running batch between steps.

    Each decode step advances every running sequence by one token in one forward
    pass, so N concurrent requests cost far less than N requests one after the
    other. Requests beyond ``max_num_seqs`` wait for a free place. A shared prefix
    cache (with a memory budget) gives each request the KV of the longest cached
    prefix of its prompt. Greedy results match :class:`SimpleEngine`'s up to float
    rounding; a seeded request draws from its own random key.

    The context window, sampling limits and failures behave as described in
    :class:`MLXEngine`: a failed decode step ends only its own request.

    A request that finds the engine idle decodes alone on a plain KV cache, as
    :class:`SimpleEngine` does (a batch of one pays for padding and masks it does not
    need); when another arrives, it joins the batch with its cache, no token lost or
    repeated. The last request of a batch goes on alone too (unless it is seeded or has
    logits processors). With ``prompt_lookup=N`` or ``draft_model=...`` (loaded with
    the model, vocabulary checked as in :class:`SimpleEngine`) the lone request drafts
    (greedy replies unchanged). In a shared batch rows draft too, by prompt lookup or
    the draft model (:mod:`.speculation`, :mod:`.draft_model`); rows with logits
    processors or a seeded sampler decode plainly (``speculation_off_requests``). A quantized
    KV cache (``kv_bits``) holds a request from its first token, alone or in the batch
    (:mod:`.kv_cache`), greedy replies as ``SimpleEngine``'s; ``quantized_kv_start`` above
    0 is refused with ``ValueError`` (a batch quantizes every row), and so is a
    vision-language model.

    Examples:
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
        options: How the engine serves the model
            (:class:`~mlx_integrations.engine.batched.options.BatchedOptions`; an
            ``EngineOptions`` is taken too, its fields kept).
        **kwargs: Fields of ``BatchedOptions`` as keywords: ``max_num_seqs`` (most
            requests in the running batch; more wait in line, or with
            ``admission="fail_fast"`` are refused with :class:`EngineBusy`),
            ``admission``, ``cache_memory_mb``, ``prefill_step_size``, ``draft_model``,
            ``prompt_lookup``...; they override ``options``. And ``keep_alive`` and
            ``pinned``, the model's residency
            (:class:`~mlx_integrations.engine.mlx_engine.MLXEngine`).

    Raises:
        FileNotFoundError: The draft model is not found.
        ValueError: A draft model whose vocabulary differs from the model's (at load).
    """

    engine_type = "batched"
    options_type = BatchedOptions
    _options: BatchedOptions

    def __init__(self, model: str | Path, *, options: EngineOptions | None = None, **kwargs: Any):
        super().__init__(model, options=options, **kwargs)
        if self._vision:
            # mlx-vlm batches with its own generator (per-row image inputs and mRoPE
            # state); this engine is built on mlx-lm's.
            raise ValueError(
                f"{self._name!r} is a vision-language model; BatchedEngine serves text "
                "models only: use SimpleEngine (engine_type='simple') for it"
            )
        self._max_num_seqs = self._options.max_num_seqs
        # Under the state lock: the wait line, control calls, and whether the owner
        # thread is running the loop (it runs while there is work, then returns).
        self._inbox: deque[Job] = deque()
        self._arrivals: list[Job] = []  # dispatched in this pass of an event loop
        self._release_on: asyncio.AbstractEventLoop | None = None
        self._calls: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._serving = False
        # Owner thread only.
        self._generator: Any = None
        self._eos: Any = None
        self._active: dict[int, Active] = {}
        self._samplers = SharedSamplers()
        self._solo: tuple[Active, SoloDecode] | None = None
        self._abort_mark = -1  # abort_mark() at the last look at every request's flag
        self._abort_scan = 0.0  # and when (time.monotonic())
        self._draft = DraftModel(self._options.draft_model)
        # Drafts in the batch: prompt lookup, or the draft model.
        self._spec = BatchSpeculation(self._options, self._draft, self._prefill_step_size)
        self._solo_pace = LookupPace()  # prompt lookup for a request alone
        # Under the state lock.
        self._solo_requests = 0
        self._solo_tokens = 0
        self._steps = 0
        self._decoded = 0
        self._last_batch = 0
        self._peak_batch = 0
        self._resets = 0
        self._grouped_requests = 0
        self._placeholders: list[int] = []  # generator rows padding a group's prefill

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
                solo_requests=self._solo_requests,
                solo_tokens=self._solo_tokens,
                speculation_off_requests=self._spec.plain_requests,
                grouped_prefill_requests=self._grouped_requests,
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
        # The state lock is held. Requests sent in one pass of the event loop (as
        # asyncio.gather sends them) reach the owner at once, to be prefilled together.
        self._arrivals.append(job)
        loop = asyncio.get_running_loop()
        if self._release_on is not loop:
            self._release_on = loop
            loop.call_soon(self._release, executor)

    def _release(self, executor: ThreadPoolExecutor) -> None:
        """Move the arrivals into the wait line; start the owner's loop if it is idle."""
        with self._state_lock:
            self._inbox.extend(self._arrivals)
            self._arrivals.clear()
            self._release_on = None
            if self._serving:
                return
            self._serving = True
        try:
            executor.submit(self._serve)
        except RuntimeError as exc:  # the engine stopped, or the interpreter is exiting
            with self._state_lock:
                self._serving = False
                jobs, self._inbox = list(self._inbox), deque()
            for job in jobs:
                self._finish(job, aborted_output(job) if job.abort.is_set() else exc)

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

    def _load(self) -> None:
        super()._load()
        opts = self._options
        try:
            check_kv_at_load(self._model, opts.kv_bits, opts.kv_group_size, self._name)
            self._draft.load(self._tokenizer)
            self._warm_up()
        except BaseException:
            self._unload()  # nothing half-loaded stays: the next request loads again
            raise

    def _warm_up(self) -> None:
        super()._warm_up()
        if self.warmup_seconds is not None:  # the shapes of a request alone were met
            # On a thread of its own: the owner thread keeps no state from it (run_aside).
            self.warmup_seconds += run_aside(
                partial(
                    warm_batch,
                    self._model,
                    self._prefill_step_size,
                    self._shapes,
                    self._max_num_seqs,
                )
            )

    def _clear(self) -> ClearStats:
        self._draft.cache.clear()
        return super()._clear()

    def _unload(self) -> None:
        self._close_generator()
        self._samplers.clear()
        self._draft.unload()
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
                    if not (calls or self._inbox or self._active or self._solo):
                        self._serving = False
                        return
                for fn, future in calls:
                    run_call(fn, future)
                try:
                    self._drop_aborted()
                    self._admit()
                    if self._solo is not None:
                        self._solo_step()
                    elif self._active:
                        self._step()
                    self._spec.settled(self._generator)  # an empty batch keeps no draft KV
                except BaseException as exc:  # keep serving: only the batch in flight is lost
                    self._reset(exc)
        except BaseException:
            with self._state_lock:  # the next request starts the loop again
                self._serving = False
            raise

    def _drop_aborted(self) -> None:
        """Answer aborted queued requests; take aborted running ones out of the batch.

        Each request's flag is read only when an abort was raised since the last look,
        or once :data:`ABORT_SCAN_S` has passed since it (a consumer whose loop closed
        raises none): between two steps, so a step in flight adds to that.
        """
        mark, now = abort_mark(), time.monotonic()
        if mark == self._abort_mark and now - self._abort_scan < ABORT_SCAN_S:
            return
        self._abort_mark, self._abort_scan = mark, now
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
        if self._solo is not None and self._solo[0].job.abort.is_set():
            self._end_solo(self._solo[0].builder.finish("abort"))

    def _admit(self) -> None:
        """Move queued requests into the generator while the batch has room."""
        took = 0
        together: list[Job] = []  # arrived with others: prefilled as one padded group
        joined = False  # a lone request joined the batch (maybe with prompt left to prefill)
        while len(self._active) + len(together) + (self._solo is not None) < self._max_num_seqs:
            with self._state_lock:
                if not self._inbox:
                    break
                job = self._inbox.popleft()
                lone = not self._inbox and not took  # joins the batch on its own
                alone = lone and not self._active and self._solo is None
            took += 1
            if job.abort.is_set():
                self._finish(job, aborted_output(job))
                continue
            self._mark_running(job)
            try:
                if alone and self._start_solo(job):
                    continue
                if self._solo is not None:
                    self._join_solo()
                    joined = True
                if lone or self._options.kv_bits is not None:
                    self._insert(job, lone)
                else:
                    together.append(job)
            except Exception as exc:
                self._fail(job, exc)
        if together:
            self._insert_together(together, pad=not joined)

    def _fail(self, job: Job, exc: Exception) -> None:
        logger.debug("Request %s failed", job.params.request_id, exc_info=True)
        repair_random_state()
        self._finish(job, exc)

    def _insert_together(self, jobs: list[Job], pad: bool = True) -> None:
        """Insert requests that arrived together; with ``pad``, their batch prefill
        padded to a bucket's length and a few row counts by placeholders (:mod:`.arrivals`)."""
        rests: list[tuple[int, int]] = []  # (tokens cached, tokens to prefill but the last)
        for job in jobs:
            try:
                cache, reused = self._prefix.take(job.tokens, self._shapes.key_step)
                self._insert(job, taken=(cache, reused))
                rests.append((reused, len(job.tokens) - 1 - reused))
            except Exception as exc:
                self._fail(job, exc)
        prefilling = [(held, n) for held, n in rests if n > 0]  # others hold all but the last
        busy = len(getattr(self._generator, "_prompt_batch", ())) > 0  # earlier rows prefilling
        if not pad or self._options.kv_bits is not None or busy or len(prefilling) < 2:
            return
        room = self._max_num_seqs + SPARE - len(self._active)
        try:
            rows = placeholder_prompts(prefilling, room, self._shapes, self._model)
            if rows:
                self._placeholders = self._generator.insert(rows, max_tokens=[1] * len(rows))
        except Exception:  # only the shapes are lost: the group is prefilled as it is
            logger.warning("Padding a group's prefill failed", exc_info=True)
            return
        if rows:
            with self._state_lock:
                self._grouped_requests += len(prefilling)

    def _insert(
        self,
        job: Job,
        lone: bool = False,
        taken: tuple[list[Any] | None, int] | None = None,
    ) -> None:
        """Put a request into the generator; ``taken``: what the prefix cache gave it
        (taken here if None)."""
        p = job.params
        cache, reused = (
            taken if taken is not None else self._prefix.take(job.tokens, self._shapes.key_step)
        )
        if cache is not None and not all(hasattr(layer, "merge") for layer in cache):
            # This cache type cannot join a batch; prefill the whole prompt instead.
            self._prefix.put(job.tokens[:reused], cache)
            cache, reused = None, 0
        try:
            user = request_processors(p)
            processors = GuardedProcessors(user) if user else None
            sampler = self._samplers.for_request(p)
            builder = self._output_builder(job, reused)
            act = Active(job, builder, processors, sampler)
            fed = reused
            if lone and self._options.kv_bits is None:
                cache, fed = prefill_joining(self._model, job.tokens, reused, cache, self._shapes)
            self._insert_active(act, job.tokens[fed:], cache, job.tokens[:fed])
        except BaseException:
            if cache is not None:  # held beyond the prefix (fed), it is trimmed to it
                self._prefix.put(job.tokens[:reused], cache)
            raise
        self._spec.admitted(self._model, p, processors is not None)

    def _insert_active(
        self, act: Active, prompt: list[int], cache: list[Any] | None, cached: list[int]
    ) -> None:
        """Put a sequence into the generator: ``prompt`` follows the ``cached`` tokens."""
        if self._options.kv_bits is not None:
            cache = self._own_cache(cache)  # each row quantized: a quantized batch cache
        (uid,) = self._batch_generator().insert(
            [prompt],
            max_tokens=[act.job.params.max_tokens - len(act.builder.tokens)],
            caches=[cache],
            all_tokens=[cached],
            samplers=[act.sampler],
            logits_processors=[[act.processors] if act.processors else []],
            stop_sequences=[self._eos],
        )
        self._active[uid] = act

    def _batch_generator(self) -> Any:
        if self._generator is None:
            from mlx_lm.generate import BatchGenerator

            places = self._max_num_seqs + SPARE  # real rows never pass max_num_seqs
            self._generator = BatchGenerator(
                self._model,
                completion_batch_size=places,
                prefill_batch_size=places,
                prefill_step_size=self._prefill_step_size,
            )
        return self._generator

    def _step(self) -> None:
        """One generator step: prefill pieces of newcomers and one token for the rest."""
        # A failure here resets the batch (see _serve); a row may get several tokens.
        _, responses = self._spec.next(self._generator)
        if self._placeholders:  # prefilled with their group: out before they decode
            placeholders, self._placeholders = self._placeholders, []
            drop_placeholders(self._generator, placeholders)
        if rows := len({r.uid for r in responses} if self._spec.max_draft else responses):
            with self._state_lock:
                self._steps += 1
                self._decoded += rows
                self._last_batch = rows
                self._peak_batch = max(self._peak_batch, rows)
        # Sequences the generator already took out (EOS, max_tokens): (final, cache, tokens).
        done: dict[int, tuple[MLXGenerationOutput, Any, Any]] = {}
        # Sequences we take out: stop strings and failures.
        retire: dict[int, MLXGenerationOutput | BaseException] = {}
        active = self._active
        drafting = bool(self._spec.max_draft)  # responses may carry draft counts
        for r in responses:  # every row, every step: kept lean
            uid = r.uid
            act = active.get(uid)
            if act is None or (done and uid in done):
                continue
            if retire and (ended := retire.get(uid)) is not None:  # a stop string in a wide step
                if r.finish_reason is not None and not isinstance(ended, BaseException):
                    done[uid] = (ended, r.prompt_cache, r.all_tokens)  # the generator let go
                continue
            if act.guarded and (error := act.error()) is not None:
                retire[uid] = error
                continue
            builder = act.builder
            out = add_token(builder, r) if drafting else builder.add(r.token)
            if r.finish_reason is not None:
                if builder.finish_reason is None:
                    out = builder.finish(r.finish_reason)
                assert out is not None
                done[uid] = (out, r.prompt_cache, r.all_tokens)
            elif builder.finish_reason is not None:
                assert out is not None
                retire[uid] = out
            elif out is not None:
                act.job.emit(out)
        # A newcomer's processors run during this step before it returned any token.
        for uid, act in self._active.items():
            if act.guarded and uid not in retire and uid not in done:
                error = act.error()
                if error is not None:
                    retire[uid] = error
        for uid, (out, cache, tokens) in done.items():
            act = self._active.pop(uid)
            retire.pop(uid, None)
            if cache is not None and tokens:
                self._prefix.put(list(tokens), cache, **act.served())
            self._finish(act.job, out)
        if retire:
            self._retire(retire)
        if len(self._active) == 1:
            self._go_solo(*next(iter(self._active.items())))

    def _retire(self, results: Mapping[int, MLXGenerationOutput | BaseException]) -> None:
        """Take sequences out of the batch; keep the KV of those that did not fail."""
        caches = self._generator.remove(list(results), return_prompt_caches=True)
        for uid, result in results.items():
            act = self._active.pop(uid)
            if not isinstance(result, BaseException) and uid in caches:
                cache, tokens = caches[uid]
                self._prefix.put(list(tokens), cache, **act.served())
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
        self._placeholders = []
        if self._generator is not None:
            self._generator.close()
            self._generator = None
        self._spec.release()
