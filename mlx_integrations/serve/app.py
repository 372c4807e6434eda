"""The ASGI application: routes, the API key, body limits, draining, figures.

=========================================  =============================================
``POST /v1/chat/completions``              OpenAI chat (streaming, tools, schemas)
``POST /v1/completions``                   OpenAI raw-text completion
``POST /v1/embeddings``                    OpenAI embeddings (embedding models)
``POST /v1/responses``                     OpenAI Responses (stateless)
``GET  /v1/models``, ``/v1/models/{id}``   the models requests may name
``POST /v1/messages``                      Anthropic Messages (streaming, tools, thinking)
``POST /v1/messages/count_tokens``         Anthropic token count
``GET  /health``                           200 while serving, 503 while draining
``GET  /metrics``                          Prometheus text format
``GET  /api/ps``                           models in memory (``mlxi ps``)
``POST /api/stop``                         unload a model (``mlxi stop``)
=========================================  =============================================
"""

from __future__ import annotations

import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlx_integrations.engine.base import BaseEngine
from mlx_integrations.serve import anthropic, openai_chat, openai_other, responses
from mlx_integrations.serve.config import (
    ServeConfig,
    apply_memory_budget,
    restore_memory_budget,
)
from mlx_integrations.serve.errors import (
    RETRY_AFTER_S,
    APIError,
    anthropic_error_body,
    api_error,
    openai_error_body,
)
from mlx_integrations.serve.sse import ClientGone
from mlx_integrations.serve.state import ServerState
from mlx_integrations.serve.wire import Body, parse_json

__all__ = ["create_app"]

Handler = Callable[[ServerState, Request], Awaitable[Response]]

# Endpoints that generate: the ones --max-concurrent-requests counts.
_GENERATING = {
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
}
_OPEN = {"/health"}  # answered without the API key


def _flavor(path: str) -> str:
    return "anthropic" if path.startswith("/v1/messages") else "openai"


def error_response(error: APIError, flavor: str) -> JSONResponse:
    """An error in the shape the endpoint's clients read."""
    body = anthropic_error_body(error) if flavor == "anthropic" else openai_error_body(error)
    return JSONResponse(body, status_code=error.status, headers=error.headers)


