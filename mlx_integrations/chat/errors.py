"""Errors of a bad request value, carrying the path of the field at fault.

Every check of a request (the chat core's, an engine's, the server's protocol models)
raises :class:`RequestError` with the field's path, so a caller learns which field it
was without reading the message.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["RequestError", "RequestTypeError", "checking", "request_error"]


class RequestError(ValueError):
    """A bad value in a request (or in an engine's options), with the field's path.

    Attributes:
        path: Where the value sits, in the OpenAI chat-completions spelling:
            ``"temperature"``, ``"tools[2].function.parameters"``,
            ``"messages[3].content"``; ``""`` when no one field is at fault.
        message: What is wrong and what to do (``str(exc)``).
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.path))


class RequestTypeError(RequestError, TypeError):
    """A request value of the wrong type (a :class:`RequestError` and a ``TypeError``)."""


def request_error(exc: TypeError | ValueError, path: str) -> RequestError:
    """``exc`` as a :class:`RequestError` at ``path`` (its own path kept if it has one)."""
    if isinstance(exc, RequestError):
        if not exc.path:
            exc.path = path
        return exc
    kind = RequestTypeError if isinstance(exc, TypeError) else RequestError
    error = kind(str(exc), path)
    error.__cause__ = exc.__cause__
    return error


@contextmanager
def checking(path: str) -> Iterator[None]:
    """Turn a plain ``TypeError``/``ValueError`` raised inside into a
    :class:`RequestError` at ``path`` (one with a path of its own keeps it)."""
    try:
        yield
    except (TypeError, ValueError) as exc:
        raise request_error(exc, path) from None
