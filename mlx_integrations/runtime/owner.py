"""Owner threads: the one thread per model that loads it and runs every MLX step.

MLX arrays and streams belong to the thread that made them, and MLX asks that a thread
destroy its streams before it ends, or the process may abort at exit ("terminate called
without an active exception"). Engines run their owner thread as a single-worker
executor and stop it through :func:`stop_owner_thread`.

A stopped owner's thread is kept for the next owner rather than ended: releasing a
thread's streams (``mx.clear_streams``) also empties MLX's process-wide compile cache,
and doing that while another thread runs MLX work can abort the process (seen on CUDA)
or hang it. Kept threads release their streams at interpreter exit, once nothing else
runs; a model loaded again on a kept thread also finds its per-thread GPU set-up ready.
:func:`at_thread_exit` runs a callable early enough at interpreter exit for owners
nobody stopped.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_registered: set[Callable[[], None]] = set()
_lock = threading.Lock()
_releasing = threading.Lock()  # one thread releases its streams at a time


IDLE_NAME = "mlxi-owner-idle"
_idle: list[ThreadPoolExecutor] = []  # stopped owners' threads, for the next owner
_exiting = False
ASIDE_NAME = "mlxi-aside"
_aside: ThreadPoolExecutor | None = None  # see run_aside; never an owner
_here = threading.local()  # .aside: the calling thread is the side thread


def make_owner_thread(name: str, *, daemon: bool = False) -> ThreadPoolExecutor:
    """A single-worker executor: jobs run in order on one thread.

    The thread of an owner stopped earlier is used again when there is one (renamed
    ``name``). ``daemon`` makes a new thread that does not hold up interpreter exit
    (:class:`DaemonOwnerThread`), for work that may never return.
    """
    if daemon:
        return DaemonOwnerThread(name)
    with _lock:
        executor = _idle.pop() if _idle and not _exiting else None
    if executor is None:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    executor.submit(_rename, f"{name}_0")
    return executor


def run_aside(fn: Callable[[], T]) -> T:
    """Run ``fn`` on the process's side thread and return what it returns (or raise).

    For MLX work whose per-thread state an owner thread should not keep: MLX keeps
    state per thread (streams; on CUDA, graphs and attention plans), and a load's
    warm-up run on the owner thread made that thread's later decode steps slower on
    CUDA (which of that state does it is not located; docs/benchmarks.md). What MLX
    keeps per process (kernels compiled on CUDA, Metal's pipelines) serves every thread.

    The side thread is one for the process and never lent to an owner: calls from
    several owners wait for one another, and a call from the side thread itself runs
    at once. It releases its streams at interpreter exit as kept owner threads do; from
    then on ``fn`` runs on the calling thread.
    """
    global _aside
    with _lock:
        if _aside is None and not _exiting:
            _aside = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=ASIDE_NAME, initializer=_mark_aside
            )
        executor = None if _exiting else _aside
    if executor is None or getattr(_here, "aside", False):
        return fn()
    try:
        future = executor.submit(fn)
    except RuntimeError:  # shut down by the interpreter's exit meanwhile
        return fn()
    return future.result()


def _mark_aside() -> None:
    _here.aside = True


def _rename(name: str) -> None:
    threading.current_thread().name = name


def join_owner_thread(executor: ThreadPoolExecutor | None, timeout: float) -> None:
    """Wait up to ``timeout`` s for a stopped daemon owner thread to end (its streams
    go before the interpreter does); a plain executor joins itself at exit."""
    if isinstance(executor, DaemonOwnerThread):
        executor.join(timeout)


def release_thread_streams() -> None:
    """Destroy the MLX streams the calling thread made (mlx-lm's generation stream too).

    ``mx.clear_streams`` also empties MLX's compile cache: it takes the cache's lock, then
    the GIL to drop the Python functions the entries hold. A compiled function collected
    on another thread meanwhile holds the GIL and waits for that lock, and both threads
    hang. The garbage collector stays off during the call, so no collection can start
    there (the usual way such a function goes).

    Threads release one at a time (kept threads all release at exit): two releases at
    once would each empty the compile cache while the other runs, and the one that
    turned the collector off could turn it back on while the other still runs.
    """
    import gc

    import mlx.core as mx

    clear_streams = getattr(mx, "clear_streams", None)
    if clear_streams is None:
        return
    with _releasing:
        collecting = gc.isenabled()
        gc.disable()
        try:
            clear_streams()
        finally:
            if collecting:
                gc.enable()


def stop_owner_thread(executor: ThreadPoolExecutor, wait: bool = False) -> None:
    """Give the owner's thread back for the next owner, once its queued jobs are done.

    A daemon thread, or any thread at interpreter exit, releases its streams as its
    last job and ends instead. ``wait`` blocks until the queued jobs are done.
    """
    if isinstance(executor, DaemonOwnerThread) or _exiting:
        _end(executor, wait)
        return
    try:
        done = executor.submit(_rename, IDLE_NAME)
    except RuntimeError:  # already shut down
        return
    with _lock:
        if any(e is executor for e in _idle):
            return
        _idle.append(executor)
    if wait:
        done.result()


def _end(executor: ThreadPoolExecutor, wait: bool) -> None:
    """Release the thread's streams as its last job and shut it down."""
    try:
        executor.submit(release_thread_streams)
    except RuntimeError:  # already shut down
        return
    executor.shutdown(wait=wait)


def _end_idle_threads() -> None:
    """At interpreter exit: the kept threads release their streams and end."""
    global _exiting, _aside
    with _lock:
        _exiting = True
        idle, _idle[:] = list(_idle), []
        if _aside is not None:
            idle.append(_aside)
            _aside = None
    for executor in idle:
        _end(executor, wait=False)


def at_thread_exit(hook: Callable[[], None]) -> None:
    """Run ``hook`` once at interpreter exit, before worker threads are joined.

    The interpreter joins executor threads before ``atexit`` handlers run; threading's
    own exit hooks run before that join.
    """
    with _lock:
        if hook in _registered:
            return
        _registered.add(hook)
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        register(hook)
    else:
        import atexit

        atexit.register(hook)


_closers: weakref.WeakKeyDictionary[Any, Callable[[Any], None]] = weakref.WeakKeyDictionary()


def close_at_exit(owner: Any, close: Callable[[Any], None]) -> None:
    """Call ``close(owner)`` at interpreter exit if ``owner`` is still alive then."""
    with _lock:
        _closers[owner] = close
    at_thread_exit(_close_all)


def _close_all() -> None:
    with _lock:
        items = list(_closers.items())
    for owner, close in items:
        close(owner)


class DaemonOwnerThread(ThreadPoolExecutor):
    """A one-thread executor whose thread does not hold up interpreter exit.

    A collective waiting on a lost rank never returns, and the interpreter joins a
    ``ThreadPoolExecutor``'s threads at exit: rank 0 would never end.
    """

    def __init__(self, name: str):
        super().__init__(max_workers=1, thread_name_prefix=name)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        with self._shutdown_lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.put((future, fn, args, kwargs))
        return future

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._shutdown_lock:
            if not self._closed:
                self._closed = True
                self._queue.put(None)
        if wait:
            self.join()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (after :meth:`shutdown`), at most ``timeout`` s."""
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)


at_thread_exit(_end_idle_threads)
