"""Driving any async engine from synchronous code.

Sync callers (LangChain's ``invoke``, LlamaIndex's ``chat``) may come from any
thread, with or without an event loop of their own. They submit coroutines to one
background event loop and block only their own thread. Closing a sync iterator
early closes the async one, which aborts the request in the engine.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import AsyncIterator, Coroutine, Generator
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def background_loop() -> asyncio.AbstractEventLoop:
    """The process's background loop (started on first use, daemon thread)."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="mlxi-sync-loop", daemon=True)
            thread.start()
            _loop = loop
        return _loop


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from synchronous code."""
    loop = background_loop()
    if _on_loop_thread(loop):
        raise RuntimeError("run_sync was called from the background loop itself")
    future: Future[T] = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise


def iterate_sync(agen: AsyncIterator[T]) -> Generator[T, None, None]:
    """Iterate an async iterator from synchronous code, item by item.

    If the caller stops early (or Ctrl-C arrives while an item is awaited), the async
    iterator is closed or its pending step cancelled, which aborts the request; the
    caller's own exception (``KeyboardInterrupt`` included) is what propagates.
    """
    loop = background_loop()
    pending: Future[T] | None = None
    try:
        while True:
            pending = asyncio.run_coroutine_threadsafe(_anext(agen), loop)
            try:
                item = pending.result()
            except StopAsyncIteration:
                pending = None
                return
            pending = None
            yield item
    finally:
        if pending is not None and not pending.done():
            # Interrupted mid-step: cancelling the step ends the generator and runs its
            # cleanup there; closing it now would fail ("already running").
            pending.cancel()
        else:
            aclose = getattr(agen, "aclose", None)
            # An iterator left open until the interpreter exits is closed while it shuts
            # down, when the loop's daemon thread runs no more: waiting would never end.
            if aclose is not None and not _on_loop_thread(loop) and not sys.is_finalizing():
                asyncio.run_coroutine_threadsafe(aclose(), loop).result()


async def _anext(agen: AsyncIterator[T]) -> T:
    return await agen.__anext__()


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
