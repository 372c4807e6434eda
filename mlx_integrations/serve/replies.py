"""Replies: a protocol model as JSON, a stream of events, and the fields left unused.

Every reply to a request carries ``x-mlxi-ignored-fields`` when the request held
fields the server accepted without using them (``metadata``, ``thinking.display``,
``tools[3].cache_control``); the same list goes to the log, one line a request.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from mlx_integrations.serve.protocol.base import IGNORED_HEADER, ignored_fields
from mlx_integrations.serve.sse import EventStream

logger = logging.getLogger(__name__)

__all__ = ["Accepted", "json_reply", "new_id", "now", "stream_reply"]


def new_id(prefix: str) -> str:
    """A unique id such as ``chatcmpl-1f3a...``."""
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def now() -> int:
    """Seconds since the epoch, as the APIs' ``created`` fields."""
    return int(time.time())


class Accepted:
    """A request's fields that the server accepted and does not use, reported once
    (``left_out``: parts a translator left out, such as tools only a hosted API runs)."""

    def __init__(self, request: Request, body: BaseModel, left_out: list[str] | None = None):
        self.fields = ignored_fields(body) + (left_out or [])
        if self.fields:
            logger.info(
                "%s %s: fields accepted and not used: %s",
                request.method,
                request.url.path,
                ", ".join(self.fields),
            )

    @property
    def headers(self) -> dict[str, str]:
        return {IGNORED_HEADER: ",".join(self.fields)} if self.fields else {}


def json_reply(body: BaseModel, accepted: Accepted | None = None) -> Response:
    """``body`` as a JSON response (serialized by Pydantic's core, null fields kept)."""
    headers = accepted.headers if accepted is not None else None
    return Response(body.model_dump_json(), media_type="application/json", headers=headers)


def stream_reply(
    request: Request,
    frames: AsyncIterator[bytes],
    on_error: Callable[[BaseException], bytes],
    accepted: Accepted,
) -> Response:
    """An :class:`EventStream` of ``frames`` that counts a client gone mid-stream."""
    state = request.app.state.server
    endpoint = request.url.path

    def gone() -> None:
        state.metrics.add("client_disconnects_total", endpoint=endpoint)

    return EventStream(frames, on_error=on_error, on_disconnect=gone, headers=accepted.headers)
