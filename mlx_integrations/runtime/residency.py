"""Which models stay loaded in this process: keep-alive, a memory budget, pinning.

Every engine that loads a model (the chat engines, the embedding engine) owns a
:class:`Residency` and tells it when a request begins and ends and when its model
loads and unloads. In return, for every such model in the process:

- Keep-alive: a model idle longer than its ``keep_alive`` is unloaded (weights, caches
  and MLX's buffer pool) by one daemon thread, which sleeps until the next expiry;
  the next request loads it again. The default is to keep models loaded
  (``MLXI_KEEP_ALIVE`` or :func:`set_default_keep_alive` change it).
- A memory budget (``MLXI_MAX_MEMORY`` or :func:`set_memory_budget`): before a model
  loads, the least recently used idle models are unloaded until it fits. A model
  serving a request or pinned is never unloaded for it; when busy models hold the
  memory, the load waits up to ``wait_s`` for one to go idle, then is refused with
  :class:`MemoryBudgetExceeded`. A model larger than the budget alone is refused before
  anything is read, with :class:`ModelTooLarge`.
- Admission: before a request runs, its KV cache (estimated from the model's config)
  must fit in what is left of the budget, or of the device's memory limit. Idle models
  are unloaded first if that makes room; requests in flight are waited for (up to
  ``wait_s``); a request that could not fit even beside its own model alone (and the
  pinned ones) is refused at once with :class:`RequestTooLarge`.

The bookkeeping of the whole process (budget, eviction order, the expiry thread) is
:mod:`.residency_manager`. This module knows no model and imports no MLX (the device's
limit is read when a request is admitted without a budget, when MLX is loaded anyway).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Literal, Protocol, TypedDict

from mlx_integrations.runtime.memory import FOREVER, parse_keep_alive, parse_memory_size
from mlx_integrations.runtime.residency_manager import (
    KEEP_ALIVE_VARIABLE,
    MAX_MEMORY_VARIABLE,
    MemoryBudgetExceeded,
    ModelTooLarge,
    RequestTooLarge,
    manager,
)

__all__ = [
    "KEEP_ALIVE_VARIABLE",
    "MAX_MEMORY_VARIABLE",
    "MemoryBudgetExceeded",
    "ModelTooLarge",
    "RequestTooLarge",
    "Residency",
    "ResidencyControls",
    "ResidencyStats",
    "ResidentModel",
    "ResidentModelInfo",
    "default_keep_alive",
    "memory_budget",
    "memory_in_use",
    "pin_path",
    "resident_models",
    "set_clock",
    "set_default_keep_alive",
    "set_memory_budget",
    "wake",
]

logger = logging.getLogger(__name__)

LOAD_GRACE_S = 1.0
"""A model loaded with no request yet (``start()``) is kept at least this long, so the
request that loaded it finds it even with ``keep_alive=0``."""
PUBLISH_INTERVAL_S = 1.0
"""Least time between two reports of a model's state to its publisher (lease files)."""

State = Literal["unloaded", "loading", "loaded", "unloading"]


class ResidentModel(Protocol):
    """What an engine offers the residency manager."""

    def resident_bytes(self) -> tuple[int, int]:
        """(weights, caches) in bytes: what the model holds now (0, 0 when unloaded)."""
        ...

    def unload_if_idle(self) -> bool:
        """Unload the model if no request uses it; False when it did not unload."""
        ...