def _endpoint(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def run(request: Request) -> Response:
        state: ServerState = request.app.state.server
        path = request.url.path
        try:
            return await handler(state, request)
        except ClientGone:
            state.metrics.add("client_disconnects_total", endpoint=path)
            return Response(status_code=499)  # nobody reads it: the client has gone
        except Exception as exc:
            error = api_error(exc)
            if error.status in (429, 503):
                state.metrics.add("rejected_requests_total", reason=error.code or str(error.status))
            return error_response(error, _flavor(path))

    return run


class _Gate:
    """Checks before any handler runs (API key, draining, body size, concurrency),
    and the request counters and durations after."""

    def __init__(self, app: ASGIApp, state: ServerState):
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = self.state
        path = scope["path"]
        started = time.perf_counter()
        status = {"code": 500}

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                endpoint = path if path in _GENERATING or path in _KNOWN else "other"
                state.metrics.add("requests_total", endpoint=endpoint, status=str(status["code"]))
                state.metrics.observe(
                    "request_duration_seconds", time.perf_counter() - started, endpoint=endpoint
                )

        refusal = self._refusal(scope, path)
        if refusal is not None:
            if refusal.status in (429, 503):
                state.metrics.add("rejected_requests_total", reason=refusal.code or "")
            await error_response(refusal, _flavor(path))(scope, receive, counted_send)
            return
        limit = state.config.max_body_bytes
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _too_large(state.config.max_body_mb)
            return message

        generating = path in _GENERATING
        if generating:
            state.metrics.in_flight += 1
        try:
            await self.app(scope, limited_receive, counted_send)
        finally:
            if generating:
                state.metrics.in_flight -= 1

    def _refusal(self, scope: Scope, path: str) -> APIError | None:
        state = self.state
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        key = state.config.api_key
        if key and path not in _OPEN and not _key_matches(headers, key):
            return APIError(
                401,
                "Missing or wrong API key: send 'Authorization: Bearer KEY' (OpenAI clients) "
                "or 'x-api-key: KEY' (Anthropic clients), the key given to mlxi serve",
                code="invalid_api_key",
            )
        if state.draining and path not in _OPEN and path != "/metrics":
            return APIError(
                503,
                "The server is shutting down; send the request to another server or retry",
                code="shutting_down",
                retry_after=RETRY_AFTER_S,
            )
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > state.config.max_body_bytes:
            return _too_large(state.config.max_body_mb)
        cap = state.config.max_concurrent_requests
        if cap is not None and path in _GENERATING and state.metrics.in_flight >= cap:
            return APIError(
                429,
                f"The server is answering {cap} requests, its limit "
                "(--max-concurrent-requests); retry after a moment",
                code="too_many_requests",
                retry_after=RETRY_AFTER_S,
            )
        return None


def _key_matches(headers: dict[str, str], key: str) -> bool:
    given = headers.get("x-api-key") or ""
    auth = headers.get("authorization") or ""
    if auth.lower().startswith("bearer "):
        given = auth[7:].strip()
    return hmac.compare_digest(given.encode(), key.encode())


def _too_large(max_mb: float) -> APIError:
    return APIError(
        413,
        f"The request body is larger than {max_mb:g} MiB, this server's limit "
        "(--max-body-mb); send smaller images or start the server with a higher limit",
        code="request_too_large",
    )


# ------------------------------------------------------------ small endpoints


async def _health(state: ServerState, request: Request) -> Response:
    if state.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    return JSONResponse({"status": "ok"})


async def _metrics(state: ServerState, request: Request) -> Response:
    text = state.metrics.render(state.registry.served())
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")


async def _ps(state: ServerState, request: Request) -> Response:
    return JSONResponse({"models": state.registry.running()})


async def _stop(state: ServerState, request: Request) -> Response:
    name = request.path_params.get("model")
    if name is None:
        body = Body(parse_json(await request.body()))
        name = body.required("model", str)
    return JSONResponse(await state.registry.stop(name))


_ROUTES: list[tuple[str, Handler, list[str]]] = [
    ("/health", _health, ["GET"]),
    ("/metrics", _metrics, ["GET"]),
    ("/v1/chat/completions", openai_chat.chat_completions, ["POST"]),
    ("/v1/completions", openai_other.completions, ["POST"]),
    ("/v1/embeddings", openai_other.embeddings, ["POST"]),
    ("/v1/responses", responses.responses, ["POST"]),
    ("/v1/models", openai_other.list_models, ["GET"]),
    ("/v1/models/{model:path}/unload", _stop, ["POST"]),
    ("/v1/models/{model:path}", openai_other.get_model, ["GET"]),
    ("/v1/messages", anthropic.messages, ["POST"]),
    ("/v1/messages/count_tokens", anthropic.count_tokens, ["POST"]),
    ("/api/ps", _ps, ["GET"]),
    ("/api/stop", _stop, ["POST"]),
]
_KNOWN = {path for path, _, _ in _ROUTES if "{" not in path}


def create_app(
    config: ServeConfig | None = None,
    *,
    state: ServerState | None = None,
    engines: dict[str, BaseEngine] | None = None,
    preload: bool = True,
) -> Starlette:
    """The server's ASGI application (run it with uvicorn, or :func:`~.server.serve`).

    Args:
        config: The settings; the defaults when None.
        state: A state made beforehand (its models already loaded); ``config`` is
            then ignored.
        engines: Engines to serve under the given names (any ``BaseEngine``).
        preload: Set ``max_memory`` and load the ``preload`` models when the app starts
            (its lifespan).

    Examples:
        >>> from mlx_integrations.serve import ServeConfig, create_app
        >>> app = create_app(ServeConfig(api_key="secret"))
        >>> # uvicorn.run(app, host="127.0.0.1", port=8000)
    """
    if state is None:
        state = ServerState(config or ServeConfig(), engines=engines)
    served_state = state

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        budget = apply_memory_budget(served_state.config) if preload else (False, None)
        try:
            if preload:
                await served_state.registry.preload()
            yield
        finally:
            served_state.registry.close()
            restore_memory_budget(budget)

    routes = [
        Route(path, _endpoint(handler), methods=methods) for path, handler, methods in _ROUTES
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.server = state
    app.add_middleware(_Gate, state=state)
    app.router.default = _not_found
    return app


async def _not_found(scope: Scope, receive: Receive, send: Send) -> None:
    path = scope.get("path", "")
    error = APIError(
        404,
        f"No endpoint {scope.get('method', '')} {path}; the endpoints are under /v1 "
        "(chat/completions, completions, embeddings, responses, models, messages), and "
        "/health, /metrics, /api/ps, /api/stop",
        code="unknown_endpoint",
    )
    response: Any = error_response(error, _flavor(path))
    await response(scope, receive, send)
