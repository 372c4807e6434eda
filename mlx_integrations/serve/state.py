"""One server's state, and the chat turn every wire format ends in.

Each translator reads its protocol model into :class:`ChatParts`: the arguments of
:meth:`~mlx_integrations.chat.request.ChatRequest.build`, and where each field came
from in its request (:class:`~mlx_integrations.serve.paths.WirePaths`).
:meth:`ServerState.chat_request` fills in the defaults (the model's own sampling
defaults, a reply up to the context window) and builds the checked request;
:meth:`ServerState.turn` runs it through
:func:`~mlx_integrations.chat.completion.stream_chat_events`, the call the adapters
make, counting tokens and time to first token on the way. A bad value, found at
either step, is a 400 whose ``param`` is the field's path in the endpoint's API.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

from mlx_integrations.chat.completion import Finished, Logprobs, Started, stream_chat_events
from mlx_integrations.chat.output_parser import Event
from mlx_integrations.chat.reasoning import (
    EFFORT_LEVELS,
    ReasoningSwitch,
    apply_effort,
    reasoning_switch,
)
from mlx_integrations.chat.request import ChatRequest, RequestError
from mlx_integrations.engine.base import BaseEngine
from mlx_integrations.serve.config import ServeConfig
from mlx_integrations.serve.errors import APIError, api_error
from mlx_integrations.serve.metrics import Metrics
from mlx_integrations.serve.openai.response_store import ResponseStore
from mlx_integrations.serve.paths import WirePaths
from mlx_integrations.serve.registry import ModelRegistry, Served
from mlx_integrations.serve.sse import closing

__all__ = ["ChatParts", "ServerState", "nearest_effort", "reasoning_switch_of"]


@dataclass
class ChatParts:
    """A chat request as a wire format gives it, before the server's defaults.

    None means the request did not set the field.
    """

    model: str
    messages: list[dict[str, Any]]
    paths: WirePaths = field(default_factory=WirePaths)
    """Where each chat-core field came from in the request."""
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    reasoning_effort: str | None = None
    enable_thinking: bool | None = None
    thinking_budget: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "seed",
    "thinking_budget",
    "chat_template_kwargs",
)
"""The fields every wire format's request carries under the chat core's names."""


def sampling_fields(request: Any) -> dict[str, Any]:
    """The :data:`SAMPLING_FIELDS` a protocol model has, by name."""
    return {name: getattr(request, name, None) for name in SAMPLING_FIELDS}


def nearest_effort(level: str, switch: ReasoningSwitch) -> str | None:
    """The ``reasoning_effort`` to give a template for a client's ``level``: the level
    itself, or the nearest one the template takes that thinks (the higher one on a
    tie; Qwen3's template takes only "none" and "high"). None where the model cannot
    take it: it does not think, or ``level`` is "none" and its thinking cannot be
    turned off. Agents send an effort to every model; it is fitted, never refused.
    """
    if not switch.thinks:
        return None
    if level == "none":
        return level if level in switch.levels else None
    taken = [name for name in switch.levels if name != "none"] or [level]
    if level in taken:
        return level
    rank = EFFORT_LEVELS.index
    return min(taken, key=lambda name: (abs(rank(name) - rank(level)), -rank(name)))


async def reasoning_switch_of(served: Served) -> ReasoningSwitch:
    """How the served model's template switches thinking (reading its tokenizer may
    load it: off the event loop)."""
    return await asyncio.to_thread(lambda: reasoning_switch(served.engine.tokenizer))


class ServerState:
    """What the handlers of one app share: settings, models, figures, draining."""

    def __init__(
        self,
        config: ServeConfig,
        registry: ModelRegistry | None = None,
        engines: dict[str, BaseEngine] | None = None,
    ):
        self.config = config
        self.registry = registry or ModelRegistry(config, engines)
        self.metrics = Metrics()
        self.responses = ResponseStore(config.responses_store_size, config.responses_ttl_s)
        """The kept Responses (``store``), for ``previous_response_id``."""
        self.rerankers: dict[str, Any] = {}
        """The LLM rerankers made on chat models for ``/v1/rerank``, by model name."""
        self.draining = False
        """Set on shutdown: new requests get 503 while replies in flight finish."""
        self.stopping = asyncio.Event()
        """Set when the replies still running must end (Ctrl-C, or SIGTERM's
        ``shutdown_timeout_s`` passed): each stream ends with its API's closing event,
        an answer not begun gets 503; their engine requests are aborted."""
        self.started_at = time.time()
        self._defaults: dict[Path, Any] = {}

    async def served(self, model: str, kind: str | None = "chat") -> Served:
        """The engine of a request's ``model`` field (made on first use, off the loop);
        a model of another ``kind`` is a 400 (None takes any)."""
        if not model.strip():
            raise APIError(
                400,
                "'model' is required: a store alias (mlxi list), a pulled Hub id or a "
                "model folder (GET /v1/models lists them)",
                param="model",
            )
        return await asyncio.to_thread(self.registry.get, model, kind)  # type: ignore[arg-type]

    def chat_request(
        self, served: Served, parts: ChatParts, request_id: str | None = None
    ) -> ChatRequest:
        """The checked chat-core request, with the model's sampling defaults where the
        request sets none (as vLLM reads ``generation_config.json``), else OpenAI's (1.0).

        Raises:
            APIError: 400 whose ``param`` is the bad field's path in the request.
        """
        defaults = self._generation_defaults(served.path)

        def default(name: str) -> Any:
            value = getattr(parts, name)
            if value is None and defaults is not None:
                value = getattr(defaults, name, None)
            return value

        temperature = parts.temperature
        if temperature is None and defaults is not None:
            temperature = 0.0 if defaults.do_sample is False else defaults.temperature
        max_tokens = parts.max_tokens
        if max_tokens is None:
            max_tokens = self.config.default_max_tokens
        if max_tokens is None:
            # Up to the context window: the engine stops there (finish_reason "length").
            max_tokens = getattr(served.engine, "context_length", None) or 4096
        top_p = default("top_p")
        try:
            return ChatRequest.build(
                parts.messages,
                tools=parts.tools,
                tool_choice=parts.tool_choice,
                parallel_tool_calls=parts.parallel_tool_calls,
                response_format=parts.response_format,
                max_tokens=max_tokens,
                temperature=1.0 if temperature is None else temperature,
                top_p=1.0 if top_p is None else top_p,
                stop=parts.stop,
                top_k=default("top_k"),
                min_p=default("min_p"),
                repetition_penalty=default("repetition_penalty"),
                presence_penalty=parts.presence_penalty,
                frequency_penalty=parts.frequency_penalty,
                logit_bias=parts.logit_bias or None,
                seed=parts.seed,
                reasoning_effort=parts.reasoning_effort,
                enable_thinking=parts.enable_thinking,
                thinking_budget=parts.thinking_budget,
                chat_template_kwargs=parts.chat_template_kwargs or None,
                logprobs=parts.logprobs,
                top_logprobs=parts.top_logprobs,
                request_id=request_id,
                model=parts.model,
            )
        except (TypeError, ValueError) as exc:
            raise api_error(exc, paths=parts.paths) from None

    def _generation_defaults(self, path: Path) -> Any:
        if path not in self._defaults:
            from mlx_integrations.models.info import generation_defaults

            try:
                self._defaults[path] = generation_defaults(path)
            except (OSError, ValueError):
                self._defaults[path] = None
        return self._defaults[path]

    @overload
    def turn(
        self,
        served: Served,
        request: ChatRequest,
        stream: bool,
        paths: WirePaths,
        announce: Literal[False] = False,
        logprobs: Literal[False] = False,
    ) -> AsyncIterator[Event | Finished]: ...

    @overload
    def turn(
        self,
        served: Served,
        request: ChatRequest,
        stream: bool,
        paths: WirePaths,
        announce: bool,
        logprobs: Literal[False] = False,
    ) -> AsyncIterator[Event | Finished | Started]: ...

    @overload
    def turn(
        self,
        served: Served,
        request: ChatRequest,
        stream: bool,
        paths: WirePaths,
        announce: bool,
        logprobs: bool,
    ) -> AsyncIterator[Event | Finished | Started | Logprobs]: ...

    async def turn(
        self,
        served: Served,
        request: ChatRequest,
        stream: bool,
        paths: WirePaths,
        announce: bool = False,
        logprobs: bool = False,
    ) -> AsyncIterator[Event | Finished | Started | Logprobs]:
        """The chat turn's events, as the adapters get them; figures counted at the end.

        With ``announce`` (and ``stream``), the first event is :class:`Started`: the
        prompt is rendered and counted, and its prefill is about to begin (a stream's
        headers and first frame go out then). Closing this iterator early (a client
        gone) closes the turn, which stops the engine's request between two prefill
        pieces or two tokens. A bad value the engine finds (an image it cannot read, a
        prompt longer than the context) is raised as a 400 naming the field by its
        path in the request (``paths``). With ``logprobs`` (and ``stream``), where the
        request asked for them, a :class:`Logprobs` event follows the events of each
        engine chunk.
        """
        started = time.perf_counter()
        first: float | None = None
        events = stream_chat_events(
            served.engine, request, stream, announce=announce, logprob_events=logprobs
        )
        try:
            async with closing(events):
                async for event in events:
                    if isinstance(event, Logprobs):
                        if logprobs:
                            yield event
                        continue
                    if isinstance(event, Finished):
                        ttft = first if stream else (event.ttft_s or None)
                        self.metrics.finished(
                            served.name,
                            event.prompt_tokens,
                            event.completion_tokens,
                            event.cached_tokens,
                            ttft,
                        )
                    elif first is None and not isinstance(event, Started):
                        first = time.perf_counter() - started
                    yield event
        except RequestError as exc:
            raise api_error(exc, paths=paths) from None

    async def prompt_tokens(self, served: Served, request: ChatRequest, paths: WirePaths) -> int:
        """The tokens of the request's prompt through the model's chat template, tools
        included (what a reply's usage reports as prompt tokens).

        Raises:
            APIError: 400 for an engine that cannot render prompts, or a bad value
                found while rendering.
        """
        engine = served.engine
        render = getattr(engine, "render_prompt", None)
        if render is None:
            raise APIError(
                400,
                f"The engine of {served.name!r} cannot render prompts to count them",
                param="model",
            )

        def count() -> int:
            # The effort through the template's own switch, as the engine renders a call.
            messages, template_kwargs = apply_effort(
                engine.tokenizer,
                request.reasoning.effort,
                request.messages,
                request.template_kwargs(),
            )
            prompt = render(messages, tools=request.tools.openai_tools(), **template_kwargs)
            return len(engine.tokenizer.encode(prompt, add_special_tokens=False))

        try:
            return await asyncio.to_thread(count)
        except (TypeError, ValueError) as exc:
            raise api_error(exc, paths=paths) from None