class ResidencyStats(TypedDict):
    """The ``residency`` entry of ``get_stats()``: is the model loaded, and until when."""

    state: str
    """``"loaded"``, ``"unloaded"``, ``"loading"`` or ``"unloading"``."""
    memory_bytes: int
    """weights_bytes + cache_bytes."""
    weights_bytes: int
    """The model's weights in memory (measured at load; 0 when unloaded)."""
    cache_bytes: int
    """The prefix cache, and the KV cache reserved by the requests in flight."""
    in_use: int
    """Requests using the model now; a model in use is never unloaded."""
    last_used: float | None
    """When the last request ended (or the model loaded), in seconds since the epoch."""
    idle_s: float | None
    """Seconds since then; None while in use or unloaded."""
    keep_alive_s: float | None
    """Seconds the model stays loaded once idle; None: until stopped (or evicted)."""
    expires_at: float | None
    """When it will be unloaded if no request comes (seconds since the epoch); None
    when it will not be: in use, pinned, kept forever, or not loaded."""
    expires_in_s: float | None
    """Seconds until then."""
    pinned: bool
    """Pinned models are never unloaded to make room, nor when their keep-alive ends."""
    loads: int
    unloads: int
    """Times the model was unloaded: idle past its keep-alive, evicted, or stopped."""
    evictions: int
    """Times it was unloaded to make room for another model or a request."""
    memory_rejections: int
    """Requests refused with ``RequestTooLarge``."""


class ResidentModelInfo(ResidencyStats):
    """One model in :func:`resident_models`: its residency, and which model it is."""

    name: str
    """The model as it was named (folder, store name or Hub id)."""
    kind: str
    """``"chat"`` or ``"embedding"``."""
    path: str
    """The resolved model folder."""


