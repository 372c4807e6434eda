"""Process-wide sharing of engines, so adapters share one copy of the weights.

Engines are keyed by the resolved model folder and the engine options. Ten
``ChatMLX(model=X)`` objects hold one engine; an engine whose last user released
it stays loaded (building the next adapter for it costs nothing) until
:func:`unload_idle` or :func:`shutdown` is called.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlx_integrations.engine.base import BaseEngine
from mlx_integrations.engine.loading import resolve_model_path


@dataclass
class _Slot:
    engine: BaseEngine
    refs: int = 0


_lock = threading.Lock()
_slots: dict[tuple[Any, ...], _Slot] = {}


def _key(path: Path, engine_type: str, options: dict[str, Any]) -> tuple[Any, ...]:
    return (str(path), engine_type, tuple(sorted((k, repr(v)) for k, v in options.items())))


def acquire(model: str | Path, *, engine_type: str = "simple", **options: Any) -> BaseEngine:
    """Return the shared engine for ``model`` (made on first use) and count a user.

    Args:
        model: A folder, store alias or pulled Hub id.
        engine_type: ``"simple"`` (one request at a time) or ``"batched"``
            (continuous batching, when available).
        **options: Engine constructor options; different options, different engine.
    """
    path = resolve_model_path(model)
    key = _key(path, engine_type, options)
    with _lock:
        slot = _slots.get(key)
        if slot is None:
            slot = _Slot(_make(path, engine_type, options))
            _slots[key] = slot
        slot.refs += 1
        return slot.engine


def _make(path: Path, engine_type: str, options: dict[str, Any]) -> BaseEngine:
    if engine_type == "simple":
        from mlx_integrations.engine.simple import SimpleEngine

        return SimpleEngine(path, **options)
    if engine_type == "batched":
        from mlx_integrations.engine.batched import BatchedEngine

        return BatchedEngine(path, **options)
    raise ValueError(f"engine_type must be 'simple' or 'batched', got {engine_type!r}")


def retain(engine: BaseEngine) -> bool:
    """Count one more user of a pooled engine (e.g. a copy of an adapter).

    Returns:
        False if the engine is not in the pool (nothing to count).
    """
    with _lock:
        for slot in _slots.values():
            if slot.engine is engine:
                slot.refs += 1
                return True
    return False


def engine_for(
    owner: object,
    model: str | None,
    engine: Any,
    *,
    engine_type: str,
    options: dict[str, Any],
    adapter: str,
) -> tuple[BaseEngine, bool]:
    """The engine an adapter runs on: the one it was given, or the pooled one for ``model``.

    A pooled engine counts ``owner`` as a user until ``owner`` is garbage-collected.

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
        pooled = acquire(model, engine_type=engine_type, **options)
        weakref.finalize(owner, release, pooled)
        return pooled, True
    if not isinstance(engine, BaseEngine):
        raise TypeError(f"engine must be a BaseEngine, got {type(engine).__name__}")
    return engine, False


def share(owner: object, engine: BaseEngine) -> None:
    """Count ``owner`` (a copy of an adapter) as one more user of a pooled engine."""
    if retain(engine):
        weakref.finalize(owner, release, engine)


def release(engine: BaseEngine) -> None:
    """Count one user less. The engine stays loaded until :func:`unload_idle`."""
    with _lock:
        for slot in _slots.values():
            if slot.engine is engine and slot.refs > 0:
                slot.refs -= 1
                return


def shared_engines() -> list[tuple[BaseEngine, int]]:
    """The pooled engines and how many users each has."""
    with _lock:
        return [(s.engine, s.refs) for s in _slots.values()]


def unload_idle() -> int:
    """Stop and forget engines nobody uses; return how many were unloaded.

    Synchronous: from async code, call it in a worker thread (``asyncio.to_thread``).
    """
    with _lock:
        idle = [k for k, s in _slots.items() if s.refs == 0]
        engines = [_slots.pop(k).engine for k in idle]
    for engine in engines:
        _stop(engine)
    return len(engines)


def shutdown() -> None:
    """Stop every pooled engine (used or not)."""
    with _lock:
        engines = [s.engine for s in _slots.values()]
        _slots.clear()
    for engine in engines:
        _stop(engine)


def _stop(engine: BaseEngine) -> None:
    from mlx_integrations.engine.sync import run_sync

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(engine.stop())
    else:  # called from async code: stop on the shared background loop
        run_sync(engine.stop())
