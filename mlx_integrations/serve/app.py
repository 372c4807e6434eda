"""The ASGI application: routes, the API key, body limits, draining, figures.

=========================================  =============================================
``POST /v1/chat/completions``              OpenAI chat (streaming, tools, schemas)
``POST /v1/completions``                   OpenAI raw-text completion
``POST /v1/embeddings``                    OpenAI embeddings (embedding models)
``POST /v1/responses``                     OpenAI Responses (kept for
                                           ``previous_response_id`` unless ``store``
                                           is false)
``GET|DELETE /v1/responses/{id}``          a kept response
``POST /v1/rerank``, ``/rerank``           rerank documents (Jina's and Cohere's
``/v2/rerank``                             shapes; Cohere v2's)
``GET  /v1/models``, ``/v1/models/{id}``   the models requests may name
``POST /v1/messages``                      Anthropic Messages (streaming, tools, thinking)
``POST /v1/messages/count_tokens``         Anthropic token count
``GET  /health``                           200 while serving, 503 while draining
``GET  /metrics``                          Prometheus text format
``POST /api/stop``                         unload a model (``mlxi stop``)
``/api/chat``, ``/api/generate``...        Ollama's API (:mod:`.ollama`); ``/api/ps`` is
                                           also ``mlxi ps``'s, ``GET /`` says
                                           ``Ollama is running``
``GET  /openapi.json``, ``/docs``          the schema, generated from the protocol models
=========================================  =============================================

FastAPI rather than Starlette alone: the same Pydantic models that check a request
give the OpenAPI schema and its interactive page, so the schema cannot drift from
what the server takes.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import mlx_integrations
from mlx_integrations.engine.base import BaseEngine
from mlx_integrations.serve import anthropic, ollama, rerank
from mlx_integrations.serve.config import (
    ServeConfig,
    apply_memory_budget,
    restore_memory_budget,
)
from mlx_integrations.serve.errors import (
    RETRY_AFTER_S,
    APIError,
    ServerStopping,
    anthropic_error_body,
    api_error,
    openai_error_body,
    validation_error,
)
from mlx_integrations.serve.openai import chat as openai_chat
from mlx_integrations.serve.openai import (
    completions,
    embeddings,
    models,
    response_store,
    responses,
)
from mlx_integrations.serve.protocol import anthropic as anthropic_wire
from mlx_integrations.serve.protocol import openai as openai_wire
from mlx_integrations.serve.protocol import rerank as rerank_wire
from mlx_integrations.serve.protocol.base import ReplyModel, WireModel, field_errors
from mlx_integrations.serve.sse import ClientGone
from mlx_integrations.serve.state import ServerState

__all__ = ["create_app"]

# Endpoints that generate: the ones --max-concurrent-requests counts.
_GENERATING = {
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
    "/v1/rerank",
    "/rerank",
    "/v2/rerank",
    *ollama.GENERATING,
}
# Answered without the API key: health, and the schema and its pages (no secrets there).
_OPEN = {"/", "/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
# Counted under their own path in the figures (any other path counts as "other").
_KNOWN = {"/", "/health", "/metrics", "/v1/models", "/api/stop", *ollama.PATHS}


def _flavor(path: str) -> str:
    if ollama.is_ollama_path(path):
        return "ollama"
    return "anthropic" if path.startswith("/v1/messages") else "openai"


def error_response(error: APIError, flavor: str) -> Response:
    """An error in the shape the endpoint's clients read."""
    body: ReplyModel
    if flavor == "ollama":
        body = ollama.error_body(error)
    elif flavor == "anthropic":
        body = anthropic_error_body(error)
    else:
        body = openai_error_body(error)
    return Response(
        body.model_dump_json(),
        status_code=error.status,
        headers=error.headers,
        media_type="application/json",
    )


async def _invalid(exc: RequestValidationError, request: Request) -> APIError:
    """A 400 for a body its protocol model refused, naming the first bad field's path."""
    errors = list(exc.errors())
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return APIError(400, f"The request body is not valid JSON: {detail}".rstrip(": "))
    if tuple(first.get("loc", ())) == ("body",) and first.get("type") == "missing":
        return APIError(400, "The request body is empty; send a JSON object")
    try:
        data = await request.json()
    except ValueError:
        data = None
    body_errors = [{**e, "loc": tuple(e.get("loc", ()))[1:]} for e in errors]
    return validation_error(field_errors(body_errors, data))


