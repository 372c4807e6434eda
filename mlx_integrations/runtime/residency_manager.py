"""The process's residency manager: every loaded model, the memory budget, expiry.

One :class:`ResidencyManager` (:data:`manager`) holds the residency of every model an
engine of the process loads (:class:`~mlx_integrations.runtime.residency.Residency`,
seen here through :class:`Entry`). It makes room within the budget by unloading the
least recently used idle models, and runs the one daemon thread that unloads models
idle past their keep-alive and reports their state to lease files, sleeping until the
next such moment. No model's owner thread ever runs this code.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from mlx_integrations.runtime.memory import (
    FOREVER,
    device_memory_limit,
    format_keep_alive,
    parse_keep_alive,
    parse_memory_size,
)

logger = logging.getLogger(__name__)

KEEP_ALIVE_VARIABLE = "MLXI_KEEP_ALIVE"
"""The process's default keep-alive (``"5m"``, ``300``, ``-1``); unset keeps models loaded."""
MAX_MEMORY_VARIABLE = "MLXI_MAX_MEMORY"
"""The memory budget of every model in the process (``"8GB"``, ``"0.6"``); unset: none."""
DEFAULT_BUDGET_WAIT_S = 30.0
"""How long a load waits for busy models to go idle when the budget is full."""
_RETRY_S = 1.0  # an expiry that could not unload (the model was loading) is tried again


class ModelTooLarge(MemoryError):
    """A model larger than the memory budget by itself; refused before it is read."""

    code = "model_too_large"


class MemoryBudgetExceeded(MemoryError):
    """No room for a model within the budget: the others are busy or pinned."""

    code = "memory_budget_exceeded"


class RequestTooLarge(MemoryError, ValueError):
    """A request whose KV cache would not fit in the memory left; refused before it runs."""

    code = "request_too_large"


class Entry(Protocol):
    """One model's residency, as the manager reads and updates it (under its lock)."""

    name: str
    users: int
    last_used: float
    retry_at: float
    evicting: bool
    evictions: int
    rejections: int
    publish_due: float | None

    @property
    def state(self) -> str: ...

    @property
    def pinned(self) -> bool: ...

    @property
    def keep_alive(self) -> float: ...

    @property
    def owner(self) -> Any:
        """The engine (``unload_if_idle()``), or None once it is gone."""

    def memory(self) -> tuple[int, int]: ...

    def expiry(self) -> float | None: ...

    def publish_wanted(self, force: bool) -> bool: ...

    def publish(self) -> None: ...


