"""Process-wide sharing of engines, so adapters share one copy of the weights.

Engines are keyed by the resolved model folder and the engine options. Ten
``ChatMLX(model=X)`` objects hold one engine; an engine whose last user released
it stays in the pool (building the next adapter for it costs nothing) until
:func:`unload_idle` or :func:`shutdown` is called (from async code: ``await``
:func:`aunload_idle` or :func:`ashutdown`, which never block the event loop).

Whether its model stays in memory meanwhile is its residency
(:mod:`mlx_integrations.runtime.residency`), for every engine of the process, pooled
or not, chat or embedding: a model idle past its ``keep_alive`` is unloaded and loads
again at the next request (:func:`set_default_keep_alive`, ``MLXI_KEEP_ALIVE``;
forever by default); under a memory budget (:func:`set_memory_budget`,
``MLXI_MAX_MEMORY``) the least recently used idle models make room for a new one, a
:func:`pin`'ned model stays; :func:`resident_models` lists them all.

An engine whose model fails to load leaves the pool at once (the engine itself keeps
no thread and no lease): the next adapter made for that model gets a fresh engine,
and an adapter still holding the failed one retries the load on its next call (the
engine comes back into the pool if that succeeds).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlx_integrations.chat.fields import RequestError, RequestTypeError
from mlx_integrations.engine.base import BaseEngine
from mlx_integrations.models.resolve import resolve_model_path

if TYPE_CHECKING:
    from mlx_integrations.engine.mlx_engine import MLXEngine
    from mlx_integrations.engine.options import EngineOptions
from mlx_integrations.runtime.residency import (
    ResidentModelInfo,
    default_keep_alive,
    memory_budget,
    memory_in_use,
    pin_path,
    resident_models,
    set_default_keep_alive,
    set_memory_budget,
)

__all__ = [
    "DEFAULT_ENGINE_TYPE",
    "ENGINE_CLASSES",
    "ResidentModelInfo",
    "acquire",
    "apply_keep_alive",
    "ashutdown",
    "aunload_idle",
    "default_engine_type",
    "default_keep_alive",
    "engine_class",
    "engine_for",
    "engine_options",
    "memory_budget",
    "memory_in_use",
    "pin",
    "release",
    "resident_models",
    "retain",
    "set_default_keep_alive",
    "set_memory_budget",
    "share",
    "shared_engines",
    "shutdown",
    "unload_idle",
    "unpin",
]


@dataclass
class _Slot:
    engine: BaseEngine
    refs: int = 0


# Reentrant: an adapter's finalizer calls release() from the garbage collector, which
# can run on a thread that holds the lock already (while acquire() makes an engine).
_lock = threading.RLock()
_slots: dict[tuple[Any, ...], _Slot] = {}
# Engines whose load failed, out of the pool: their key and users, for a later success.
_failed: weakref.WeakKeyDictionary[BaseEngine, tuple[tuple[Any, ...], _Slot]] = (
    weakref.WeakKeyDictionary()
)


def _key(path: Path, engine_type: str, options: dict[str, Any]) -> tuple[Any, ...]:
    return (str(path), engine_type, tuple(sorted((k, repr(v)) for k, v in options.items())))


def acquire(
    model: str | Path, *, engine_type: str = "simple", keep_alive: Any = None, **options: Any
) -> BaseEngine:
    """Return the shared engine for ``model`` (made on first use) and count a user.

    Args:
        model: A folder, store alias or pulled Hub id.
        engine_type: ``"simple"`` (one request at a time), ``"batched"``
            (continuous batching) or ``"distributed"`` (sharded over the ranks of
            ``mlxi launch``); see :data:`ENGINE_CLASSES`.
        keep_alive: Seconds or a duration (``"5m"``, ``"1h30m"``) the model stays
            loaded after its last request; 0 unloads it after each request, -1 keeps it.
            It is the shared engine's: the last value given wins, as with Ollama's
            requests. None leaves it as it is (new engines: the process default,
            :func:`default_keep_alive`). Not part of the key.
        **options: Engine constructor options; different options, different engine.

    Raises:
        ValueError, TypeError: A ``keep_alive`` that is no duration, or other than
            forever for a distributed engine.
    """
    path = resolve_model_path(model)
    key = _key(path, engine_type, options)
    with _lock:
        slot = _slots.get(key)
        if slot is None:
            engine = _make(path, engine_type, options)
            if keep_alive is not None:
                apply_keep_alive(engine, keep_alive)
            slot = _Slot(engine)
            _slots[key] = slot
            _watch_loads(slot.engine, key)
        elif keep_alive is not None:
            apply_keep_alive(slot.engine, keep_alive)
        slot.refs += 1
        return slot.engine


def apply_keep_alive(engine: BaseEngine, keep_alive: Any) -> None:
    """Set ``engine.keep_alive`` (seconds or a duration; see :func:`acquire`).

    Raises:
        ValueError: The engine has no keep-alive (an engine of another project), or
            refuses this one (a distributed engine stays loaded).
    """
    if not hasattr(type(engine), "keep_alive"):
        raise ValueError(
            f"keep_alive={keep_alive!r} was given, but {type(engine).__name__} has no "
            "keep-alive: it decides itself when its model is loaded; drop keep_alive"
        )
    engine.keep_alive = keep_alive  # type: ignore[attr-defined]


def pin(model: str | Path | BaseEngine) -> None:
    """Keep a model loaded: never unloaded to make room, nor when its keep-alive ends.

    Args:
        model: A folder, store name or pulled Hub id (every engine of that model,
            chat or embedding, now and later), or one engine.
    """
    _pin(model, True)


def unpin(model: str | Path | BaseEngine) -> None:
    """Undo :func:`pin` (and an engine's own ``pinned=True``)."""
    _pin(model, False)


def _pin(model: str | Path | BaseEngine, pinned: bool) -> None:
    if isinstance(model, BaseEngine):
        if not hasattr(type(model), "pinned"):
            raise ValueError(f"{type(model).__name__} cannot be pinned: it has no residency")
        model.pinned = pinned  # type: ignore[attr-defined]
        return
    pin_path(str(resolve_model_path(model)), pinned)


def _watch_loads(engine: BaseEngine, key: tuple[Any, ...]) -> None:
    add_listener = getattr(engine, "add_load_listener", None)
    if add_listener is None:
        return
    ref = weakref.ref(engine)

    def after_load(loaded: bool) -> None:
        engine = ref()
        if engine is not None:
            _after_load(engine, key, loaded)

    add_listener(after_load)


def _after_load(engine: BaseEngine, key: tuple[Any, ...], loaded: bool) -> None:
    """Take an engine whose load failed out of the pool; put it back once it loads."""
    with _lock:
        if not loaded:
            slot = _slots.get(key)
            if slot is not None and slot.engine is engine:
                del _slots[key]
                _failed[engine] = (key, slot)
            return
        entry = _failed.pop(engine, None)
        if entry is not None and entry[0] not in _slots:
            _slots[entry[0]] = entry[1]


def _slot_of(engine: BaseEngine) -> _Slot | None:
    """The slot counting the users of ``engine``, in the pool or out of it (under _lock)."""
    for slot in _slots.values():
        if slot.engine is engine:
            return slot
    entry = _failed.get(engine)
    return entry[1] if entry is not None else None


# Engine kind -> "module:Class", imported on first use so the pool stays cheap to import.
ENGINE_CLASSES: dict[str, str] = {
    "simple": "mlx_integrations.engine.simple:SimpleEngine",
    "batched": "mlx_integrations.engine.batched.engine:BatchedEngine",
    "distributed": "mlx_integrations.engine.distributed.engine:DistributedEngine",
}


DEFAULT_ENGINE_TYPE = "batched"
"""The kind the adapters make when none is named: concurrent calls share decode steps,
and a call alone decodes outside the batch as fast as on ``SimpleEngine``."""


def default_engine_type(model: str | Path, options: Mapping[str, Any]) -> str:
    """The kind of engine to make for ``model`` when none is named.

    :data:`DEFAULT_ENGINE_TYPE`, except for what only ``SimpleEngine`` serves: a
    vision-language model (config.json with a ``vision_config``), or a quantized KV
    cache kept unquantized for its first tokens (``kv_bits`` with
    ``quantized_kv_start`` above 0). Options only ``BatchedEngine`` takes
    (``max_num_seqs``) keep the default, so that its own error names the conflict.

    Args:
        model: A folder, store alias or pulled Hub id.
        options: The engine options that will be passed to the engine.
    """
    if "max_num_seqs" in options:
        return DEFAULT_ENGINE_TYPE
    if options.get("kv_bits") is not None and options.get("quantized_kv_start"):
        return "simple"
    from mlx_integrations.engine.vision.vlm import is_vision_config

    try:
        config = json.loads((resolve_model_path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return DEFAULT_ENGINE_TYPE  # the engine says what is wrong with the folder
    if isinstance(config, dict) and is_vision_config(config):
        return "simple"
    return DEFAULT_ENGINE_TYPE


def engine_class(engine_type: str) -> type[MLXEngine]:
    """The engine class of a kind in :data:`ENGINE_CLASSES` (imported on first use).

    Raises:
        ValueError: For a kind not in :data:`ENGINE_CLASSES`.
    """
    target = ENGINE_CLASSES.get(engine_type)
    if target is None:
        known = ", ".join(repr(kind) for kind in ENGINE_CLASSES)
        raise ValueError(f"engine_type must be one of {known}, got {engine_type!r}")
    module, _, name = target.partition(":")
    cls: type[MLXEngine] = getattr(importlib.import_module(module), name)
    return cls


def engine_options(engine_type: str, options: Mapping[str, Any]) -> EngineOptions:
    """``options`` checked once, as the typed options of ``engine_type``'s engines
    (:class:`EngineOptions`, ``BatchedOptions``, ``DistributedOptions``).

    Raises:
        RequestError: An option that type does not take (saying which type does), or a
            bad value, with the option's name as its path.
    """
    options_type = engine_class(engine_type).options_type
    try:
        return options_type.build(None, options)
    except RequestTypeError as exc:
        unknown = exc.path
        takes = [
            kind
            for kind in ENGINE_CLASSES
            if kind != engine_type
            and unknown in {f.name for f in fields(engine_class(kind).options_type)}
        ]
        if unknown not in options or not takes:
            raise
        # An option of another engine type: the wrong kind of engine for it.
        raise RequestError(
            f"{unknown}={options[unknown]!r} is an option of engine_type="
            f"{' or '.join(map(repr, takes))}, not of engine_type={engine_type!r} "
            f"({options_type.engine_name}); use engine_type={takes[0]!r}, or drop it",
            unknown,
        ) from None


def _make(path: Path, engine_type: str, options: dict[str, Any]) -> BaseEngine:
    given = dict(options)
    residency = {name: given.pop(name) for name in ("pinned",) if name in given}
    typed = engine_options(engine_type, given)
    return engine_class(engine_type)(path, options=typed, **residency)


def retain(engine: BaseEngine) -> bool:
    """Count one more user of a pooled engine (e.g. a copy of an adapter).

    Returns:
        False if the engine is not in the pool (nothing to count).
    """
    with _lock:
        slot = _slot_of(engine)
        if slot is None:
            return False
        slot.refs += 1
        return True


def engine_for(
    owner: object,
    model: str | None,
    engine: Any,
    *,
    engine_type: str,
    options: dict[str, Any],
    adapter: str,
    keep_alive: Any = None,
) -> tuple[BaseEngine, bool]:
    """The engine an adapter runs on: the one it was given, or the pooled one for ``model``.

    A pooled engine counts ``owner`` as a user until ``owner`` is garbage-collected.
    A ``keep_alive`` (not None) is set on the engine, pooled or given.

    Returns:
        (engine, True when it came from the pool).

    Raises:
        ValueError: Neither a model nor an engine. TypeError: not a ``BaseEngine``.
    """
    if engine is None:
        if not model:
            raise ValueError(
                f"{adapter} needs model=... (a folder, store alias or pulled Hub id) or "
                "engine=... (any BaseEngine)"
            )
        pooled = acquire(model, engine_type=engine_type, keep_alive=keep_alive, **options)
        weakref.finalize(owner, release, pooled)
        return pooled, True
    if not isinstance(engine, BaseEngine):
        raise TypeError(f"engine must be a BaseEngine, got {type(engine).__name__}")
    if keep_alive is not None:
        apply_keep_alive(engine, keep_alive)
    return engine, False


def share(owner: object, engine: BaseEngine) -> None:
    """Count ``owner`` (a copy of an adapter) as one more user of a pooled engine."""
    if retain(engine):
        weakref.finalize(owner, release, engine)


def release(engine: BaseEngine) -> None:
    """Count one user less. The engine stays loaded until :func:`unload_idle`."""
    with _lock:
        slot = _slot_of(engine)
        if slot is not None and slot.refs > 0:
            slot.refs -= 1


def shared_engines() -> list[tuple[BaseEngine, int]]:
    """The pooled engines and how many users each has."""
    with _lock:
        return [(s.engine, s.refs) for s in _slots.values()]


def unload_idle() -> int:
    """Stop and forget engines nobody uses; return how many were unloaded.

    Synchronous: it blocks the calling thread until the engines have stopped. From
    async code, ``await aunload_idle()`` instead.
    """
    engines = _take_idle()
    for engine in engines:
        _stop(engine)
    return len(engines)


async def aunload_idle() -> int:
    """:func:`unload_idle` for async code: awaits each engine's ``stop()``.

    The event loop keeps running other tasks while the models are freed.

    Examples:
        >>> from mlx_integrations.engine import pool
        >>> async def tidy() -> None:
        ...     freed = await pool.aunload_idle()
    """
    engines = _take_idle()
    for engine in engines:
        await engine.stop()
    return len(engines)


def shutdown() -> None:
    """Stop every pooled engine (used or not). Blocks until they have stopped."""
    for engine in _take_all():
        _stop(engine)


async def ashutdown() -> None:
    """:func:`shutdown` for async code: awaits each engine's ``stop()``, loop free."""
    for engine in _take_all():
        await engine.stop()


def _take_idle() -> list[BaseEngine]:
    with _lock:
        idle = [k for k, s in _slots.items() if s.refs == 0]
        return [_slots.pop(k).engine for k in idle]


def _take_all() -> list[BaseEngine]:
    with _lock:
        engines = [s.engine for s in _slots.values()]
        _slots.clear()
        return engines


def _stop(engine: BaseEngine) -> None:
    from mlx_integrations.runtime.sync import run_sync

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(engine.stop())
    else:  # called from async code: stop on the shared background loop
        run_sync(engine.stop())
