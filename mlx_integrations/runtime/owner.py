"""Owner threads: the one thread per model that loads it and runs every MLX step.

MLX arrays and streams belong to the thread that made them, and MLX asks that a thread
destroy its streams before it ends, or the process may abort at exit ("terminate called
without an active exception"). Engines run their owner thread as a single-worker
executor and stop it through :func:`stop_owner_thread`, which releases the streams as
the thread's last job; :func:`at_thread_exit` runs a callable early enough at
interpreter exit for owners nobody stopped.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_registered: set[Callable[[], None]] = set()
_lock = threading.Lock()


def make_owner_thread(name: str) -> ThreadPoolExecutor:
    """A single-worker executor: jobs run in order on one thread."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)


def release_thread_streams() -> None:
    """Destroy the MLX streams the calling thread made (mlx-lm's generation stream too)."""
    import mlx.core as mx

    clear_streams = getattr(mx, "clear_streams", None)
    if clear_streams is not None:
        clear_streams()


def stop_owner_thread(executor: ThreadPoolExecutor, wait: bool = False) -> None:
    """Queue the stream release as the owner's last job, then shut it down."""
    try:
        executor.submit(release_thread_streams)
    except RuntimeError:  # already shut down
        return
    executor.shutdown(wait=wait)


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
