"""The thread that owns a model: it loads the weights and runs every MLX step.

MLX arrays and streams belong to the thread that made them, and MLX asks that a
thread clear its streams before it ends. An owner thread therefore runs its jobs in
order, and on shutdown (or at interpreter exit) runs ``mx.clear_streams()`` as its
last job, so no thread-local MLX state is torn down behind MLX's back.
"""

from __future__ import annotations

import atexit
import queue
import sys
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

_live: weakref.WeakSet[OwnerThread] = weakref.WeakSet()
_STOP = object()


class OwnerThread:
    """A single worker thread with a FIFO job queue (``submit`` returns a Future).

    Example:
        >>> owner = OwnerThread("demo")
        >>> owner.submit(lambda: 1 + 1).result()
        2
        >>> owner.shutdown()
    """

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _live.add(self)

    @property
    def name(self) -> str:
        return self._thread.name

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Queue ``fn(*args)`` to run on the owner thread."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"owner thread {self.name!r} is shut down")
            self._jobs.put((future, fn, args))
        return future

    def shutdown(self, wait: bool = True) -> None:
        """Finish queued jobs, clear the thread's MLX streams, end the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._jobs.put(_STOP)
        if wait and threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is _STOP:
                break
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)
        if "mlx.core" in sys.modules:
            clear = getattr(sys.modules["mlx.core"], "clear_streams", None)
            if clear is not None:
                clear()


@atexit.register
def _shutdown_all() -> None:
    for owner in list(_live):
        owner.shutdown(wait=True)
