"""Server-sent events: headers at once, keep-alives while the model is silent, and a
client that goes away stops its request.

:func:`prime` waits for a turn's first event (our engines announce the prompt once it
is counted, before the prefill) for at most the keep-alive interval, so an error found
before then answers with its own status, and a long prefill or a model still loading
never holds the headers back. :class:`EventStream` then sends the status line and the
frames, and a keep-alive (an SSE comment, or the API's ``ping``) whenever nothing was
sent for the interval. It listens for the client's disconnect all along: a disconnect
cancels the frames, whose ``finally`` closes the chat turn, which aborts the engine's
request (between two prefill pieces or two tokens; its slot and cache are freed).
When the server stops (:attr:`~.state.ServerState.stopping`), a stream still running
is ended with its API's closing event. :func:`until_disconnected` does the same for
work that answers in one piece.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Generic, TypeVar, cast

from pydantic import BaseModel
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from mlx_integrations.serve.errors import ServerStopping

logger = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = [
    "KEEPALIVE_COMMENT",
    "ClientGone",
    "EventStream",
    "merged",
    "prime",
    "sse",
    "until_disconnected",
]

KEEPALIVE_COMMENT = b": keepalive\n\n"
"""An SSE comment: every client's event parser skips it (OpenAI's APIs' keep-alive)."""


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


async def _settle(task: asyncio.Future[Any]) -> None:
    """Wait for a task that was cancelled or is ending; its outcome is dropped."""
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved: nobody else will read it


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


async def _next(events: AsyncIterator[T]) -> T:
    return await events.__anext__()


