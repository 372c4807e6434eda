"""Server-sent events, and a client that goes away: its request stops between two tokens.

:class:`EventStream` sends frames from an async iterator while it listens for the
client's disconnect; a disconnect cancels the iterator, whose ``finally`` closes the
chat turn, which aborts the engine's request (its slot and cache are freed).
:func:`until_disconnected` does the same for work that answers in one piece.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar, cast

from pydantic import BaseModel
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

logger = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["ClientGone", "EventStream", "sse", "until_disconnected"]


class ClientGone(Exception):
    """The client closed the connection before the answer was complete."""


def closing(stream: AsyncIterator[T]) -> contextlib.AbstractAsyncContextManager[AsyncIterator[T]]:
    """``async with closing(events)``: the stream is closed when the block ends, early
    or not, so the chat turn behind it stops its engine request at once (not at GC)."""
    return contextlib.aclosing(cast(Any, stream))


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event: ``event: NAME`` (when given) and ``data: JSON`` (of a
    protocol model, a plain value, or a string sent as it is)."""
    if isinstance(data, BaseModel):
        payload = data.model_dump_json()
    elif isinstance(data, str):
        payload = data
    else:
        payload = json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


async def _disconnected(receive: Receive) -> None:
    """Return when the client has gone (the request body was read before)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """Await ``work`` unless the client goes first; then cancel it.

    Raises:
        ClientGone: The client disconnected; ``work`` was cancelled (and has ended).
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise
    if task.done():
        watcher.cancel()
        with contextlib.suppress(BaseException):
            await watcher
        return task.result()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task  # the turn's cleanup (the engine's abort) runs before we answer
    raise ClientGone()


class EventStream(Response):
    """An ASGI response of server-sent events from an async iterator of frames.

    Args:
        frames: The frames (bytes), e.g. from :func:`sse`.
        on_error: The frame that reports an exception raised mid-stream (the status
            is sent already); the stream ends after it.
        on_disconnect: Called when the client went away before the last frame.
        headers: Extra response headers.
    """

    def __init__(
        self,
        frames: AsyncIterator[bytes],
        *,
        on_error: Callable[[BaseException], bytes],
        on_disconnect: Callable[[], None] | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(status_code=200)
        self._frames = frames
        self._on_error = on_error
        self._on_disconnect = on_disconnect
        self._extra_headers = headers or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            "x-accel-buffering": "no",  # proxies must not hold events back
            **{k.lower(): v for k, v in self._extra_headers.items()},
        }
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
            }
        )
        producer = asyncio.ensure_future(self._produce(send))
        watcher = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({producer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone = watcher.done() and not producer.done()
            for task in (producer, watcher):
                if not task.done():
                    task.cancel()
            # The producer's cancellation closes the frames, which aborts the request.
            for task in (producer, watcher):
                with contextlib.suppress(BaseException):
                    await task
        failed = not gone and not producer.cancelled() and producer.exception() is not None
        if failed:  # sending failed: the client went as a frame was being sent
            logger.debug("A stream ended early", exc_info=producer.exception())
        if (gone or failed) and self._on_disconnect is not None:
            self._on_disconnect()

    async def _produce(self, send: Send) -> None:
        frames = self._frames
        try:
            try:
                async for frame in frames:
                    await send({"type": "http.response.body", "body": frame, "more_body": True})
            except (asyncio.CancelledError, OSError):
                raise
            except Exception as exc:  # after the status line: report it as an event
                frame = self._on_error(exc)
                await send({"type": "http.response.body", "body": frame, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            aclose = getattr(frames, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()


async def prime(events: AsyncIterator[T]) -> tuple[T | None, AsyncIterator[T]]:
    """The first item of ``events`` (None when there is none), and all of them again.

    Awaiting the first item before the status line is sent lets errors found before
    any output (a bad image, a prompt too long, a full engine) answer with their own
    status rather than as an event of a 200 stream.
    """
    try:
        first = await events.__anext__()
    except StopAsyncIteration:
        return None, events

    async def again() -> AsyncIterator[T]:
        try:
            yield first
            async for item in events:
                yield item
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()

    return first, again()
