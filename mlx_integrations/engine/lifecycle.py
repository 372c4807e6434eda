"""An engine's model over time: load, unload when idle, stop, and its place in memory.

:class:`ModelLifecycle` is the part of :class:`~.mlx_engine.MLXEngine` that decides
when the model is in memory. It loads the model on its owner thread (after making room
within the memory budget), unloads it when its keep-alive ends or another model needs
the room (only while no request uses it), loads it again for the next request, and
refuses a request whose KV cache would not fit before it runs. The process-wide
bookkeeping (budget, expiry thread, eviction order) is
:mod:`mlx_integrations.runtime.residency`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mlx_integrations.engine.base import BaseEngine, run_blocking_startup_work
from mlx_integrations.engine.cache.kv_estimate import (
    KVShape,
    activation_itemsize,
    kv_shape,
    parameter_bytes,
)
from mlx_integrations.engine.decoding import repair_random_state
from mlx_integrations.models.lora.adapter import adapter_bytes
from mlx_integrations.runtime.memory import weights_on_disk
from mlx_integrations.runtime.owner import close_at_exit, make_owner_thread, stop_owner_thread
from mlx_integrations.runtime.residency import Residency, ResidencyControls

logger = logging.getLogger(__name__)


class ModelLifecycle(BaseEngine, ResidencyControls):
    """Loading, unloading and residency of one model on its owner thread.

    The subclass provides ``_load``/``_unload`` (on the owner thread), and the
    attributes ``_name``, ``_path``, ``_config``, ``_options``, ``_model``,
    ``_tokenizer``, ``_lease``, ``_jobs`` and ``_prefix``; it calls
    :meth:`_init_lifecycle` in its constructor, holds :meth:`_in_use` around each
    request, and :meth:`_reserve_kv`/:meth:`_release_kv` around each job.
    """

    _name: str
    _path: Path
    _config: dict[str, Any]
    _options: Any
    _model: Any
    _tokenizer: Any
    _lease: Any
    _jobs: dict[str, Any]
    _prefix: Any

    _fixed_residency: str | None = None
    """Why this kind of engine cannot unload and load again (keep-alive refused)."""

    def _init_lifecycle(self, keep_alive: Any, pinned: bool) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._start_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._load_listeners: list[Callable[[bool], None]] = []
        self._unload_listeners: list[Callable[[], None]] = []
        self._weights_bytes = 0
        self._kv_shape: KVShape | None = None
        self._kv_reserved: dict[str, int] = {}  # request id -> estimated KV bytes
        self._residency = Residency(
            self,
            self._name,
            "chat",
            str(self._path),
            keep_alive=keep_alive,
            pinned=pinned,
            fixed=self._fixed_residency,
            publish=self._publish_residency,
        )

    # ----------------------------------------------------------- residency

    @property
    def is_loaded(self) -> bool:
        return self._model is not None

    def resident_bytes(self) -> tuple[int, int]:
        """(weights, caches) in bytes: the prefix cache and the KV reserved by requests
        in flight count as caches. Any thread; takes no lock."""
        if self._model is None:
            return 0, 0
        reserved = list(self._kv_reserved.copy().values())
        return self._weights_bytes, int(self._prefix.nbytes) + self._kv_total(reserved)

    def unload_if_idle(self) -> bool:
        """Unload the model if no request uses it: weights, caches and MLX's buffer pool.

        The owner thread stays, and the tokenizer (plain Python) is kept; the next
        request loads the weights again. A request that arrives meanwhile waits for the
        unload to end, then loads. Never waits for a load or an unload in progress.

        Returns:
            True when the model was unloaded.
        """
        if not self._start_lock.acquire(blocking=False):
            return False  # loading or unloading right now
        try:
            if not self._residency.try_begin_unload():
                return False
            with self._state_lock:
                executor = self._executor
            try:
                if executor is not None:
                    executor.submit(self._unload).result()  # keeps the tokenizer
            finally:
                self._weights_bytes = 0
                self._residency.unloaded()
        finally:
            self._start_lock.release()
        self._notify_unload()
        return True

    def add_unload_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after each unload of an idle model (keep-alive or budget)."""
        self._unload_listeners.append(listener)

    def _notify_unload(self) -> None:
        for listener in list(self._unload_listeners):
            try:
                listener()
            except Exception:
                logger.exception("An unload listener of %s failed", self._name)

    # ----------------------------------------------------------- loading

    def prepare_for_start(self) -> None:
        """Load the model on its owner thread; blocks until loaded. Idempotent.

        Under a memory budget, idle models of the process are unloaded first when this
        one would not fit; a model larger than the budget is refused before its weights
        are read (:class:`~mlx_integrations.runtime.residency.ModelTooLarge`). A failed
        load keeps nothing: the owner thread is stopped and the store lease released,
        so the next call tries again from the start.
        """
        with self._start_lock:
            if self._model is not None:
                return
            try:
                self._residency.reserve(self._load_estimate())
                if self._executor is None:
                    self._executor = make_owner_thread(f"mlxi-owner-{self._path.name}")
                    close_at_exit(self, _release_owner_thread)
                executor = self._executor
                executor.submit(self._load_and_measure).result()
                self._on_loaded(executor)
            except BaseException:
                self._residency.load_failed()
                with self._state_lock:
                    executor_, self._executor = self._executor, None
                if executor_ is not None:
                    stop_owner_thread(executor_, wait=True)
                self._notify_load(False)
                raise
            self._residency.loaded()
            self._notify_load(True)

    def _load_and_measure(self) -> None:
        """Owner thread: load, then measure the weights and the KV cost of a token."""
        self._load()
        # Building the layers drew their random initial weights (replaced by the
        # model's) from MLX's global key: a chain of lazy splits that holds on to
        # memory at every load until the key is evaluated.
        repair_random_state()
        self._weights_bytes = self._measure_weights()
        opts = self._options
        bits = getattr(opts, "kv_bits", None)
        group = getattr(opts, "kv_group_size", 64)
        self._kv_shape = kv_shape(self._config, activation_itemsize(self._model), bits, group)

    def _measure_weights(self) -> int:
        """Bytes of the loaded model's parameters (and a draft model's)."""
        draft = getattr(getattr(self, "_draft", None), "model", None)
        return parameter_bytes(self._model, draft)

    def _load_estimate(self) -> int:
        """Bytes the load will take, from the weight files' sizes (nothing is read)."""
        adapter = getattr(self._options, "adapter_path", None)  # its weights load too
        total = weights_on_disk(self._path) + adapter_bytes(adapter)
        draft = getattr(self._options, "draft_model", None)
        if draft is not None:
            from mlx_integrations.models.resolve import resolve_model_path

            try:
                total += weights_on_disk(resolve_model_path(draft))
            except (OSError, ValueError):
                pass  # the load says what is wrong with it
        return total

    def _on_loaded(self, executor: ThreadPoolExecutor) -> None:
        """Called once the model is loaded, before any request is dispatched."""

    def add_load_listener(self, listener: Callable[[bool], None]) -> None:
        """Call ``listener(loaded)`` after each load attempt (the engine pool uses it)."""
        self._load_listeners.append(listener)

    def _notify_load(self, loaded: bool) -> None:
        for listener in list(self._load_listeners):
            try:
                listener(loaded)
            except Exception:  # a listener must not turn a load into a failure
                logger.exception("A load listener of %s failed", self._name)

    async def start(self) -> None:
        if not self._residency.ready:
            await run_blocking_startup_work(self.prepare_for_start)

    async def stop(self) -> None:
        """Abort queued and running requests, free the model. Idempotent."""
        with self._state_lock:
            for job in self._jobs.values():
                job.abort.set()
            executor, self._executor = self._executor, None
        if executor is None:
            return
        await asyncio.to_thread(executor.submit(self._unload).result)
        self._weights_bytes = 0
        self._residency.unloaded()
        stop_owner_thread(executor)

    def _load(self) -> None:
        raise NotImplementedError

    def _unload(self) -> None:
        raise NotImplementedError

    # ----------------------------------------------------------- requests

    @contextmanager
    def _in_use(self) -> Iterator[None]:
        """Hold the model loaded while a request is handled (rendering included)."""
        self._residency.begin_use()
        try:
            yield
        finally:
            self._residency.end_use()

    def _kv_total(self, reserved: list[int]) -> int:
        """The KV bytes requests in flight hold together: all at once by default (a
        batch); a serial engine overrides it (one runs at a time)."""
        return sum(reserved)

    def kv_cache_bytes(self, tokens: int) -> int | None:
        """Estimated bytes of one request's KV cache holding ``tokens`` tokens; None
        before the first load, or for a config without layer and head sizes."""
        shape = self._kv_shape
        return None if shape is None else shape.cache_bytes(tokens)

    async def _admit_kv(self, prompt_tokens: int, max_tokens: int) -> int:
        """Refuse a request whose KV cache would not fit, before it is dispatched.

        Where it does not fit, idle models are unloaded (least recently used first),
        then the engine's own prefix cache is dropped, then requests in flight are
        waited for (up to the budget's ``wait_s``).

        Returns:
            Its estimated KV bytes (0 when there is no estimate), for
            :meth:`_reserve_kv`.

        Raises:
            RequestTooLarge: It does not fit in what the budget (or the device) has
                left, even then.
        """
        need = self.kv_cache_bytes(prompt_tokens + max_tokens) or 0
        if not need:
            return 0
        reserved = list(self._kv_reserved.copy().values())
        extra = self._kv_total([*reserved, need]) - self._kv_total(reserved)
        if extra > 0 and not self._residency.fits(extra):
            what = f"A request of {prompt_tokens} prompt tokens and max_tokens={max_tokens}"
            await asyncio.to_thread(self._residency.admit, extra, what, self._reclaim_caches)
        return need

    def _reclaim_caches(self) -> int:
        """Drop the prefix cache (warm entries stay) for a request's room; bytes freed."""
        if not self._prefix.nbytes:
            return 0
        cleared = self.clear_runtime_caches()
        return int(cleared["freed_cache_mb"] * 1024 * 1024) if cleared else 0

    def _reserve_kv(self, request_id: str, nbytes: int) -> None:
        """Count a dispatched request (called under the state lock)."""
        self._residency.begin_use()
        if nbytes:
            self._kv_reserved[request_id] = nbytes

    def _release_kv(self, request_id: str) -> None:
        """A request ended: its KV reservation and its use go."""
        self._kv_reserved.pop(request_id, None)
        self._residency.end_use()


def _release_owner_thread(engine: ModelLifecycle) -> None:
    """At exit: release the owner thread's streams of an engine that was never stopped."""
    with engine._state_lock:
        executor, engine._executor = engine._executor, None
    if executor is not None:
        stop_owner_thread(executor)