class ResidencyManager:
    """Every model's residency in the process, the budget, and the expiry thread."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.entries: weakref.WeakSet[Entry] = weakref.WeakSet()
        self.clock: Callable[[], float] = time.monotonic
        self.wait_s = DEFAULT_BUDGET_WAIT_S
        self._budget: int | None = None
        self._budget_read = False
        self._default: float | None = None
        self._thread: threading.Thread | None = None
        self.pinned_paths: set[str] = set()  # models pinned by folder (pool.pin)
        self._passes = 0  # times the expiry thread went to sleep with nothing due

    def register(self, entry: Entry) -> None:
        with self.cond:
            self.entries.add(entry)

    # ------------------------------------------------------------- settings

    def budget(self) -> int | None:
        with self.cond:
            if not self._budget_read:
                self._budget = parse_memory_size(os.environ.get(MAX_MEMORY_VARIABLE))
                self._budget_read = True
            return self._budget

    def set_budget(self, nbytes: int | None) -> None:
        with self.cond:
            self._budget, self._budget_read = nbytes, True
            self.cond.notify_all()

    def default_keep_alive(self) -> float:
        if self._default is None:
            raw = os.environ.get(KEEP_ALIVE_VARIABLE, "").strip()
            self._default = parse_keep_alive(raw, KEEP_ALIVE_VARIABLE) if raw else FOREVER
        return self._default

    def set_default_keep_alive(self, seconds: float) -> None:
        self._default = seconds
        self.wake()

    def limit(self, *, for_request: bool) -> float:
        """The bytes every model together may hold (the lock held)."""
        budget = self.budget()
        if budget is not None:
            return budget
        return device_memory_limit() if for_request else math.inf

    def used_bytes(self, exclude: Entry | None = None) -> int:
        """What the resident models hold, with loads in progress at their estimate."""
        return sum(sum(e.memory()) for e in list(self.entries) if e is not exclude)

    # ------------------------------------------------------------- room

    def make_room(
        self,
        entry: Entry,
        nbytes: int,
        for_request: str | None = None,
        reclaim: Callable[[], int] | None = None,
    ) -> None:
        """Unload idle models (least recently used first) until ``nbytes`` fit.

        For a load (``for_request`` None) ``entry``'s own reservation is ``nbytes``;
        a request adds ``nbytes`` to what ``entry`` holds, and ``reclaim()`` (its own
        engine's caches, dropped; returns the bytes freed) is tried before it waits.
        When busy models (or the engine's other requests) hold the rest, wait up to
        ``wait_s`` for them; a request that could not fit even then is refused at once.
        """
        deadline = time.monotonic() + self.wait_s
        tried: set[int] = set()
        reclaimed = False
        with self.cond:
            while True:
                limit = self.limit(for_request=for_request is not None)
                if for_request is None:
                    used = self.used_bytes(exclude=entry)
                    if nbytes > limit:
                        raise ModelTooLarge(_too_large(entry, nbytes, int(limit)))
                else:
                    used = self.used_bytes()
                if used + nbytes <= limit:
                    return
                victim = self._victim(entry, tried)
                if victim is not None:
                    self._evict(victim, tried)
                    continue
                if reclaim is not None and not reclaimed:
                    reclaimed = True
                    self.cond.release()
                    try:
                        freed = reclaim()
                    finally:
                        self.cond.acquire()
                    if freed:
                        continue
                busy = [
                    e
                    for e in self.entries
                    if e is not entry and (e.users or e.state in ("loading", "unloading"))
                ]
                remaining = deadline - time.monotonic()
                if for_request is not None:
                    if not self.could_fit(entry, nbytes, limit) or remaining <= 0:
                        entry.rejections += 1
                        raise RequestTooLarge(
                            _no_room_for_request(self, entry, for_request, nbytes, limit)
                        )
                elif not busy or remaining <= 0:
                    raise MemoryBudgetExceeded(_no_room(entry, nbytes, int(limit), self))
                self.cond.wait(remaining)
                tried.clear()  # states changed: try everyone again
                reclaimed = False

    def could_fit(self, entry: Entry, nbytes: int, limit: float) -> bool:
        """Whether ``nbytes`` more fit once every request ends and every idle model is
        unloaded: beside ``entry``'s weights and the pinned models (the lock held)."""
        floor = entry.memory()[0] + sum(
            sum(e.memory()) for e in self.entries if e is not entry and e.pinned
        )
        return floor + nbytes <= limit

    def _victim(self, entry: Entry, tried: set[int]) -> Entry | None:
        idle = [
            e
            for e in self.entries
            if e is not entry
            and e.state == "loaded"
            and not e.users
            and not e.pinned
            and not e.evicting
            and id(e) not in tried
        ]
        return min(idle, key=lambda e: e.last_used) if idle else None

    def _evict(self, victim: Entry, tried: set[int]) -> None:
        """Unload ``victim`` with the lock released (its owner thread does the work)."""
        victim.evicting = True
        owner = victim.owner
        self.cond.release()
        try:
            done = owner.unload_if_idle() if owner is not None else False
        except Exception:
            logger.warning("Could not unload %s to make room", victim.name, exc_info=True)
            done = False
        finally:
            self.cond.acquire()
            victim.evicting = False
        if done:
            victim.evictions += 1
            logger.info("Unloaded %s (least recently used) to make room", victim.name)
        else:
            tried.add(id(victim))

    # ------------------------------------------------------------- expiry

    def changed(self, entry: Entry, force: bool = False) -> None:
        """A model's state, keep-alive or pin changed: publish it, re-plan expiries."""
        with self.cond:
            publish = entry.publish_wanted(force)
        if publish:
            entry.publish()
        self.wake()

    def wake(self, wait: float | None = None) -> bool:
        """Let the expiry thread look again (after a change, or a move of the clock).

        Args:
            wait: Seconds to wait for it to have unloaded what is due and gone back to
                sleep; None returns at once.

        Returns:
            False when ``wait`` ran out first.
        """
        with self.cond:
            if self._thread is None or not self._thread.is_alive():
                if sys.is_finalizing():  # at interpreter exit a new thread never starts:
                    return False  # its start() would wait for ever (nothing is due then)
                self._thread = threading.Thread(
                    target=self._run, name="mlxi-residency", daemon=True
                )
                self._thread.start()
            seen = self._passes
            self.cond.notify_all()
            if wait is None:
                return True
            return self.cond.wait_for(lambda: self._passes > seen, wait)

    def _run(self) -> None:
        """The expiry thread: sleep until the next keep-alive ends or report is due."""
        while True:
            with self.cond:
                now = self.clock()
                expired: list[Entry] = []
                reports: list[Entry] = []
                next_at = math.inf
                for entry in list(self.entries):
                    at = entry.expiry()
                    if at is not None:
                        at = max(at, entry.retry_at)
                        if at <= now:
                            expired.append(entry)
                        next_at = min(next_at, at)
                    due = entry.publish_due
                    if due is not None:
                        due_on_clock = now + (due - time.monotonic())
                        if due_on_clock <= now:
                            entry.publish_due = None
                            reports.append(entry)
                        next_at = min(next_at, due_on_clock)
                if not expired and not reports:
                    self._passes += 1  # all due work done: wake(wait=...) returns
                    self.cond.notify_all()
                    self.cond.wait(None if next_at == math.inf else next_at - now)
                    continue
            for entry in reports:
                entry.publish()
            for entry in expired:
                self._expire(entry)

    def _expire(self, entry: Entry) -> None:
        owner = entry.owner
        try:
            done = owner.unload_if_idle() if owner is not None else False
        except Exception:
            logger.warning("Could not unload idle %s", entry.name, exc_info=True)
            done = False
        if done:
            logger.info(
                "Unloaded %s: idle longer than its keep_alive (%s)",
                entry.name,
                format_keep_alive(entry.keep_alive),
            )
            return
        with self.cond:  # in use again, or loading: look later unless a change comes first
            if entry.expiry() is not None:
                entry.retry_at = self.clock() + _RETRY_S


manager = ResidencyManager()
"""The process's one manager."""


def _mb(n: float) -> str:
    return f"{n / 1024**2:.1f} MiB"


def _too_large(entry: Entry, nbytes: int, limit: int) -> str:
    return (
        f"{entry.name!r} needs about {_mb(nbytes)} for its weights (the size of its "
        f"*.safetensors files), more than the memory budget of {_mb(limit)} "
        f"({MAX_MEMORY_VARIABLE} or pool.set_memory_budget); raise the budget, or use a "
        "smaller or quantized model (mlxi quantize)"
    )


def _no_room(entry: Entry, nbytes: int, limit: int, manager: ResidencyManager) -> str:
    holders = [
        f"{e.name} ({_mb(sum(e.memory()))}, {'in use' if e.users else 'pinned'})"
        for e in manager.entries
        if e is not entry and e.state != "unloaded" and (e.users or e.pinned)
    ]
    return (
        f"No room for {entry.name!r} (about {_mb(nbytes)}) within the memory budget of "
        f"{_mb(limit)}: {', '.join(holders) or 'other models'} cannot be unloaded now "
        f"(waited {manager.wait_s:g} s for one to go idle); retry later, unpin a model, "
        f"or raise {MAX_MEMORY_VARIABLE}"
    )


def _no_room_for_request(
    manager: ResidencyManager, entry: Entry, what: str, nbytes: int, limit: float
) -> str:
    used = manager.used_bytes()
    source = (
        f"the memory budget of {_mb(limit)} ({MAX_MEMORY_VARIABLE})"
        if manager.budget() is not None
        else f"the device's memory limit of {_mb(limit)}"
    )
    return (
        f"{what} needs about {_mb(nbytes)} of KV cache on {entry.name!r}, but only "
        f"{_mb(max(0.0, limit - used))} of {source} is left (models and caches hold "
        f"{_mb(used)}); lower max_tokens, shorten the prompt, quantize the KV cache "
        f"(kv_bits=8), or raise {MAX_MEMORY_VARIABLE}"
    )
