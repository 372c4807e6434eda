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
from typing import TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from mlx_integrations.serve.protocol.base import IGNORED_HEADER, ignored_fields
from mlx_integrations.serve.sse import KEEPALIVE_COMMENT, EventStream, prime, until_disconnected

logger = logging.getLogger(__name__)

E = TypeVar("E")

__all__ = ["Accepted", "json_reply", "new_id", "now", "stream_reply"]


def new_id(prefix: str) -> str:
    """A unique id such as ``chatcmpl-1f3a...``."""
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def now() -> int:
    """Seconds since the epoch, as the APIs' ``created`` fields."""
    return int(time.time())


class Accepted:
    """A request's fields that the server accepted and does not use, reported once
    (``left_out``: parts a translator left out, such as tools only a hosted API runs;
    ``used``: fields declared unused that this request's values put to use)."""

    def __init__(
        self,
        request: Request,
        body: BaseModel,
        left_out: list[str] | None = None,
        used: set[str] | None = None,
    ):
        left_out = left_out or []
        # A field inside a part left out whole is named by that part alone.
        fields = [
            f
            for f in ignored_fields(body)
            if f not in (used or ()) and not any(f.startswith(f"{p}.") for p in left_out)
        ]
        self.fields = fields + left_out
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


async def stream_reply(
    request: Request,
    events: AsyncIterator[E],
    frames: Callable[[AsyncIterator[E]], AsyncIterator[bytes]],
    on_error: Callable[[BaseException], bytes],
    accepted: Accepted,
    keepalive: Callable[[], bytes] = lambda: KEEPALIVE_COMMENT,
) -> Response:
    """A stream of the ``frames`` made of ``events``, sent as soon as the first event
    (a turn's :class:`~mlx_integrations.chat.completion.Started`) has come, or after
    ``stream_keepalive_s`` at the latest; a ``keepalive`` frame whenever nothing was
    sent for that long. An error before the first event answers with its own status.

    Raises:
        ClientGone: The client left before the first event (its turn is closed).
        APIError: What the events raised before their first.
    """
    state = request.app.state.server
    endpoint = request.url.path
    wait = state.config.stream_keepalive_s
    _, primed = await until_disconnected(request.receive, prime(events, wait))

    def gone() -> None:
        state.metrics.add("client_disconnects_total", endpoint=endpoint)

    return EventStream(
        frames(primed),
        on_error=on_error,
        on_disconnect=gone,
        headers=accepted.headers,
        keepalive=keepalive,
        keepalive_s=wait,
        stopping=state.stopping,
    )
