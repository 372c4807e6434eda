"""What the embedding and rerank engines share: an encoder model on its own owner thread.

An :class:`EncoderEngine` loads a model folder on a new owner thread and runs every
tokenization and forward pass there, since MLX arrays belong to the thread that made
them; callers on any thread, or on an event loop, submit work to it. Its model is a
resident of the process (:mod:`mlx_integrations.runtime.residency`): it unloads when
idle past its keep-alive, or to make room under the memory budget, and loads again at
the next call.

On the CPU, MLX runs the element-wise work of one stream on one thread, while the
matrix products use every core through BLAS. :meth:`EncoderEngine._forward_all` runs
consecutive batches on two streams of the owner thread, so that one batch's
element-wise work overlaps the other's.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from abc import abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Literal, TypeVar, cast, get_args

from mlx_integrations.runtime.memory import weights_on_disk
from mlx_integrations.runtime.owner import at_thread_exit, make_owner_thread, stop_owner_thread
from mlx_integrations.runtime.residency import Residency, ResidencyControls

__all__ = [
    "EncoderDtype",
    "EncoderEngine",
    "auto_tokenizer",
    "clear_encoder_engines",
    "pad_right",
    "shared",
    "split_batches",
]

EncoderDtype = Literal["float32", "float16", "bfloat16"]

T = TypeVar("T")
E = TypeVar("E", bound="EncoderEngine")

# Batches of at most this many tokens (padding included) stay in the CPU's caches;
# larger ones are split, which changes no result since rows are independent.
MAX_BATCH_TOKENS = 2048


class EncoderEngine(ResidencyControls):
    """An encoder model (BERT family) on its own owner thread, callable from any thread.

    Subclasses load their model and tokenizer in :meth:`_load_model` and say what they
    serve by returning an info object, kept as ``self.info``.
    """

    kind = "encoder"
    """What the model is, as :func:`mlx_integrations.runtime.residency.resident_models`
    and ``mlxi ps`` show it."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dtype: EncoderDtype = "float32",
        keep_alive: Any = None,
        pinned: bool = False,
    ):
        """Load the model on a new owner thread; returns when it is ready.

        Args:
            path: A model folder.
            dtype: The floating point type of the forward pass.
            keep_alive: Seconds or a duration (``"5m"``) the model stays loaded after
                its last call; 0 unloads it after each call, -1 keeps it; None (the
                default) follows ``MLXI_KEEP_ALIVE``, else keeps it loaded.
            pinned: Never unload it to make room for another model, nor when idle.

        Raises:
            ValueError: For an unsupported model or an unknown dtype.
            FileNotFoundError: When the folder lacks config.json or weights.
            ModelTooLarge: The weights alone exceed the memory budget (nothing is read).
        """
        if dtype not in get_args(EncoderDtype):
            raise ValueError(
                f"dtype must be one of {', '.join(get_args(EncoderDtype))}, not {dtype!r}."
            )
        self.path = Path(path).resolve()
        if not (self.path / "config.json").is_file() and not (self.path / "modules.json").is_file():
            raise FileNotFoundError(
                f"{self.path} is not a model folder: it has no config.json or modules.json."
            )
        self.dtype: EncoderDtype = dtype
        self._executor = make_owner_thread(f"mlxi-{self.kind}")
        self._closed = False
        self._model: Any = None
        self._lease: Any = None  # a store model is marked in use while loaded
        self._tokenizer: Any = None
        self._streams: tuple[Any, Any] | None = None
        self._weights_bytes = 0
        self._residency = Residency(
            self,
            self.path.name,
            self.kind,
            str(self.path),
            keep_alive=keep_alive,
            pinned=pinned,
            publish=self._publish_residency,
        )
        # An engine dropped without close() still stops its thread and frees its streams.
        self._finalizer = weakref.finalize(self, stop_owner_thread, self._executor, False)
        try:
            self.info = self._executor.submit(self._load).result()
        except BaseException:
            self.close()
            raise
        at_thread_exit(_close_live_engines)
        _live_engines.add(self)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def is_loaded(self) -> bool:
        """Whether the weights are in memory (False once idle past the keep-alive)."""
        return self._model is not None

    def resident_bytes(self) -> tuple[int, int]:
        """(weights, caches) in bytes; an encoder keeps no cache."""
        return (self._weights_bytes, 0) if self._model is not None else (0, 0)

    def unload_if_idle(self) -> bool:
        """Unload the weights if no call uses them; the next call loads them again.

        Returns:
            True when the model was unloaded.
        """
        if self._closed:
            return False
        try:
            done = self._executor.submit(self._unload_idle)
        except RuntimeError:  # closed meanwhile
            return False
        return done.result()

    def close(self) -> None:
        """Stop the owner thread after the work already submitted; frees the weights."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        self._executor.submit(self._unload)
        stop_owner_thread(self._executor, True)
        self._residency.unloaded()

    # -- caller side -------------------------------------------------------------------

    def _submit(self, work: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``work(*args)`` on the owner thread, loading the model first if needed."""
        if self._closed:
            raise RuntimeError(f"The {self.kind} engine for {self.path} is closed.")
        # In use from here: an unload queued after this call waits for its end.
        self._residency.begin_use()
        try:
            future = self._executor.submit(self._run_loaded, work, *args)
        except BaseException:
            self._residency.end_use()
            raise
        future.add_done_callback(lambda _: self._residency.end_use())
        return future

    # -- owner thread ------------------------------------------------------------------

    @abstractmethod
    def _load_model(self) -> Any:
        """Owner thread: set ``self._model`` and ``self._tokenizer``; return the info."""

    def _run_loaded(self, work: Callable[..., T], *args: Any) -> T:
        if self._model is None:  # unloaded while idle: load again, on this thread
            self._load()
        return work(*args)

    def _load(self) -> Any:
        import mlx.core as mx
        from mlx.utils import tree_flatten

        from mlx_integrations.models.resolve import lease_model

        # Room within the memory budget first: a model too large is refused unread.
        self._residency.reserve(weights_on_disk(self.path, recursive=True))
        try:
            self._lease = lease_model(self.path)
            info = self._load_model()
            assert self._model is not None
            # The layers' random initial weights (replaced by the model's) are lazy
            # splits of MLX's global key, which hold on to memory until it is evaluated.
            mx.eval(mx.random.state)
            leaves = tree_flatten(self._model.parameters(), destination={})
            self._weights_bytes = sum(v.nbytes for v in cast("dict[str, Any]", leaves).values())
            if self._streams is None:  # made once: MLX never frees a stream
                first = mx.default_stream(mx.default_device())
                on_cpu = mx.default_device() == mx.cpu
                self._streams = (first, mx.new_stream(mx.cpu) if on_cpu else first)
        except BaseException:
            self._unload()
            self._residency.load_failed()
            raise
        self._residency.loaded()
        return info

    def _unload_idle(self) -> bool:
        """Owner thread: unload unless a call is queued or running."""
        if not self._residency.try_begin_unload():
            return False
        try:
            self._unload()
        finally:
            self._residency.unloaded()
        return True

    def _unload(self) -> None:
        import mlx.core as mx

        self._model = None
        self._tokenizer = None
        self._weights_bytes = 0
        mx.clear_cache()
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()

    def _forward_all(self, batches: Sequence[T], forward: Callable[[T], Any]) -> list[Any]:
        """Owner thread: ``forward(batch)`` (an MLX array) for each batch, as numpy arrays.

        On the CPU, two consecutive batches are computed at once on the two streams.
        """
        import mlx.core as mx
        import numpy as np

        assert self._streams is not None
        group = 1 if self._streams[0] == self._streams[1] else 2
        out: list[Any] = []
        for start in range(0, len(batches), group):
            pending = []
            for stream, batch in zip(self._streams, batches[start : start + group], strict=False):
                with mx.stream(stream):
                    pending.append(forward(batch))
            mx.eval(pending)
            out.extend(np.array(result) for result in pending)
        return out


