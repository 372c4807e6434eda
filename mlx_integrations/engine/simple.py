"""SimpleEngine: one request at a time on mlx-lm, with KV reuse across requests."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from mlx_integrations.engine.generation import MLXGenerationOutput
from mlx_integrations.engine.jobs import Job, aborted_output
from mlx_integrations.engine.mlx_engine import MLXEngine
from mlx_integrations.engine.random_state import repair_random_state

logger = logging.getLogger(__name__)


class SimpleEngine(MLXEngine):
    """Serve one model, one request at a time, on a thread that owns the model.

    Requests that arrive while one runs wait in line (or, with
    ``admission="fail_fast"``, are refused with :class:`EngineBusy`). The context
    window, sampling limits and failures behave as described in :class:`MLXEngine`.

    Example:
        >>> import asyncio
        >>> from mlx_integrations.engine import SimpleEngine
        >>> async def main():
        ...     engine = SimpleEngine("path/to/mlx-model")
        ...     messages = [{"role": "user", "content": "What is the capital of France?"}]
        ...     async for out in engine.stream_chat(messages, max_tokens=32, temperature=0):
        ...         print(out.new_text, end="", flush=True)
        ...     await engine.stop()
        >>> asyncio.run(main())  # doctest: +SKIP

    Args:
        model: A model folder, or a name the model store resolves.
        options: How the engine serves the model
            (:class:`~mlx_integrations.engine.options.EngineOptions`).
        **kwargs: Fields of ``EngineOptions`` as keywords (``admission``,
            ``cache_memory_mb``, ``prefill_step_size``...); they override ``options``.
    """

    engine_type = "simple"

    def _is_full(self) -> bool:
        return bool(self._jobs)

    def _busy_message(self) -> str:
        return (
            f"SimpleEngine for {self._name!r} is serving another request; retry later "
            "or create the engine with admission='wait' to queue requests"
        )

    def _dispatch(self, executor: ThreadPoolExecutor, job: Job) -> None:
        # The executor's single worker is the owner thread; its queue is the wait line.
        executor.submit(self._execute, job)

    def _execute(self, job: Job) -> None:
        """Run one request to its end on the owner thread."""
        if job.abort.is_set():
            self._finish(job, aborted_output(job))
            return
        self._mark_running(job)
        result: MLXGenerationOutput | BaseException
        try:
            result = self._generate(job)
        except Exception as exc:
            # The request's KV cache is dropped (never stored half-updated, see
            # _generate); MLX's random state may need a reseed before the next one.
            logger.debug("Request %s failed", job.params.request_id, exc_info=True)
            repair_random_state()
            result = exc
        self._finish(job, result)

    def _generate(self, job: Job) -> MLXGenerationOutput:
        import mlx.core as mx
        from mlx_lm.generate import generate_step
        from mlx_lm.models.cache import make_prompt_cache
        from mlx_lm.sample_utils import make_sampler

        p = job.params
        cache, reused = self._prefix.take(job.tokens)
        if cache is None:
            cache = make_prompt_cache(self._model)
        if p.seed is not None:
            mx.random.seed(p.seed)
        sampler = make_sampler(p.temperature, top_p=p.top_p, min_p=p.min_p, top_k=p.top_k)
        processors = self._logits_processors(p)
        builder = self._output_builder(job, reused)
        steps = generate_step(
            mx.array(job.tokens[reused:]),
            self._model,
            max_tokens=p.max_tokens,
            sampler=sampler,
            logits_processors=processors or None,
            prompt_cache=cache,
            prefill_step_size=self._prefill_step_size,
        )
        reusable = False
        final: MLXGenerationOutput | None = None
        try:
            for token, _ in steps:
                out = builder.add(int(token))
                if builder.finished:
                    final = out
                    break
                if out is not None:
                    job.emit(out)
                if job.abort.is_set():
                    final = builder.finish("abort")
                    break
            if final is None:
                final = builder.finish("length")
            reusable = True
        finally:
            steps.close()
            if reusable:
                # The cache holds the prompt and the sampled tokens it has seen.
                self._prefix.put(job.tokens + builder.tokens, cache)
        return final