class _Route(APIRoute):
    """A route whose every failure answers in its API's error shape: a refused body
    names the field's path, other errors go through :func:`api_error`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        flavor = _flavor(self.path)
        path = self.path

        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except ClientGone:
                state: ServerState = request.app.state.server
                state.metrics.add("client_disconnects_total", endpoint=path)
                return Response(status_code=499)  # nobody reads it: the client has gone
            except RequestValidationError as exc:
                error = await _invalid(exc, request)
            except HTTPException as exc:  # FastAPI's own, e.g. reading the body failed
                cause = exc.__cause__
                error = (
                    cause
                    if isinstance(cause, APIError)
                    else APIError(exc.status_code, str(exc.detail))
                )
            except Exception as exc:
                error = api_error(exc)
            if error.status in (429, 503):
                state = request.app.state.server
                state.metrics.add("rejected_requests_total", reason=error.code or str(error.status))
            return error_response(error, flavor)

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

        if scope["method"] == "POST":
            scope = _as_json(scope)
        generating = path in _GENERATING
        if not generating:
            await self.app(scope, limited_receive, counted_send)
            return
        state.metrics.in_flight += 1
        try:
            await self._unless_stopped(scope, limited_receive, counted_send)
        finally:
            state.metrics.in_flight -= 1

    async def _unless_stopped(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the handler; should the server stop before its answer began, cancel it
        (which aborts its engine request) and answer 503. An answer that began (a
        stream) is ended by the stream itself, with its API's closing event."""
        began = False

        async def watched_send(message: Message) -> None:
            nonlocal began
            began = True
            await send(message)

        handler = asyncio.ensure_future(self.app(scope, receive, watched_send))
        stopped = asyncio.ensure_future(self.state.stopping.wait())
        try:
            await asyncio.wait({handler, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not handler.done() and not began:
                handler.cancel()
                await asyncio.wait({handler})
                if not began:
                    error = ServerStopping()
                    await error_response(error, _flavor(scope["path"]))(scope, receive, send)
                    return
            if not handler.cancelled():
                await handler  # a stream ends itself when the server stops
        finally:
            for task in (handler, stopped):
                task.cancel()
            await asyncio.wait({handler, stopped})

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
            return ServerStopping()
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


def _as_json(scope: Scope) -> Scope:
    """The request with ``Content-Type: application/json``: every body here is JSON,
    whatever the client says (``curl -d`` says form-encoded, some say nothing)."""
    headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
    headers.append((b"content-type", b"application/json"))
    return {**scope, "headers": headers}


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


class Health(ReplyModel):
    status: str
    """``ok`` while serving, ``draining`` while shutting down (then 503)."""


class StopRequest(WireModel):
    model: str
    """The model to unload, by the name requests give it."""


class StopReply(ReplyModel):
    model: str
    unloaded: bool
    """Unloaded now."""
    pending: bool
    """Busy: unloaded when its last request ends."""


async def _health(request: Request) -> Response:
    state: ServerState = request.app.state.server
    if state.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    return JSONResponse({"status": "ok"})


async def _metrics(request: Request) -> Response:
    state: ServerState = request.app.state.server
    text = state.metrics.render(state.registry.served())
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")


async def _stop(body: StopRequest, request: Request) -> Response:
    state: ServerState = request.app.state.server
    return JSONResponse(await state.registry.stop(body.model))


async def _unload(model: str, request: Request) -> Response:
    state: ServerState = request.app.state.server
    return JSONResponse(await state.registry.stop(model))


_OPENAI_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": openai_wire.ErrorBody, "description": "An error"} for status in ("4XX", "5XX")
}
_ANTHROPIC_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": anthropic_wire.ErrorBody, "description": "An error"}
    for status in ("4XX", "5XX")
}
_STREAMS = "; with `stream: true`, server-sent events of"