def split_batches(batches: list[list[int]], lengths: Sequence[int]) -> list[list[int]]:
    """Split batches whose padded size exceeds :data:`MAX_BATCH_TOKENS` tokens.

    Args:
        batches: Input indices, each batch sorted longest first (as ``plan_batches`` makes).
        lengths: The token count of each input.
    """
    out: list[list[int]] = []
    for batch in batches:
        rows = max(1, MAX_BATCH_TOKENS // max(1, lengths[batch[0]]))
        out.extend(batch[i : i + rows] for i in range(0, len(batch), rows))
    return out


def pad_right(ids: list[list[int]], types: list[list[int]] | None, pad_id: int) -> tuple[Any, ...]:
    """Token ids, attention mask and token types of a batch, padded on the right as BERT
    expects (attention and pooling ignore the padded slots), as MLX arrays."""
    import mlx.core as mx
    import numpy as np

    width = max(len(row) for row in ids)
    ids_np = np.full((len(ids), width), pad_id, dtype=np.int32)
    mask_np = np.zeros((len(ids), width), dtype=np.int32)
    types_np = np.zeros((len(ids), width), dtype=np.int32)
    for row, seq in enumerate(ids):
        ids_np[row, : len(seq)] = seq
        mask_np[row, : len(seq)] = 1
        if types is not None:
            types_np[row, : len(seq)] = types[row]
    return mx.array(ids_np), mx.array(mask_np), mx.array(types_np)


class _WithoutMessage(logging.Filter):
    """A logging filter that drops the records whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


def auto_tokenizer() -> Any:
    """transformers' ``AutoTokenizer``, imported without its "PyTorch was not found"
    warning: the engines use its tokenizers alone, which need no torch.

    Only that message of that import is dropped; transformers' other warnings stay.
    """
    quiet = _WithoutMessage("PyTorch was not found.")
    logger = logging.getLogger("transformers")
    logger.addFilter(quiet)
    try:
        from transformers import AutoTokenizer
    finally:
        logger.removeFilter(quiet)
    return AutoTokenizer


_live_engines: weakref.WeakSet[EncoderEngine] = weakref.WeakSet()


def _close_live_engines() -> None:
    for engine in list(_live_engines):
        engine.close()


# -- the process-wide pool ---------------------------------------------------------------

_pool: dict[tuple[type, Path, str], EncoderEngine] = {}
_pool_lock = threading.Lock()


def shared(cls: type[E], path: Path, dtype: EncoderDtype, keep_alive: Any) -> E:
    """The process's engine of class ``cls`` for a resolved folder and dtype, made once.

    A ``keep_alive`` (not None) is set on an engine that exists already.
    """
    key = (cls, path, dtype)
    with _pool_lock:
        engine = _pool.get(key)
        if engine is None or engine.closed:
            engine = cls(path, dtype=dtype, keep_alive=keep_alive)
            _pool[key] = engine
        elif keep_alive is not None:
            engine.keep_alive = keep_alive
        return cast(E, engine)


def clear_encoder_engines(cls: type[EncoderEngine] | None = None) -> int:
    """Close the pooled engines (of class ``cls``, or all) and free their weights.

    Returns:
        How many engines were closed.
    """
    with _pool_lock:
        keys = [key for key in _pool if cls is None or key[0] is cls]
        engines = [_pool.pop(key) for key in keys]
    for engine in engines:
        engine.close()
    return len(engines)
