"""What an engine owning a :class:`~.prefix_cache.PrefixCache` offers its users: its
stats, and clearing it (the runtime caches on the owner thread, the disk tier)."""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from mlx_integrations.engine.base import BaseEngine
from mlx_integrations.engine.cache.prefix_cache import MiB, PrefixCache
from mlx_integrations.engine.stats import ClearStats, PrefixCacheStats

__all__ = ["CacheControls"]

T = TypeVar("T")


class CacheControls(BaseEngine):
    """The cache methods of the engine contract, for an engine with a prefix cache
    (``_prefix``) whose MLX work runs on an owner thread (``_on_owner``)."""

    _prefix: PrefixCache
    _state_lock: threading.Lock
    _executor: ThreadPoolExecutor | None
    _model: Any

    @abstractmethod
    def _on_owner(self, executor: ThreadPoolExecutor, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on the owner thread when it is free."""

    def get_cache_stats(self) -> PrefixCacheStats:  # type: ignore[override]
        return self._prefix.stats()

    def clear_runtime_caches(self) -> ClearStats:  # type: ignore[override]
        """Drop cached prompt KV (warm caches and the disk tier stay) and return MLX's
        buffer pool.

        Runs on the owner thread, when no decode step is in progress.
        """
        with self._state_lock:
            executor = self._executor
        if executor is None or self._model is None:
            dropped, freed = self._prefix.clear()
            return ClearStats(
                dropped_entries=dropped, freed_cache_mb=freed / MiB, freed_buffer_pool_mb=0.0
            )
        return self._on_owner(executor, self._clear).result()

    def clear_disk_cache(self) -> ClearStats:
        """Remove this model's entries from the disk tier (``cache_dir``); writes still
        queued are dropped. Entries of other models and KV formats stay.
        """
        disk = self._prefix.disk
        dropped, freed = disk.clear() if disk is not None else (0, 0)
        return ClearStats(
            dropped_entries=dropped, freed_cache_mb=freed / MiB, freed_buffer_pool_mb=0.0
        )

    def _clear(self) -> ClearStats:
        """On the owner thread: empty the prefix cache and MLX's buffer pool."""
        import mlx.core as mx

        dropped, freed = self._prefix.clear()
        before = mx.get_cache_memory()
        mx.clear_cache()
        return ClearStats(
            dropped_entries=dropped,
            freed_cache_mb=freed / MiB,
            freed_buffer_pool_mb=(before - mx.get_cache_memory()) / MiB,
        )