class Residency:
    """One model's residency: its requests in flight, its keep-alive, its pin, its size.

    The engine calls :meth:`begin_use`/:meth:`end_use` around each request,
    :meth:`reserve` before loading (it may unload other models, or refuse),
    :meth:`loaded`, :meth:`load_failed`, :meth:`try_begin_unload` and
    :meth:`unloaded`; the manager calls the owner's ``unload_if_idle`` when the
    keep-alive ends or room is needed, never on the model's owner thread.

    Args:
        owner: The engine (held weakly).
        name: The model as the user named it.
        kind: ``"chat"`` or ``"embedding"``.
        path: The resolved folder.
        keep_alive: Seconds or a duration (:func:`parse_keep_alive`); None follows the
            process default.
        pinned: Never unload it to make room or when its keep-alive ends.
        fixed: Why the model cannot be unloaded and loaded again (a distributed
            engine), or None. A fixed model is never unloaded by this module, and a
            keep-alive other than forever is refused with this reason.
        publish: Called with the residency (a :class:`ResidencyStats`) after a load, and
            after a change of state at most once every :data:`PUBLISH_INTERVAL_S`.
    """

    def __init__(
        self,
        owner: ResidentModel,
        name: str,
        kind: str,
        path: str,
        *,
        keep_alive: Any = None,
        pinned: bool = False,
        fixed: str | None = None,
        publish: Callable[[ResidencyStats], None] | None = None,
    ):
        self._owner = weakref.ref(owner)
        self.name, self.kind, self.path = name, kind, path
        self._fixed = fixed
        self._keep_alive = None if keep_alive is None else self._check_keep_alive(keep_alive)
        self._pinned = bool(pinned)
        self._publisher = publish
        # Under the manager's lock.
        self.state: State = "unloaded"
        self.users = 0
        self.reserved = 0  # bytes claimed while loading
        self.evicting = False
        self.served = False  # a request ended since the last load
        self.last_used = 0.0  # the manager's clock
        self.last_used_wall: float | None = None
        self.retry_at = 0.0
        self.loads = self.unloads = self.evictions = self.rejections = 0
        self.publish_due: float | None = None
        self._published_at = -math.inf
        self._publish_lock = threading.Lock()
        manager.register(self)

    # ------------------------------------------------------------- settings

    @property
    def keep_alive(self) -> float:
        """Seconds the model stays loaded once idle (``math.inf``: until stopped)."""
        if self._fixed is not None:
            return FOREVER
        if self._keep_alive is None:
            return manager.default_keep_alive()
        return self._keep_alive

    @keep_alive.setter
    def keep_alive(self, value: Any) -> None:
        seconds = None if value is None else self._check_keep_alive(value)
        with manager.cond:
            self._keep_alive = seconds
            self.retry_at = 0.0
        manager.changed(self)

    def _check_keep_alive(self, value: Any) -> float:
        seconds = parse_keep_alive(value)
        if self._fixed is not None and seconds != FOREVER:
            raise ValueError(f"keep_alive={value!r}: {self._fixed}")
        return seconds

    @property
    def pinned(self) -> bool:
        """Never unloaded to make room, nor when the keep-alive ends."""
        return self._pinned or self._fixed is not None or self.path in manager.pinned_paths

    @pinned.setter
    def pinned(self, value: bool) -> None:
        with manager.cond:
            self._pinned = bool(value)
        manager.changed(self)

    @property
    def owner(self) -> ResidentModel | None:
        return self._owner()

    # ------------------------------------------------------------- requests

    @property
    def ready(self) -> bool:
        """Loaded, and not being unloaded: a request may use the model as it is."""
        return self.state == "loaded"

    def begin_use(self) -> None:
        """A request starts using the model: it is not unloaded until :meth:`end_use`."""
        with manager.cond:
            self.users += 1
            first = self.users == 1
        if first:
            manager.changed(self)

    def end_use(self) -> None:
        """A request ended; the keep-alive counts from the last one."""
        with manager.cond:
            self.users = max(0, self.users - 1)
            idle = self.users == 0
            if idle:
                self.last_used = manager.clock()
                self.last_used_wall = time.time()
                self.served = True
                self.retry_at = 0.0
            manager.cond.notify_all()  # loads and requests waiting for room
        if idle:
            manager.changed(self)

    def admit(self, nbytes: int, what: str, reclaim: Callable[[], int] | None = None) -> None:
        """Make sure ``nbytes`` more fit beside every resident model, or refuse.

        Idle models are unloaded (least recently used first) if that makes room; when
        requests in flight hold the rest, it waits for them (up to the budget's
        ``wait_s``). A request that could not fit even beside its own model alone is
        refused at once.

        Args:
            nbytes: The bytes a request will add (its KV cache).
            what: The request, as the error message names it.
            reclaim: Drops the engine's own caches and returns the bytes freed; tried
                after idle models, before waiting.

        Raises:
            RequestTooLarge: It does not fit.
        """
        manager.make_room(self, nbytes, for_request=what, reclaim=reclaim)

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit now, without unloading anything."""
        with manager.cond:
            limit = manager.limit(for_request=True)
            return manager.used_bytes() + nbytes <= limit

    # ------------------------------------------------------------- loading

    def reserve(self, nbytes: int) -> None:
        """Claim room for a load of about ``nbytes``: unload idle models if needed.

        Raises:
            ModelTooLarge: ``nbytes`` alone is more than the budget.
            MemoryBudgetExceeded: Busy or pinned models hold the rest, and none went
                idle within the budget's wait.
        """
        with manager.cond:
            self.state = "loading"
            self.reserved = nbytes
        try:
            manager.make_room(self, nbytes)
        except BaseException:
            self.load_failed()
            raise

    def loaded(self) -> None:
        """The model is loaded; its keep-alive counts from now until a request comes."""
        with manager.cond:
            self.state = "loaded"
            self.reserved = 0
            self.loads += 1
            self.served = False
            self.last_used = manager.clock()
            self.last_used_wall = time.time()
            self.retry_at = 0.0
        manager.changed(self, force=True)

    def load_failed(self) -> None:
        with manager.cond:
            if self.state == "loading":
                self.state = "unloaded"
            self.reserved = 0
            manager.cond.notify_all()

    def try_begin_unload(self) -> bool:
        """Mark the model as unloading if no request uses it; False when one does.

        A request that begins after this waits for :meth:`unloaded`, then loads again.
        """
        with manager.cond:
            if self.users or self.state != "loaded":
                return False
            self.state = "unloading"
            return True

    def unloaded(self) -> None:
        """The model's weights and caches are gone."""
        with manager.cond:
            if self.state != "unloaded":
                self.unloads += 1
            self.state = "unloaded"
            self.publish_due = None
            manager.cond.notify_all()

    def count_rejection(self) -> None:
        with manager.cond:
            self.rejections += 1

    # ------------------------------------------------------------- reports

    def memory(self) -> tuple[int, int]:
        """(weights, caches) in bytes now; the reservation while loading."""
        if self.state == "loading":
            return self.reserved, 0
        if self.state == "unloaded":
            return 0, 0
        owner = self._owner()
        return owner.resident_bytes() if owner is not None else (0, 0)

    def expiry(self) -> float | None:
        """When the keep-alive ends, on the manager's clock (None: it does not)."""
        if self.state != "loaded" or self.users or self.pinned:
            return None
        keep = self.keep_alive
        if keep == FOREVER:
            return None
        if not self.served:
            keep = max(keep, LOAD_GRACE_S)
        return self.last_used + keep

    def stats(self) -> ResidencyStats:
        """This model's residency now."""
        with manager.cond:
            weights, caches = self.memory()
            now, wall = manager.clock(), time.time()
            expiry = self.expiry()
            idle = self.state == "loaded" and not self.users and self.last_used_wall is not None
            keep = self.keep_alive
            return ResidencyStats(
                state=self.state,
                memory_bytes=weights + caches,
                weights_bytes=weights,
                cache_bytes=caches,
                in_use=self.users,
                last_used=self.last_used_wall,
                idle_s=now - self.last_used if idle else None,
                keep_alive_s=None if keep == FOREVER else keep,
                expires_at=None if expiry is None else wall + (expiry - now),
                expires_in_s=None if expiry is None else max(0.0, expiry - now),
                pinned=self.pinned,
                loads=self.loads,
                unloads=self.unloads,
                evictions=self.evictions,
                memory_rejections=self.rejections,
            )

    def info(self) -> ResidentModelInfo:
        return ResidentModelInfo(**self.stats(), name=self.name, kind=self.kind, path=self.path)

    def publish(self) -> None:
        """Report the state to the publisher now (the manager throttles the calls)."""
        publisher = self._publisher
        if publisher is None:
            return
        with self._publish_lock:  # one write at a time, in order
            self._published_at = time.monotonic()
            if self.state == "unloaded":
                return
            try:
                publisher(self.stats())
            except Exception:  # a report must never fail a request
                logger.debug("Could not report the residency of %s", self.name, exc_info=True)

    def publish_wanted(self, force: bool) -> bool:
        """Whether to publish now; otherwise a later one is scheduled (manager's lock)."""
        if self._publisher is None or self.state == "unloaded":
            return False
        now = time.monotonic()
        if force or now - self._published_at >= PUBLISH_INTERVAL_S:
            self.publish_due = None
            return True
        if self.publish_due is None:
            self.publish_due = self._published_at + PUBLISH_INTERVAL_S
        return False


