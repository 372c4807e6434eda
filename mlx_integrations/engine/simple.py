"""SimpleEngine: one request at a time on mlx-lm, with KV reuse across requests."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

from mlx_integrations.engine.cache.kv_quantization import (
    check_kv_at_load,
    maybe_quantize,
)
from mlx_integrations.engine.cache.prefix_cache import cache_nbytes
from mlx_integrations.engine.decoding import Step, plain_steps, stoppable
from mlx_integrations.engine.generation import MLXGenerationOutput, request_processors
from mlx_integrations.engine.jobs import Job
from mlx_integrations.engine.options import EngineOptions
from mlx_integrations.engine.serial import SerialEngine
from mlx_integrations.engine.speculative.draft_model import DraftModel, draft_model_steps
from mlx_integrations.engine.speculative.pace import LookupPace
from mlx_integrations.engine.speculative.prompt_lookup import prompt_lookup_steps
from mlx_integrations.engine.stats import ClearStats
from mlx_integrations.engine.vision.vlm import (
    VisionInputs,
    VisionRun,
    prepare_vision_prompt,
    vision_steps,
    with_prompt,
)

logger = logging.getLogger(__name__)


class SimpleEngine(SerialEngine):
    """Serve one model, one request at a time, on a thread that owns the model.

    Requests that arrive while one runs wait in line (or, with
    ``admission="fail_fast"``, are refused with :class:`EngineBusy`). The context
    window, sampling limits and failures behave as described in :class:`MLXEngine`.

    Speculative decoding (``draft_model=...`` or ``prompt_lookup=N``; see
    :mod:`~mlx_integrations.engine.speculative`) drafts tokens that the model verifies
    several at a time. Greedy replies are token for token those of plain decoding;
    with ``temperature > 0`` a draft is kept only when it equals the token the model
    samples at its position, so replies follow the model's own distribution. A request
    with logits processors (penalties, ``logit_bias``, constraints such as tool choice
    or ``response_format``, the caller's own) decodes without speculation, since
    processors that keep state cannot be run over drafts that are then rejected.
    Every chunk carries the cumulative ``mtp_drafts`` and ``mtp_accepted``.

    A vision-language model (a folder whose config.json has a ``vision_config``) is
    served through mlx-vlm (:mod:`~mlx_integrations.engine.vision.vlm`): ``is_mllm`` is
    True, ``chat`` takes ``images``/``videos`` and image/video parts in messages, and the
    next turn about the same images reuses the previous turn's KV cache. Speculative
    decoding is refused for it.

    A quantized KV cache (``kv_bits=4`` or ``8``; see
    :mod:`~mlx_integrations.engine.cache.kv_quantization`) holds long contexts in a fraction
    of the memory; the prefix cache keeps and reuses quantized entries at their real
    size. It works with prompt lookup, and with a draft model when quantized from the
    first token (``quantized_kv_start=0``).

    Examples:
        >>> import asyncio
        >>> from mlx_integrations.engine import SimpleEngine
        >>> async def main():
        ...     engine = SimpleEngine("path/to/mlx-model")
        ...     messages = [{"role": "user", "content": "What is the capital of France?"}]
        ...     async for out in engine.stream_chat(messages, max_tokens=32, temperature=0):
        ...         print(out.new_text, end="", flush=True)
        ...     await engine.stop()
        >>> asyncio.run(main())  # doctest: +SKIP
        >>> fast_quotes = SimpleEngine("path/to/mlx-model", prompt_lookup=4)  # doctest: +SKIP
        >>> for_a_while = SimpleEngine("path/to/mlx-model", keep_alive="5m")  # doctest: +SKIP
        >>> small_kv = SimpleEngine("path/to/mlx-model", kv_bits=8)  # doctest: +SKIP

    Args:
        model: A model folder, or a name the model store resolves.
        options: How the engine serves the model
            (:class:`~mlx_integrations.engine.options.EngineOptions`).
        **kwargs: Fields of ``EngineOptions`` as keywords (``admission``,
            ``cache_memory_mb``, ``prefill_step_size``, ``draft_model``,
            ``num_draft_tokens``, ``prompt_lookup``, ``kv_bits``...); they override
            ``options``. And ``keep_alive`` and ``pinned``, the model's residency
            (:class:`~mlx_integrations.engine.mlx_engine.MLXEngine`).

    Raises:
        FileNotFoundError: The model or the draft model is not found.
        ValueError: A draft model whose vocabulary differs from the model's, or a
            ``kv_group_size`` that does not divide the model's head size (at load).
    """

    engine_type = "simple"

    def __init__(self, model: str | Path, *, options: EngineOptions | None = None, **kwargs: Any):
        super().__init__(model, options=options, **kwargs)
        self._draft = DraftModel(self._options.draft_model)
        # Whether prompt lookup's rounds or plain steps emit faster here (owner thread).
        self._pace = LookupPace()
        # Vision models: the last request's tokens and KV (mlx-vlm's PromptCacheState).
        self._vision_turn: Any = None
        self._turn_media: list[str] = []  # the digests of its images and videos
        if self._vision and self._options.speculation != "off":
            raise ValueError(
                f"{self._name!r} is a vision-language model; speculative decoding "
                "(draft_model, prompt_lookup) is for text models only: drop the option"
            )

    def _load(self) -> None:
        super()._load()
        opts = self._options
        try:
            check_kv_at_load(self._model, opts.kv_bits, opts.kv_group_size, self._name)
            self._reset_vision_turn()
            self._draft.load(self._tokenizer)
            self._warm_up()
        except BaseException:
            self._unload()  # nothing half-loaded stays: the next request loads again
            raise

    def _reset_vision_turn(self) -> None:
        """Forget the last vision request's KV (a fresh state, or none when caching is off)."""
        self._vision_turn, self._turn_media = None, []
        self._prefix.hold_outside(0)
        if self._loaded_vision is not None and self._options.cache_memory_mb > 0:
            from mlx_vlm.generate import PromptCacheState

            self._vision_turn = PromptCacheState()

    def _unload(self) -> None:
        self._vision_turn = None
        self._draft.unload()
        super()._unload()

    def _clear(self) -> ClearStats:
        self._draft.cache.clear()
        # Let go of the previous vision turn before MLX's buffers are freed; the prefix
        # cache's clear counts its bytes.
        self._vision_turn, self._turn_media = None, []
        cleared = super()._clear()
        self._reset_vision_turn()
        return cleared

    def _busy_message(self) -> str:
        return (
            f"SimpleEngine for {self._name!r} is serving another request; retry later "
            "or create the engine with admission='wait' to queue requests"
        )

    def _generate(self, job: Job) -> MLXGenerationOutput:
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache
        from mlx_lm.sample_utils import make_sampler

        p = job.params
        if self._loaded_vision is not None:
            # The processor expands the images into the prompt here, on the owner thread.
            media = job.media if job.media is not None else VisionInputs()  # a raw prompt
            job.tokens, inputs = prepare_vision_prompt(self._loaded_vision, job.prompt, media)
            self._check_window(job)
            cache, reused = None, 0
        else:
            cache, reused = self._prefix.take(job.tokens, self._shapes.key_step)
            if cache is None:
                cache = make_prompt_cache(self._model)
            quantize = self._quantize()
            if quantize is not None:
                # Before the first prefill step (mlx-lm quantizes after it), so the reply
                # does not depend on how much of the prompt came from the prefix cache.
                quantize(cache)
        s = p.sampling
        if s.seed is not None:
            mx.random.seed(s.seed)
        sampler = make_sampler(s.temperature, top_p=s.top_p, min_p=s.min_p, top_k=s.top_k)
        processors = request_processors(p)
        builder = self._output_builder(job, reused)
        draft_cache: list[Any] | None = None
        run = VisionRun()
        if cache is None:
            keys = media.keys
            if keys[: len(self._turn_media)] != self._turn_media:
                self._reset_vision_turn()  # other images than the cached turn's
            steps = vision_steps(
                self._loaded_vision,  # type: ignore[arg-type]
                job.prompt,
                inputs,
                processors=with_prompt(processors, job.tokens),
                max_tokens=p.max_tokens,
                sampler=sampler,
                prefill_step_size=self._prefill_step_size,
                kv_options=self._options.vision_kv_options(),
                turn=self._vision_turn,
                run=run,
            )
        else:
            steps, draft_cache = self._steps(job, cache, reused, sampler, processors)
        reusable = False
        final: MLXGenerationOutput | None = None
        try:
            for token, drafted, accepted in stoppable(steps, job.abort.is_set):
                builder.drafted += drafted
                builder.accepted += accepted
                if run.cached_tokens:  # a vision prompt extending the previous turn
                    builder.cached_tokens = run.cached_tokens
                out = builder.add(token)
                if builder.finished:
                    final = out
                    break
                if out is not None:
                    job.emit(out)
                if job.abort.is_set():
                    final = builder.finish("abort")
                    break
            if final is None:  # the tokens ran out, or the prefill stopped
                final = builder.finish("abort" if job.abort.is_set() else "length")
            # A prefill that stopped keeps what it fed: the entry holds those tokens.
            reusable = True
        finally:
            steps.close()
            if self._vision_turn is not None:
                self._prefix.count_lookup(run.cached_tokens)
                # The cache holds the prompt and every token fed back, within the budget.
                fits = run.cache is not None and self._prefix.hold_outside(cache_nbytes(run.cache))
                if reusable and fits:
                    self._vision_turn.update(job.tokens + builder.tokens, run.cache)
                    self._turn_media = list(keys)
                else:  # too large, or trimmed for this request but not finished: drop it
                    self._reset_vision_turn()
            reusable = reusable and cache is not None
            if reusable and cache is not None:
                # The cache holds the prompt and the sampled tokens it has seen.
                context = job.tokens + builder.tokens
                self._prefix.put(context, cache, prompt=len(job.tokens), reused=reused)
                if draft_cache is not None:
                    self._draft.cache.put(job.tokens + builder.tokens, draft_cache)
        return final

    def _check_window(self, job: Job) -> None:
        """A vision prompt, its images expanded, must leave room for a reply."""
        window, n = self._context_length, len(job.tokens)
        if window and n >= window:
            raise ValueError(
                f"The prompt has {n} tokens with its images expanded, more than the context "
                f"window of {self._name!r} ({window}); send fewer or smaller images"
            )
        if window:
            job.params.max_tokens = min(job.params.max_tokens, window - n)

    def _steps(
        self,
        job: Job,
        cache: list[Any],
        reused: int,
        sampler: Callable[[Any], Any],
        processors: list[Callable[..., Any]],
    ) -> tuple[Generator[Step, None, None], list[Any] | None]:
        """The request's decode loop, and the draft model's cache when one drafts."""
        from mlx_lm.models.cache import can_trim_prompt_cache

        p, opts = job.params, self._options
        # Speculation rewinds the cache over rejected drafts, which processors that
        # keep state (constraints) cannot follow: such requests decode plainly.
        speculate = opts.speculation != "off" and not processors
        if speculate and not can_trim_prompt_cache(cache):
            logger.debug("%s: the KV cache cannot be trimmed; decoding plainly", self._name)
            speculate = False
        # What every decode loop takes beside the model and the cache.
        limits: dict[str, Any] = {
            "max_tokens": p.max_tokens,
            "sampler": sampler,
            "prefill_step_size": self._prefill_step_size,
        }
        if speculate and self._draft.model is not None:
            draft_cache = self._draft.cache.take(
                self._draft.model, job.tokens[:reused], self._prefill_step_size
            )
            steps = draft_model_steps(
                self._model,
                self._draft.model,
                job.tokens[reused:],
                cache,
                draft_cache,
                num_draft_tokens=opts.num_draft_tokens,
                **limits,
            )
            return steps, draft_cache
        if speculate and opts.prompt_lookup:
            steps = prompt_lookup_steps(
                self._model,
                job.tokens,
                len(job.tokens) - reused,
                cache,
                max_draft=opts.prompt_lookup,
                quantize=self._quantize(),
                pace=None if p.seeded_sampling else self._pace,
                **limits,
            )
            return steps, None
        steps = plain_steps(
            self._model,
            job.tokens,
            len(job.tokens) - reused,
            cache,
            processors=processors,
            quantize=self._quantize(),
            shapes=self._shapes,
            **limits,
        )
        return steps, None

    def _quantize(self) -> Callable[[list[Any]], None] | None:
        """What quantizes a request's KV cache in place, or None for a plain cache."""
        opts = self._options
        if opts.kv_bits is None:
            return None
        return functools.partial(
            maybe_quantize,
            kv_bits=opts.kv_bits,
            group_size=opts.kv_group_size,
            start=opts.quantized_kv_start,
        )