async def merged(sources: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """The items of several streams (the turns of a request's ``n`` choices) as they
    come, each with its stream's index.

    Closing it closes every stream (each aborts its engine request). An exception of
    one stream ends it: the others are closed and the exception raised.
    """
    if len(sources) == 1:
        async with closing(sources[0]) as only:
            async for item in only:
                yield 0, item
        return
    queue: asyncio.Queue[tuple[int, Any, BaseException | None]] = asyncio.Queue()
    done = object()

    async def pump(index: int, source: AsyncIterator[T]) -> None:
        try:
            async with closing(source) as items:
                async for item in items:
                    queue.put_nowait((index, item, None))
        except Exception as exc:
            queue.put_nowait((index, None, exc))
        else:
            queue.put_nowait((index, done, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(sources)]
    try:
        running = len(tasks)
        while running:
            index, item, error = await queue.get()
            if error is not None:
                raise error
            if item is done:
                running -= 1
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            await _settle(task)


async def _aclose(events: Any) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()


class _Primed(Generic[T]):
    """``events`` again, its first item fetched (or being fetched) by ``step``.

    A class rather than a generator: closed before it is iterated, it still closes
    ``events`` (and cancels the step), so the engine's request never outlives it.
    """

    def __init__(self, events: AsyncIterator[T], step: asyncio.Future[T]):
        self._events = events
        self._step: asyncio.Future[T] | None = step

    def __aiter__(self) -> _Primed[T]:
        return self

    async def __anext__(self) -> T:
        step, self._step = self._step, None
        if step is not None:
            return await step  # cancelling this cancels the step, which closes the turn
        return await self._events.__anext__()

    async def aclose(self) -> None:
        step, self._step = self._step, None
        if step is not None:
            step.cancel()
            await _settle(step)
        await _aclose(self._events)


async def prime(
    events: AsyncIterator[T], wait: float | None = None
) -> tuple[T | None, AsyncIterator[T]]:
    """The first item of ``events`` (None when there is none, or not yet), and all of
    them again.

    Awaiting the first item before the status line is sent lets errors found before
    any output (a bad image, a prompt too long, a full engine) answer with their own
    status rather than as an event of a 200 stream. With ``wait``, the first item is
    awaited that many seconds at most: past them, the iterator returned goes on
    waiting for it, and the headers can go out meanwhile.

    Raises:
        Exception: What ``events`` raised before its first item (it is closed).
    """
    step = asyncio.ensure_future(_next(events))
    try:
        await asyncio.wait({step}, timeout=wait)
    except BaseException:  # cancelled: the client went away
        step.cancel()
        await _settle(step)
        await _aclose(events)
        raise
    if not step.done():
        return None, _Primed(events, step)
    try:
        first = step.result()
    except StopAsyncIteration:
        return None, _Primed(events, step)
    except BaseException:
        await _aclose(events)
        raise
    return first, _Primed(events, step)


class EventStream(Response):
    """An ASGI response of server-sent events from an async iterator of frames.

    Args:
        frames: The frames (bytes), e.g. from :func:`sse`.
        on_error: The frame that reports an exception raised mid-stream (the status
            is sent already); the stream ends after it. A server that stops ends the
            streams still running with ``on_error(ServerStopping())``.
        on_disconnect: Called when the client went away before the last frame.
        headers: Extra response headers.
        keepalive: The frame sent whenever nothing was sent for ``keepalive_s``
            seconds (called each time: the frame may depend on what was sent).
        keepalive_s: The keep-alive interval; None sends none.
        stopping: Set when the server stops; the app's ``state.server.stopping``
            when not given.
    """

    def __init__(
        self,
        frames: AsyncIterator[bytes],
        *,
        on_error: Callable[[BaseException], bytes],
        on_disconnect: Callable[[], None] | None = None,
        headers: dict[str, str] | None = None,
        keepalive: Callable[[], bytes] = lambda: KEEPALIVE_COMMENT,
        keepalive_s: float | None = None,
        stopping: asyncio.Event | None = None,
    ):
        super().__init__(status_code=200)
        self._frames = frames
        self._on_error = on_error
        self._on_disconnect = on_disconnect
        self._extra_headers = headers or {}
        self._keepalive = keepalive
        self._keepalive_s = keepalive_s
        self._stopping = stopping
        self._lock = asyncio.Lock()  # one message at a time: frames and keep-alives
        self._last_sent = 0.0
        self._ended = False

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
        self._last_sent = asyncio.get_running_loop().time()
        producer = asyncio.ensure_future(self._produce(send))
        watcher = asyncio.ensure_future(_disconnected(receive))
        others: set[asyncio.Future[Any]] = {watcher}
        if self._keepalive_s is not None:
            others.add(asyncio.ensure_future(self._keep_alive(send, self._keepalive_s)))
        stopping = self._stopping or _stopping_of(scope)
        if stopping is not None:
            others.add(asyncio.ensure_future(stopping.wait()))
        try:
            done, _ = await asyncio.wait({producer, *others}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (producer, *others):
                task.cancel()
            # The producer's cancellation closes the frames, which aborts the request.
            for task in (producer, *others):
                await _settle(task)
        if producer in done:
            if producer.exception() is None:
                return  # the last frame was sent
            # Sending failed: the client went as a frame or keep-alive was being sent.
            logger.debug("A stream ended early", exc_info=producer.exception())
        elif watcher not in done and all(t.exception() is None for t in done):
            # The server stops: the stream ends with its API's closing event.
            with contextlib.suppress(OSError):
                await self._end(send, self._on_error(ServerStopping()))
            return
        if self._on_disconnect is not None:
            self._on_disconnect()

    async def _send(self, send: Send, frame: bytes) -> None:
        async with self._lock:
            if self._ended:
                return
            await send({"type": "http.response.body", "body": frame, "more_body": True})
            self._last_sent = asyncio.get_running_loop().time()

    async def _end(self, send: Send, frame: bytes = b"") -> None:
        async with self._lock:
            if self._ended:
                return
            self._ended = True
            if frame:
                await send({"type": "http.response.body", "body": frame, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _keep_alive(self, send: Send, interval: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(self._last_sent + interval - loop.time(), 0.0))
            async with self._lock:  # the frame is chosen after what was sent before it
                if self._ended or loop.time() - self._last_sent < interval:
                    continue
                frame = self._keepalive()
                await send({"type": "http.response.body", "body": frame, "more_body": True})
                self._last_sent = loop.time()

    async def _produce(self, send: Send) -> None:
        frames = self._frames
        try:
            while True:
                try:
                    frame = await frames.__anext__()
                except StopAsyncIteration:
                    break
                except Exception as exc:  # after the status line: report it as an event
                    await self._end(send, self._on_error(exc))
                    return
                # A failed send (OSError) is the client gone: it ends the producer.
                await self._send(send, frame)
            await self._end(send)
        finally:
            with contextlib.suppress(Exception):
                await _aclose(frames)


def _stopping_of(scope: Scope) -> asyncio.Event | None:
    """The stopping event of the app that serves ``scope`` (None outside this server)."""
    state = getattr(getattr(scope.get("app"), "state", None), "server", None)
    return getattr(state, "stopping", None)