class ResidencyControls:
    """What an engine owning a :class:`Residency` offers its users: ``keep_alive``,
    ``pinned`` and :meth:`residency_stats`; its lease file (``_lease``, if any) is
    kept up to date for ``mlxi ps``."""

    _residency: Residency
    _lease: Any = None

    @property
    def keep_alive(self) -> float:
        """Seconds the model stays loaded after its last request (``math.inf``: until
        stopped or closed, the default unless ``MLXI_KEEP_ALIVE`` says otherwise).

        Set it with seconds or a duration (``"5m"``, ``"1h30m"``, ``"300ms"``); 0 unloads
        the model when a request ends, a negative number keeps it; None goes back to the
        process default. The next request loads the model again.
        """
        return self._residency.keep_alive

    @keep_alive.setter
    def keep_alive(self, value: Any) -> None:
        self._residency.keep_alive = value

    @property
    def pinned(self) -> bool:
        """A pinned model is never unloaded to make room, nor when its keep-alive ends."""
        return self._residency.pinned

    @pinned.setter
    def pinned(self, value: bool) -> None:
        self._residency.pinned = value

    def residency_stats(self) -> ResidencyStats:
        """Memory held, last use, keep-alive, expiry and pin of the model."""
        return self._residency.stats()

    def _publish_residency(self, stats: ResidencyStats) -> None:
        # A store model's lease file says what `mlxi ps` shows of it: times as dates
        # (spans such as idle_s would be stale when read), and when it was written.
        update = getattr(self._lease, "update", None)
        if update is not None:
            details = {k: v for k, v in stats.items() if k not in ("idle_s", "expires_in_s")}
            update({**details, "updated_at": time.time()})