def _add_routes(app: FastAPI) -> None:
    def route(
        path: str, handler: Any, method: str, tag: str, reply: Any = None, **extra: Any
    ) -> None:
        errors = _ANTHROPIC_ERRORS if _flavor(path) == "anthropic" else _OPENAI_ERRORS
        answers: dict[int | str, dict[str, Any]] = dict(errors)
        if reply is not None:
            answers[200] = {"model": reply, **extra}
        app.add_api_route(
            path, handler, methods=[method], tags=[tag], responses=answers, response_model=None
        )

    route("/health", _health, "GET", "server", Health)
    route("/metrics", _metrics, "GET", "server", None)
    route(
        "/v1/chat/completions",
        openai_chat.chat_completions,
        "POST",
        "OpenAI",
        openai_wire.ChatCompletion,
        description=f"The completion{_STREAMS} `ChatCompletionChunk`, then `[DONE]`.",
    )
    route(
        "/v1/completions",
        completions.completions,
        "POST",
        "OpenAI",
        openai_wire.Completion,
        description=f"The completion{_STREAMS} `Completion`, then `[DONE]`.",
    )
    route("/v1/embeddings", embeddings.embeddings, "POST", "OpenAI", openai_wire.EmbeddingList)
    route(
        "/v1/responses",
        responses.responses,
        "POST",
        "OpenAI",
        responses.wire.Response,
        description=f"The response{_STREAMS} `ResponseEvent`.",
    )
    path = "/v1/responses/{response_id}"
    route(path, response_store.get_response, "GET", "OpenAI", responses.wire.Response)
    route(path, response_store.delete_response, "DELETE", "OpenAI", response_store.DeletedResponse)
    for path, handler in (
        ("/v1/rerank", rerank.rerank),
        ("/rerank", rerank.rerank),
        ("/v2/rerank", rerank.rerank_v2),
    ):
        route(path, handler, "POST", "rerank", rerank_wire.RerankReply)
    route("/v1/models", models.list_models, "GET", "OpenAI", openai_wire.ModelList)
    route("/v1/models/{model:path}/unload", _unload, "POST", "server", StopReply)
    route("/v1/models/{model:path}", models.get_model, "GET", "OpenAI", openai_wire.Model)
    route(
        "/v1/messages",
        anthropic.messages,
        "POST",
        "Anthropic",
        anthropic_wire.Message,
        description=f"The message{_STREAMS} `StreamEvent`.",
    )
    route(
        "/v1/messages/count_tokens",
        anthropic.count_tokens,
        "POST",
        "Anthropic",
        anthropic_wire.CountTokensReply,
    )
    route("/api/stop", _stop, "POST", "server", StopReply)
    # Ollama's API, with GET and HEAD / (Claude Code checks the server with HEAD / first).
    ollama.add_routes(app)


def create_app(
    config: ServeConfig | None = None,
    *,
    state: ServerState | None = None,
    engines: dict[str, BaseEngine] | None = None,
    preload: bool = True,
) -> FastAPI:
    """The server's ASGI application (run it with uvicorn, or :func:`~.server.serve`).

    Its OpenAPI schema (``/openapi.json``, with pages at ``/docs`` and ``/redoc``) is
    generated from the protocol models.

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
        >>> app.openapi()["paths"]["/v1/chat/completions"]["post"]["tags"]
        ['OpenAI']
    """
    if state is None:
        state = ServerState(config or ServeConfig(), engines=engines)
    served_state = state

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        budget = apply_memory_budget(served_state.config) if preload else (False, None)
        try:
            if preload:
                await served_state.registry.preload()
            yield
        finally:
            served_state.registry.close()
            restore_memory_budget(budget)

    app = FastAPI(
        title="mlxi serve",
        version=mlx_integrations.__version__,
        summary="Local MLX models behind OpenAI-, Anthropic- and Ollama-compatible endpoints.",
        description=_DESCRIPTION,
        lifespan=lifespan,
    )
    app.router.route_class = _Route
    _add_routes(app)
    app.state.server = state
    app.add_middleware(_Gate, state=state)
    app.router.default = _not_found
    return app


_DESCRIPTION = """Each endpoint speaks its API's format into the chat core the LangChain and
LlamaIndex adapters use. Fields the server uses are strict: a wrong type is a 400
whose `param` is the field's path (`tools[2].function.parameters`). Fields it does not
use are accepted, never refused, and named in the response header
`x-mlxi-ignored-fields` (comma-separated paths)."""


async def _not_found(scope: Scope, receive: Receive, send: Send) -> None:
    path = scope.get("path", "")
    error = APIError(
        404,
        f"No endpoint {scope.get('method', '')} {path}; the endpoints are under /v1 "
        "(chat/completions, completions, embeddings, responses, rerank, models, messages), "
        "Ollama's under /api (chat, generate, embed, tags, show, ps, pull...), and "
        "/health, /metrics, /api/stop",
        code="unknown_endpoint",
    )
    response: Any = error_response(error, _flavor(path))
    await response(scope, receive, send)
