"""What the engines on mlx-lm share: loading, validation, chat rendering, the async bridge.

:class:`MLXEngine` owns one model on one owner thread and implements the contract's
request methods once. A subclass decides how requests run on that thread:
``SimpleEngine`` one after the other, ``BatchedEngine`` together in a decode batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from mlx_integrations.chat.fields import RequestError, check_logprobs, checking
from mlx_integrations.chat.media_parts import reject_media_for_text_model
from mlx_integrations.chat.messages import normalize_messages
from mlx_integrations.chat.reasoning import (
    apply_effort,
    opens_reasoning,
    reasoning_switch,
)
from mlx_integrations.chat.reasoning.room import reply_processors
from mlx_integrations.chat.request import ChatRequest, RequestEngine
from mlx_integrations.chat.template import (
    NO_TEMPLATE,
    TemplateCapabilities,
    probe_template,
    render_chat_prompt,
)
from mlx_integrations.chat.tool_formats import ToolFormat, detect_format
from mlx_integrations.engine.base import EngineBusy, GenerationOutput
from mlx_integrations.engine.cache.controls import CacheControls
from mlx_integrations.engine.cache.disk import open_disk_cache
from mlx_integrations.engine.cache.prefix_cache import MiB, PrefixCache
from mlx_integrations.engine.decoding import PrefillShapes, warm_shapes
from mlx_integrations.engine.generation import MLXGenerationOutput, OutputBuilder, last_chunk
from mlx_integrations.engine.jobs import Admission, Channel, Job, default_prefill_step_size
from mlx_integrations.engine.lifecycle import ModelLifecycle
from mlx_integrations.engine.logprobs import PromptLogprobs, PromptScorer
from mlx_integrations.engine.options import EngineOptions
from mlx_integrations.engine.params import (
    SamplingParams,
    check_raw_prompt,
    encode_raw_prompt,
    generate_params,
)
from mlx_integrations.engine.stats import (
    EngineStats,
    RequestTally,
    memory_stats,
)
from mlx_integrations.engine.vision.vlm import (
    LoadedVision,
    gather_media,
    is_vision_config,
    load_vision_model,
)
from mlx_integrations.models.lora.adapter import apply_adapter, check_text_model
from mlx_integrations.models.resolve import (
    check_model_dir,
    context_length,
    lease_model,
    resolve_model_path,
    vocab_size,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


class MLXEngine(CacheControls, ModelLifecycle, RequestEngine):
    """An engine serving one mlx-lm model from the thread that owns it.

    MLX arrays belong to the thread that made them, so one owner thread loads the
    weights and runs every prefill and decode step; callers talk to it through
    queues and never block their event loop.

    Subclasses implement :meth:`_dispatch` (hand a validated request to the owner
    thread) and :meth:`_is_full` (when ``admission="fail_fast"`` refuses work).

    Generation stops at the context window: prompt and reply together never exceed
    it, whatever ``max_tokens`` asks (the reply then ends with
    ``finish_reason="length"``). A ``top_k`` at or above the vocabulary size keeps
    every token (as 0 does); ``logit_bias`` ids outside the model's logits and
    non-finite numbers are refused with ``ValueError``. A failure inside a decode
    step (a custom logits processor raising) ends only that request: its KV cache is
    dropped, never stored in the prefix cache, and the engine keeps serving. A failed
    load keeps no owner thread and no lease; the next request loads again.

    The model loads at the first request (or :meth:`start`) and stays loaded until
    :meth:`stop`, or until it has been idle for ``keep_alive``; the next request then
    loads it again. Under a memory budget (``MLXI_MAX_MEMORY``) idle models of the
    process make room for it, and a request whose KV cache would not fit is refused
    with :class:`~mlx_integrations.runtime.residency.RequestTooLarge` before it runs
    (see :mod:`~mlx_integrations.engine.lifecycle`).

    Args:
        model: A model folder, or a name the model store resolves.
        options: How the engine serves the model (:class:`EngineOptions`).
        **kwargs: Fields of :class:`EngineOptions` as keywords (``admission``,
            ``cache_memory_mb``, ``prefill_step_size``...); they override ``options``.
        keep_alive: Seconds or a duration (``"5m"``) the model stays loaded after its
            last request; 0 unloads it when a request ends, -1 keeps it loaded; None
            (the default) follows ``MLXI_KEEP_ALIVE``, else keeps it loaded.
        pinned: Never unload the model to make room for another, nor when its
            keep-alive ends.
    """

    engine_type = "mlx"
    options_type: ClassVar[type[EngineOptions]] = EngineOptions
    """The options class of this engine type, checked once when the engine is made."""

    def __init__(
        self,
        model: str | Path,
        *,
        options: EngineOptions | None = None,
        keep_alive: Any = None,
        pinned: bool = False,
        **kwargs: Any,
    ):
        opts = self.options_type.build(options, kwargs)
        self._options = opts
        self._name = str(model)
        self._path = resolve_model_path(model)
        self._config = check_model_dir(self._path)
        # A vision-language model is served through mlx-vlm (see engine/vision/).
        self._vision = is_vision_config(self._config)
        check_text_model(self._config, self._name, opts.adapter_path)
        self._loaded_vision: LoadedVision | None = None
        self._lease: Any = None  # a store model is marked in use while loaded
        self._context_length = context_length(self._config)
        self._vocab_size = vocab_size(self._config)
        self._admission: Admission = opts.admission
        self._prefill_step_size = opts.prefill_step_size or default_prefill_step_size()
        self._shapes = PrefillShapes.for_engine(
            opts.prefill_buckets,
            self._prefill_step_size,
            self._context_length,
            opts.prefix_key_step,
        )
        self.warmup_seconds: float | None = None
        """Seconds the last load spent meeting the prefill shapes (``warmup_shapes``)."""
        self._chat_template_kwargs = dict(opts.chat_template_kwargs or {})
        self._tool_format: ToolFormat | None = None
        if opts.preserve_native_tool_format is not None:
            self._preserve_native_tool_format = bool(opts.preserve_native_tool_format)
        # A vision model's turns are kept outside the prefix cache: no disk tier for it.
        disk = None if self._vision else open_disk_cache(self._path, opts, self._prefill_step_size)
        self._prefix = PrefixCache(int(opts.cache_memory_mb * MiB), opts.max_cache_entries, disk)

        self._model: Any = None
        self._tokenizer: Any = None
        self._capabilities = NO_TEMPLATE
        self._jobs: dict[str, Job] = {}
        self._running: set[str] = set()
        self._started_at = time.monotonic()
        self._busy_rejections = 0
        self._tally = RequestTally()
        self._init_lifecycle(keep_alive, pinned)

    def __deepcopy__(self, memo: dict[int, Any]) -> MLXEngine:
        # An engine is a resource (weights, owner thread): copies of adapters share it.
        return self

    # ----------------------------------------------------------------- contract

    @property
    def model_name(self) -> str:
        return self._name

    @property
    def options(self) -> EngineOptions:
        """The options this engine serves with."""
        return self._options

    @property
    def model_path(self) -> Path:
        """The resolved local folder of the model."""
        return self._path

    @property
    def config(self) -> dict[str, Any]:
        """The model's config.json."""
        return dict(self._config)

    @property
    def context_length(self) -> int | None:
        """The context window from config.json, if it says."""
        return self._context_length

    @property
    def is_mllm(self) -> bool:
        """True for a vision-language model (config.json with a ``vision_config``)."""
        return self._vision

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self.prepare_for_start()
        return self._tokenizer

    @property
    def template_capabilities(self) -> TemplateCapabilities:
        """What the chat template renders (probed at load)."""
        if self._tokenizer is None:
            self.prepare_for_start()
        return self._capabilities

    @property
    def tool_format(self) -> ToolFormat:
        """The model's tool-call family (picked once, at load)."""
        if self._tokenizer is None:
            self.prepare_for_start()
        assert self._tool_format is not None
        return self._tool_format

    async def generate(
        self,
        prompt: str | Sequence[int],
        max_tokens: int = 256,
        temperature: float = 0.7,
        top_p: float = 0.9,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> GenerationOutput:
        args = (max_tokens, temperature, top_p, stop, kwargs)
        return await last_chunk(self._stream_text(prompt, *args, final_only=True))

    async def stream_generate(  # type: ignore[override]  # async generator, see base
        self,
        prompt: str | Sequence[int],
        max_tokens: int = 256,
        temperature: float = 0.7,
        top_p: float = 0.9,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[GenerationOutput]:
        async for out in self._stream_text(prompt, max_tokens, temperature, top_p, stop, kwargs):
            yield out

    async def _stream_text(
        self,
        prompt: str | Sequence[int],
        max_tokens: int,
        temperature: float,
        top_p: float,
        stop: list[str] | None,
        kwargs: dict[str, Any],
        final_only: bool = False,
    ) -> AsyncIterator[MLXGenerationOutput]:
        ids = check_raw_prompt(
            prompt, vocab_size=self._vocab_size, vision=self._vision, name=self._name
        )
        params = generate_params(max_tokens, temperature, top_p, stop, kwargs, self._vocab_size)
        with self._in_use():  # the model stays loaded from here to the last chunk
            await self.start()
            text, tokens = encode_raw_prompt(self._tokenizer, prompt, ids)
            self._within_window(tokens, "prompt")
            async for out in self._submit(params, text, tokens, final_only=final_only):
                yield out

    async def prompt_logprobs(
        self, prompt: str | Sequence[int], top_logprobs: int = 0
    ) -> PromptLogprobs:
        """Score a prompt (text, encoded as :meth:`generate` encodes it, or token ids):
        each token's log-probability given those before it, with the ``top_logprobs``
        most likely tokens of its position. It runs on the owner thread in pieces (a
        batch decodes a step between two) that a cancelled caller stops; its cache then
        serves the same prompt's next request from the prefix cache.

        Raises:
            RequestError: An empty prompt, a token id outside the vocabulary, a prompt
                past the context window, ``top_logprobs`` outside 0 to 20, a vision model.
        """
        top = check_logprobs(True, top_logprobs) or 0
        vocab, vision, name = self._vocab_size, self._vision, self._name
        ids = check_raw_prompt(prompt, vocab_size=vocab, vision=vision, name=name, scored=True)
        with self._in_use():
            await self.start()
            _, tokens = encode_raw_prompt(self._tokenizer, prompt, ids)
            self._within_window(tokens, "prompt", room=0)
            with self._state_lock:
                executor = self._executor
            if executor is None:
                raise RuntimeError(f"The engine for {self._name!r} is stopped; call start()")
            scorer = PromptScorer(self._model, tokens, top, self._prefill_step_size)
            keep = self._prefix.put if self._options.kv_bits is None else None  # plain KV
            try:
                for start in scorer.starts:  # a batch decodes a step between two pieces
                    await asyncio.wrap_future(
                        self._on_owner(executor, partial(scorer.score, start))
                    )
            finally:  # kept whole, or let go on the owner thread (a caller gone)
                finished = self._on_owner(executor, partial(scorer.finish, keep))
            await asyncio.wrap_future(finished)
        return PromptLogprobs(tokens, scorer.entries)

    def _within_window(self, tokens: list[int], path: str, room: int = 1) -> None:
        """The prompt must leave ``room`` tokens of the context window."""
        if self._context_length and len(tokens) > self._context_length - room:
            raise RequestError(
                f"The prompt has {len(tokens)} tokens, more than the context window of "
                f"{self._name!r} ({self._context_length}) allows; shorten the "
                + ("conversation" if path == "messages" else "prompt"),
                path,
            )

    async def chat(
        self,
        messages: list[dict[str, Any]],
        max_tokens: int = 256,
        temperature: float = 0.7,
        top_p: float = 0.9,
        tools: list[dict] | None = None,
        images: list[str] | None = None,
        videos: list[str] | None = None,
        **kwargs: Any,
    ) -> GenerationOutput:
        request = ChatRequest.from_kwargs(
            messages, max_tokens, temperature, top_p, tools, images, videos, **kwargs
        )
        return await last_chunk(self.stream_request(request, final_only=True))

    async def stream_chat(  # type: ignore[override]  # async generator, see base
        self,
        messages: list[dict[str, Any]],
        max_tokens: int = 256,
        temperature: float = 0.7,
        top_p: float = 0.9,
        tools: list[dict] | None = None,
        images: list[str] | None = None,
        videos: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[GenerationOutput]:
        request = ChatRequest.from_kwargs(
            messages, max_tokens, temperature, top_p, tools, images, videos, **kwargs
        )
        async for out in self.stream_request(request):
            yield out

    async def stream_request(
        self, request: ChatRequest, *, final_only: bool = False, announce: bool = False
    ) -> AsyncIterator[MLXGenerationOutput]:
        """Run a checked chat request (what ``chat``/``stream_chat`` build from their
        keywords) and stream its output; only the last chunk with ``final_only``. With
        ``announce``, first an empty chunk with the prompt's ``prompt_tokens``, sent once
        the request is admitted, before the prompt is processed.

        Raises:
            RequestError: What this model cannot take: media for a text model, a
                ``logit_bias`` id outside its vocabulary, a prompt past its context window.
        """
        messages = request.messages
        reject_media_for_text_model(
            messages, self._name, self._vision, request.images, request.videos
        )
        params = SamplingParams.for_request(request, self._vocab_size)
        media = None
        if self._vision:  # downloads and decoding, off the event loop
            limits = self._options.media_limits
            with checking("messages"):
                messages, media = await asyncio.to_thread(
                    gather_media, messages, list(request.images), list(request.videos), limits
                )
        tools = request.tools
        with self._in_use():  # the model stays loaded from here to the last chunk
            await self.start()
            fmt = request.tool_format
            if not isinstance(fmt, ToolFormat):
                fmt = detect_format(self._tokenizer, fmt) if fmt else self.tool_format
            messages, template_kwargs = apply_effort(  # the template's own switch
                self._tokenizer, request.reasoning.effort, messages, request.template_kwargs()
            )
            prompt = self._render(messages, tools.openai_tools(), fmt, template_kwargs)
            tokens = self._tokenizer.encode(prompt, add_special_tokens=False)
            in_reasoning = opens_reasoning(prompt, self._tokenizer)
            limit = params.max_tokens
            if self._context_length:
                limit = min(limit, self._context_length - len(tokens))
            shape = (self._tokenizer, prompt, fmt, request, limit, in_reasoning)
            if request.format_constraint is not None or tools.tools:
                # Off the event loop: building a grammar can take a moment.
                params.logits_processors += await asyncio.to_thread(reply_processors, *shape)
            else:  # at once, so that requests sent together arrive together
                params.logits_processors += reply_processors(*shape)
            params.record_logprobs(request.logprobs)  # after them: what they leave
            async for out in self._submit(params, prompt, tokens, media, final_only, announce):
                out.starts_in_reasoning = in_reasoning
                yield out

    def render_prompt(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_format: ToolFormat | None = None,
        **template_kwargs: Any,
    ) -> str:
        """Render messages with the model's chat template, as ``stream_chat`` does.

        The engine's own ``chat_template_kwargs`` apply first; ``template_kwargs`` win.
        """
        normalized = normalize_messages(messages, self._name, media=self._vision)
        return self._render(normalized, tools, tool_format, template_kwargs)

    def _render(
        self,
        normalized: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        tool_format: ToolFormat | None,
        template_kwargs: dict[str, Any],
    ) -> str:
        return render_chat_prompt(
            self.tokenizer,
            normalized,
            tools=tools,
            native_tool_format=self.preserve_native_tool_format,
            capabilities=self._capabilities,
            tool_format=tool_format or self.tool_format,
            **{**self._chat_template_kwargs, **template_kwargs},
        )

    async def abort_request(self, request_id: str) -> bool:
        """Stop a running request between two tokens, or drop a queued one.

        Returns:
            True if the request was running or queued, False for an unknown id.
        """
        with self._state_lock:
            job = self._jobs.get(request_id)
        if job is None:
            return False
        job.abort.set()  # the owner thread ends it at its next chance
        return True

    def get_stats(self) -> EngineStats:  # type: ignore[override]
        with self._state_lock:
            running, tally = len(self._running), self._tally
            return EngineStats(
                engine_type=self.engine_type,
                model_name=self._name,
                uptime_seconds=time.monotonic() - self._started_at,
                loaded=self._model is not None,
                running=bool(running),
                num_running=running,
                num_waiting=len(self._jobs) - running,
                num_requests_processed=tally.processed,
                num_requests_aborted=tally.aborted,
                num_requests_failed=tally.failed,
                total_prompt_tokens=tally.prompt_tokens,
                total_completion_tokens=tally.completion_tokens,
                total_cached_tokens=tally.cached_tokens,
                admission=self._admission,
                busy_rejections=self._busy_rejections,
                last_request=tally.last,
                speculative=self._options.speculative_stats(
                    tally.drafted_tokens, tally.accepted_tokens
                ),
                prefix_cache=self._prefix.stats(),
                memory=memory_stats(),
                residency=self._residency.stats(),
            )

    # ------------------------------------------------------- subclass hooks

    @abstractmethod
    def _dispatch(self, executor: ThreadPoolExecutor, job: Job) -> None:
        """Hand a request to the owner thread (called under the state lock).

        The request is registered right after; raising here refuses it.
        """

    @abstractmethod
    def _is_full(self) -> bool:
        """Whether a new request would have to wait (called under the state lock)."""

    def _busy_message(self) -> str:
        return (
            f"{type(self).__name__} for {self._name!r} is busy; retry later or create "
            "the engine with admission='wait' to queue requests"
        )

    def _on_owner(self, executor: ThreadPoolExecutor, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on the owner thread when it is free."""
        return executor.submit(fn)

    # ------------------------------------------------------------ internals

    def _load(self) -> None:
        import mlx_lm
        from mlx_lm.models.cache import make_prompt_cache

        self._lease = lease_model(self._path)
        tokenizer: Any
        try:
            if self._vision:
                self._loaded_vision = load_vision_model(self._path, self._name)
                model, tokenizer = self._loaded_vision.model, self._loaded_vision.tokenizer
            elif self._tokenizer is not None:
                # Loaded again after an idle unload: the tokenizer kept is the same
                # object, so what is cached for it (grammars, tool formats) stays valid.
                from mlx_lm.utils import load_model

                model, tokenizer = load_model(self._path)[0], self._tokenizer
            else:
                loaded = mlx_lm.load(str(self._path))
                model, tokenizer = loaded[0], loaded[1]
            if self._options.adapter_path is not None:  # at every load: an unload drops it
                model = apply_adapter(model, self._options.adapter_path, self._name)
            self._capabilities = probe_template(tokenizer)
            reasoning_switch(tokenizer)  # probed once too: requests read it from a cache
            self._tool_format = detect_format(tokenizer, self._options.tool_format)
            if self._options.preserve_native_tool_format is None:
                self._preserve_native_tool_format = self._capabilities.renders_tool_messages
            if self._vocab_size is None:  # config.json did not say: ask the model
                self._vocab_size = getattr(getattr(model, "args", None), "vocab_size", None)
            if self._prefix.disk is not None:
                self._prefix.disk.bind(make_prompt_cache(model))
            if self._options.load_warm_caches and self._options.adapter_path is None:
                self._prefix.load_warm(self._path)  # the base model's KV, not the adapter's
        except BaseException:
            self._loaded_vision = None
            self._release_lease()
            raise
        self._model, self._tokenizer = model, tokenizer

    def _warm_up(self) -> None:
        """Owner thread, once loaded: meet the padded prefill shapes (``warmup_shapes``;
        not for a vision model, which mlx-vlm prefills, nor a quantized KV cache)."""
        opts = self._options
        if self._shapes.warm(opts.warmup_shapes) and not self._vision and opts.kv_bits is None:
            self.warmup_seconds = warm_shapes(self._model, self._shapes, self._prefill_step_size)

    def _unload(self) -> None:
        import mlx.core as mx

        self._prefix.clear(keep_pinned=False)
        if self._prefix.disk is not None:
            self._prefix.disk.close()  # what is queued is written before the engine stops
        self._model = None
        # The tokenizer stays (plain Python, no MLX memory): rendering and counting need
        # no weights, and a caller reading it while the weights go must not load them
        # again outside a request.
        self._loaded_vision = None
        mx.clear_cache()
        self._release_lease()

    def _release_lease(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()

    async def _submit(
        self,
        params: SamplingParams,
        prompt: str,
        tokens: list[int],
        media: Any = None,
        final_only: bool = False,
        announce: bool = False,
    ) -> AsyncIterator[MLXGenerationOutput]:
        """Register a request, hand it to the owner thread and stream what it emits.

        A consumer that stops iterating (cancelled, closed, garbage collected) aborts
        its request; ``final_only`` (generate, chat) sends only the last chunk. With
        ``announce`` an empty chunk with the prompt's count comes first, once the
        request is admitted (what would refuse it has been checked).
        """
        self._within_window(tokens, "messages")
        if self._context_length:
            # Prompt and reply share the window: stop there with finish_reason="length".
            params.max_tokens = min(params.max_tokens, self._context_length - len(tokens))
        kv_bytes = await self._admit_kv(len(tokens), params.max_tokens)
        channel = Channel()
        arrival = time.perf_counter()
        job = Job(
            params, prompt, tokens, arrival, channel.emit, channel.abort, media, not final_only
        )
        with self._state_lock:
            if params.request_id in self._jobs:
                raise RequestError(
                    f"request_id {params.request_id!r} is already in use", "request_id"
                )
            if self._admission == "fail_fast" and self._is_full():
                self._busy_rejections += 1
                raise EngineBusy(self._busy_message())
            executor = self._executor
            if executor is None:
                raise RuntimeError(f"The engine for {self._name!r} is stopped; call start()")
            self._reserve_kv(params.request_id, kv_bytes)
            try:
                self._dispatch(executor, job)
            except BaseException:
                self._release_kv(params.request_id)
                raise
            self._jobs[params.request_id] = job
        if announce:
            try:
                yield MLXGenerationOutput(
                    text="", prompt_tokens=len(tokens), finish_reason=None, finished=False
                )
            except BaseException:  # the consumer left at once: its request ends too
                channel.abort.set()
                raise
        async for item in channel.receive():
            yield item

    def _output_builder(self, job: Job, cached_tokens: int) -> OutputBuilder:
        p = job.params
        return OutputBuilder(
            self._tokenizer,
            request_id=p.request_id,
            prompt_tokens=len(job.tokens),
            cached_tokens=cached_tokens,
            stop=p.stop,
            max_tokens=p.max_tokens,
            arrival=job.arrival,
            stream=job.stream,
            logprobs=p.logprobs,
        )

    def _mark_running(self, job: Job) -> None:
        with self._state_lock:
            self._running.add(job.params.request_id)

    def _finish(self, job: Job, result: MLXGenerationOutput | BaseException) -> None:
        """Count a request that ended, then hand its last chunk (or error) to the caller.

        The last chunk goes out after the bookkeeping, so a caller that has it sees
        the request gone from the engine and the stats up to date.
        """
        rid = job.params.request_id
        with self._state_lock:
            registered = self._jobs.pop(rid, None) is not None
            started = rid in self._running
            self._running.discard(rid)
            self._tally.record(rid, len(job.tokens), result, started)
        if registered:
            self._release_kv(rid)
        job.emit(result)
