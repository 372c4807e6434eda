"""Errors as OpenAI and Anthropic clients read them: status, type, the bad field.

Handlers raise :class:`APIError`; any other exception is mapped by
:func:`api_error` (bad input is 400 naming the field, a full engine 503 with
Retry-After, a missing model 404...). The field at fault (``param``) is the path the
error carries: a protocol model's validation error, or the chat core's
``RequestError``, whose path the endpoint's translator turns into its API's names;
never read from the message. The body takes OpenAI's shape
(``{"error": {"message", "type", "param", "code"}}``) or, on ``/v1/messages``,
Anthropic's (``{"type": "error", "error": {"type", "message"}}``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mlx_integrations.serve.protocol import anthropic, openai
from mlx_integrations.serve.protocol.base import FieldError

logger = logging.getLogger(__name__)

__all__ = [
    "APIError",
    "PathMap",
    "ServerStopping",
    "anthropic_error_body",
    "api_error",
    "openai_error_body",
    "validation_error",
]

RETRY_AFTER_S = 1
"""Seconds a client told to come back (429/503) waits."""

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
    504: "timeout_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


class APIError(Exception):
    """An HTTP error with what the client needs to act on it.

    Args:
        status: The HTTP status.
        message: What went wrong and what to do.
        param: The request field at fault (400s), if one is.
        code: A machine-readable code (``model_not_found``, ``engine_busy``...).
        retry_after: Seconds before trying again (sent as ``Retry-After``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}


class ServerStopping(APIError):
    """503: the server is shutting down. New requests get it while the server drains,
    and a reply still running when it stops ends with it (its API's closing event)."""

    def __init__(self) -> None:
        super().__init__(
            503,
            "The server is shutting down; send the request to another server or retry",
            code="shutting_down",
            retry_after=RETRY_AFTER_S,
        )


def openai_error_body(error: APIError) -> openai.ErrorBody:
    """``{"error": {...}}`` as OpenAI's API answers."""
    return openai.ErrorBody(
        error=openai.ErrorDetail(
            message=error.message,
            type=_OPENAI_TYPES.get(error.status, "server_error"),
            param=error.param,
            code=error.code,
        )
    )


def anthropic_error_body(error: APIError) -> anthropic.ErrorBody:
    """``{"type": "error", "error": {...}}`` as Anthropic's API answers."""
    return anthropic.ErrorBody(
        error=anthropic.ErrorDetail(
            type=_ANTHROPIC_TYPES.get(error.status, "api_error"), message=error.message
        )
    )


def validation_error(errors: list[FieldError]) -> APIError:
    """A 400 for a request its protocol model refused: the first bad field's path in
    ``param``, every bad field in the message."""
    first = errors[0]
    message = "; ".join(e.message for e in errors[:5])
    if len(errors) > 5:
        message += f" (and {len(errors) - 5} more)"
    return APIError(400, message, param=first.path or None)


PathMap = Callable[[str], str]
"""A chat-core field path to the path of the same field in an API's request."""


def api_error(
    exc: BaseException, *, param: str | None = None, paths: PathMap | None = None
) -> APIError:
    """The HTTP error for an exception raised while serving a request.

    Args:
        exc: What was raised.
        param: The field at fault when the error carries no path of its own.
        paths: Turns the chat core's path (OpenAI chat-completion names) into the
            endpoint's (``max_tokens`` is ``max_output_tokens`` in the Responses API).
    """
    if isinstance(exc, APIError):
        return exc
    from mlx_integrations.chat.request import RequestError
    from mlx_integrations.engine.base import EngineBusy
    from mlx_integrations.runtime.residency import (
        MemoryBudgetExceeded,
        ModelTooLarge,
        RequestTooLarge,
    )

    message = str(exc) or type(exc).__name__
    if isinstance(exc, EngineBusy):
        return APIError(
            503,
            f"The model is busy serving other requests ({message}); retry shortly",
            code="engine_busy",
            retry_after=RETRY_AFTER_S,
        )
    if isinstance(exc, (MemoryBudgetExceeded, RequestTooLarge)):
        return APIError(
            503,
            f"Not enough memory for this request now: {message}",
            code=getattr(exc, "code", "memory_budget_exceeded"),
            retry_after=RETRY_AFTER_S,
        )
    if isinstance(exc, ModelTooLarge):
        return APIError(
            507,
            f"{message.rstrip('.')}; a server's budget is its --max-memory (or MLXI_MAX_MEMORY)",
            param="model",
            code="model_too_large",
        )
    if isinstance(exc, TimeoutError):
        return APIError(504, message or "The request timed out", code="timeout")
    if isinstance(exc, (ValueError, TypeError)):
        path = exc.path if isinstance(exc, RequestError) else None
        if path and paths is not None:
            path = paths(path)
        return APIError(400, message, param=path or param)
    if isinstance(exc, FileNotFoundError):
        return APIError(404, message, param="model", code="model_not_found")
    logger.error("Request failed", exc_info=(type(exc), exc, exc.__traceback__))
    return APIError(500, f"The server failed to answer: {type(exc).__name__}: {message}")