# ------------------------------------------------------------------ process-wide


def set_memory_budget(value: Any, *, wait_s: float | None = None) -> int | None:
    """Set the budget of every model in the process (``MLXI_MAX_MEMORY`` otherwise).

    Args:
        value: ``"8GB"``, ``"512MiB"``, bytes, a fraction of the device's memory
            (``"0.6"``), or None for no budget (:func:`~.memory.parse_memory_size`).
        wait_s: How long a load waits for a busy model to go idle when the budget is
            full (default 30 s); 0 refuses at once.

    Returns:
        The budget in bytes (None: no budget).

    Raises:
        ValueError, TypeError: A value that is not a size.
    """
    nbytes = parse_memory_size(value, "budget")
    if wait_s is not None:
        if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or wait_s < 0:
            raise ValueError(f"wait_s must be a number of seconds >= 0, got {wait_s!r}")
        manager.wait_s = float(wait_s)
    manager.set_budget(nbytes)
    return nbytes


def memory_budget() -> int | None:
    """The budget in bytes (``MLXI_MAX_MEMORY`` or :func:`set_memory_budget`), or None."""
    return manager.budget()


def set_default_keep_alive(value: Any) -> float:
    """Set the keep-alive of models given none (``MLXI_KEEP_ALIVE`` otherwise).

    Returns:
        Seconds (``math.inf``: keep models loaded, the default).
    """
    seconds = parse_keep_alive(value)
    manager.set_default_keep_alive(seconds)
    return seconds


def default_keep_alive() -> float:
    """The keep-alive of models given none, in seconds (``math.inf``: forever)."""
    return manager.default_keep_alive()


def resident_models(*, include_unloaded: bool = False) -> list[ResidentModelInfo]:
    """Every model an engine of this process holds: memory, last use, expiry, pin.

    Least recently used first.
    """
    with manager.cond:
        entries = [e for e in manager.entries if isinstance(e, Residency)]
    infos = [e.info() for e in entries if include_unloaded or e.state != "unloaded"]
    return sorted(infos, key=lambda i: i["last_used"] or 0.0)


def memory_in_use() -> int:
    """Bytes the resident models hold together (weights, caches, loads in progress)."""
    with manager.cond:
        return manager.used_bytes()


def set_clock(clock: Callable[[], float] | None) -> None:
    """Measure keep-alives on another clock (tests drive time with it); None: the real one.

    The expiry thread looks again at once.
    """
    with manager.cond:
        manager.clock = clock or time.monotonic
        for entry in manager.entries:
            entry.last_used = manager.clock()
            entry.retry_at = 0.0
    manager.wake()


def wake(wait: float | None = None) -> bool:
    """Let the expiry thread look at the clock again (after a test moved it).

    Args:
        wait: Seconds to wait until it has unloaded every model whose keep-alive has
            ended by the clock, and gone back to sleep; None returns at once.

    Returns:
        False when ``wait`` ran out first.
    """
    return manager.wake(wait)


def pin_path(path: str, pinned: bool = True) -> None:
    """Pin (or unpin) every model loaded from the folder ``path``, now and later."""
    with manager.cond:
        if pinned:
            manager.pinned_paths.add(path)
        else:
            manager.pinned_paths.discard(path)
            for entry in manager.entries:
                if isinstance(entry, Residency) and entry.path == path:
                    entry._pinned = False
    manager.wake()
