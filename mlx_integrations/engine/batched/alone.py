"""BatchedEngine's requests alone: outside the generator while nothing else runs.

A request that finds the engine idle decodes alone on a plain KV cache (:mod:`.solo`),
as SimpleEngine does; when another arrives it joins the batch with its cache, no token
lost or repeated; the last request of a batch goes on alone too. Owner thread only.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Protocol

from mlx_integrations.engine.batched.active import Active
from mlx_integrations.engine.batched.options import BatchedOptions
from mlx_integrations.engine.batched.sampling import SharedSamplers
from mlx_integrations.engine.batched.solo import SoloDecode
from mlx_integrations.engine.batched.speculation import BatchSpeculation
from mlx_integrations.engine.cache.prefix_cache import PrefixCache, cache_offset
from mlx_integrations.engine.decoding import PrefillShapes, Step
from mlx_integrations.engine.generation import (
    MLXGenerationOutput,
    OutputBuilder,
    request_processors,
)
from mlx_integrations.engine.jobs import Job
from mlx_integrations.engine.speculative.draft_model import DraftModel
from mlx_integrations.engine.speculative.pace import LookupPace


class Engine(Protocol):
    """What of a BatchedEngine the methods below use (their ``self``)."""

    _model: Any
    _options: BatchedOptions
    _prefill_step_size: int
    _shapes: PrefillShapes
    _prefix: PrefixCache
    _state_lock: threading.Lock
    _inbox: deque[Job]
    _arrivals: list[Job]
    _active: dict[int, Active]
    _generator: Any
    _samplers: SharedSamplers
    _solo: tuple[Active, SoloDecode] | None
    _solo_pace: LookupPace
    _solo_requests: int
    _solo_tokens: int
    _draft: DraftModel
    _spec: BatchSpeculation

    def _output_builder(self, job: Job, cached_tokens: int) -> OutputBuilder: ...
    def _finish(self, job: Job, result: MLXGenerationOutput | BaseException) -> None: ...
    def _fail(self, job: Job, exc: Exception) -> None: ...
    def _insert_active(
        self, act: Active, prompt: list[int], cache: list[Any] | None, cached: list[int]
    ) -> None: ...
    def _own_cache(self, cache: list[Any] | None) -> list[Any]: ...
    def _solo_decode(
        self, act: Active, context: list[int], reused: int, cache: list[Any], fresh: bool = True
    ) -> SoloDecode: ...
    def _hand_out(self, steps: list[Step]) -> bool: ...
    def _end_solo(self, out: MLXGenerationOutput) -> None: ...


class LoneRequests:
    """The part of :class:`~.engine.BatchedEngine` that runs a request alone.

    Its methods use the engine's state: ``self`` is typed as :class:`Engine`.
    """

    _solo: tuple[Active, SoloDecode] | None

    def _start_solo(self: Engine, job: Job) -> bool:
        """Decode ``job`` outside the batch while it is alone; False when it cannot."""
        p = job.params
        if request_processors(p):
            return False  # the batch runs processors with their token context
        cache, reused = self._prefix.take(job.tokens, self._shapes.key_step)
        cache = self._own_cache(cache)
        if not all(hasattr(layer, "merge") for layer in cache):
            self._prefix.put(job.tokens[:reused], cache)
            return False  # it could not join a batch later
        act = Active(job, self._output_builder(job, reused), None, self._samplers.for_request(p))
        solo = self._solo_decode(act, job.tokens, reused, cache, fresh=False)
        self._solo = (act, solo)
        with self._state_lock:
            self._solo_requests += 1
        return True

    def _go_solo(self: Engine, uid: int, act: Active) -> None:
        """The batch is down to one sequence and nothing waits: it goes on alone.

        Its next token, sampled in the step just run, is sampled again from the same
        cache; a seeded request stays, so its draws do not depend on the others.
        """
        from mlx_lm.models.cache import trim_prompt_cache

        p = act.job.params
        if act.processors is not None or p.sampling.seed is not None or not act.builder.tokens:
            return
        with self._state_lock:
            if self._inbox or self._arrivals:
                return
        # Still in _active until it is alone: a failure here ends it through _reset.
        cache, _ = self._generator.remove([uid], return_prompt_caches=True)[uid]
        context = act.job.tokens + act.builder.tokens
        keep = min(cache_offset(cache), len(context) - 1)
        trim_prompt_cache(cache, cache_offset(cache) - keep)
        solo = self._solo_decode(act, context, keep, cache)
        del self._active[uid]
        self._solo = (act, solo)
        with self._state_lock:
            self._solo_requests += 1

    def _own_cache(self: Engine, cache: list[Any] | None) -> list[Any]:
        """A request's KV cache (fresh for None), quantized from its first token with kv_bits."""
        from mlx_integrations.engine.batched.kv_cache import request_cache

        return request_cache(self._model, cache, self._options.kv_bits, self._options.kv_group_size)

    def _solo_decode(
        self: Engine,
        act: Active,
        context: list[int],
        reused: int,
        cache: list[Any],
        fresh: bool = True,
    ) -> SoloDecode:
        """The loop of a request going on alone; it drafts where its cache can be trimmed.

        A new request (not ``fresh``) takes the draft cache of the last one alone, cut to
        what they share, as the target's prefix cache does.
        """
        from mlx_lm.models.cache import can_trim_prompt_cache
        from mlx_lm.sample_utils import make_sampler

        trim, opts = can_trim_prompt_cache(cache), self._options
        draft, fed = None, 0
        if trim and self._draft.model is not None and not fresh:
            draft, fed = self._draft.cache.take_shared(self._draft.model, context[:-1])
        return SoloDecode(
            self._model,
            context,
            reused,
            cache,
            sampler=act.sampler.sampler if act.sampler is not None else make_sampler(0.0),
            max_tokens=act.job.params.max_tokens - len(act.builder.tokens),
            prefill_step_size=self._prefill_step_size,
            prompt_lookup=opts.prompt_lookup if trim else 0,
            draft_model=self._draft.model if trim else None,
            num_draft_tokens=opts.num_draft_tokens,
            draft_cache=draft,
            draft_fed=fed,
            pace=None if act.job.params.seeded_sampling else self._solo_pace,
            shapes=self._shapes,
        )

    def _solo_step(self: Engine) -> None:
        assert self._solo is not None
        act, solo = self._solo
        try:
            steps = solo.step()
        except Exception as exc:
            self._solo = None
            self._fail(act.job, exc)
            return
        self._hand_out(steps)

    def _hand_out(self: Engine, steps: list[Step]) -> bool:
        """Give the lone request its tokens; True when it ended."""
        assert self._solo is not None
        act = self._solo[0]
        for token, drafted, accepted in steps:
            with self._state_lock:
                self._solo_tokens += 1
            act.builder.drafted += drafted
            act.builder.accepted += accepted
            out = act.builder.add(token)
            if act.builder.finished:
                assert out is not None
                self._end_solo(out)
                return True
            if out is not None:
                act.job.emit(out)
        return False

    def _end_solo(self: Engine, out: MLXGenerationOutput) -> None:
        assert self._solo is not None
        act, solo = self._solo
        self._solo = None
        draft = solo.close()  # a paused draft round drops its rejected drafts from the cache
        context = act.job.tokens + act.builder.tokens
        self._prefix.put(context, solo.cache, **act.served())
        if draft is not None:
            self._draft.cache.put(context, draft)
        self._finish(act.job, out)

    def _join_solo(self: Engine) -> None:
        """Another request arrived: the lone one goes on inside the batch."""
        assert self._solo is not None
        act, solo = self._solo
        try:
            steps, prompt, cached = solo.handoff()
            if self._hand_out(steps):
                return  # it ended there
            self._solo = None
            self._insert_active(act, prompt, solo.cache, cached)
        except Exception as exc:
            self._solo = None
            self._fail(act.job, exc)
            return
        self._spec.admitted(self._model, act.job.params, False)
