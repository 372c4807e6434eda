"""One server's state, and the chat turn every wire format ends in.

The OpenAI and Anthropic translators read their request into the pieces of a chat-core
:class:`~mlx_integrations.chat.completion.ChatRequest`; :meth:`ServerState.chat_request`
fills in the defaults (the model's own sampling defaults, a reply up to the context
window), and :meth:`ServerState.turn` runs it through
:func:`~mlx_integrations.chat.completion.stream_chat_events`, the call the adapters
make, counting tokens and time to first token on the way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlx_integrations.chat.completion import ChatRequest, Finished, stream_chat_events
from mlx_integrations.chat.output_parser import Event
from mlx_integrations.engine.base import BaseEngine
from mlx_integrations.serve.config import ServeConfig
from mlx_integrations.serve.errors import APIError, api_error
from mlx_integrations.serve.metrics import Metrics
from mlx_integrations.serve.registry import ModelRegistry, Served
from mlx_integrations.serve.sse import closing

__all__ = ["ChatParts", "ServerState"]


@dataclass
class ChatParts:
    """A chat request as a wire format gives it, before the server's defaults.

    None for a sampling field means the request did not set it.
    """

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    options: dict[str, Any] = field(default_factory=dict)


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
        self.draining = False
        """Set on shutdown: new requests get 503 while replies in flight finish."""
        self.started_at = time.time()
        self._defaults: dict[Path, Any] = {}

    async def served(self, model: Any, kind: str = "chat") -> Served:
        """The engine of a request's ``model`` field (made on first use, off the loop)."""
        if not isinstance(model, str) or not model.strip():
            raise APIError(
                400,
                "'model' is required: a store alias (mlxi list), a pulled Hub id or a "
                "model folder (GET /v1/models lists them)",
                param="model",
            )
        return await asyncio.to_thread(self.registry.get, model, kind)  # type: ignore[arg-type]

    def chat_request(self, served: Served, parts: ChatParts) -> ChatRequest:
        """The chat-core request, with the model's sampling defaults where the request
        sets none (as vLLM reads ``generation_config.json``), else OpenAI's (1.0).

        Raises:
            APIError: 400 naming the bad tool, tool choice or sampling field.
        """
        defaults = self._generation_defaults(served.path)
        options = dict(parts.options)
        for name in ("top_k", "min_p", "repetition_penalty"):
            value = getattr(defaults, name, None) if defaults is not None else None
            if name not in options and value is not None:
                options[name] = value
        temperature = parts.temperature
        if temperature is None:
            temperature = getattr(defaults, "temperature", None)
            if defaults is not None and defaults.do_sample is False:
                temperature = 0.0
        top_p = parts.top_p if parts.top_p is not None else getattr(defaults, "top_p", None)
        max_tokens = parts.max_tokens or self.config.default_max_tokens
        if max_tokens is None:
            # Up to the context window: the engine stops there (finish_reason "length").
            max_tokens = getattr(served.engine, "context_length", None) or 4096
        parallel = parts.parallel_tool_calls
        if parallel is None:  # as the adapters: a forced call is one call unless asked
            parallel = parts.tool_choice in (None, "auto", "none")
        try:
            request = ChatRequest(
                messages=parts.messages,
                tools=parts.tools,
                tool_choice=parts.tool_choice,
                parallel_tool_calls=parallel,
                response_format=parts.response_format,
                max_tokens=max_tokens,
                temperature=1.0 if temperature is None else temperature,
                top_p=1.0 if top_p is None else top_p,
                stop=parts.stop,
                options=options,
                model=parts.model,
            )
            from mlx_integrations.settings.fields import validate_request_settings

            validate_request_settings(request)
        except (TypeError, ValueError) as exc:
            raise api_error(exc) from None
        return request

    def _generation_defaults(self, path: Path) -> Any:
        if path not in self._defaults:
            from mlx_integrations.models.info import generation_defaults

            try:
                self._defaults[path] = generation_defaults(path)
            except (OSError, ValueError):
                self._defaults[path] = None
        return self._defaults[path]

    async def turn(
        self, served: Served, request: ChatRequest, stream: bool
    ) -> AsyncIterator[Event | Finished]:
        """The chat turn's events, as the adapters get them; figures counted at the end.

        Closing this iterator early (a client gone) closes the turn, which stops the
        engine's request between two tokens.
        """
        started = time.perf_counter()
        first: float | None = None
        async with closing(stream_chat_events(served.engine, request, stream)) as events:
            async for event in events:
                if isinstance(event, Finished):
                    ttft = first if stream else (event.ttft_s or None)
                    self.metrics.finished(
                        served.name,
                        event.prompt_tokens,
                        event.completion_tokens,
                        event.cached_tokens,
                        ttft,
                    )
                elif first is None:
                    first = time.perf_counter() - started
                yield event
