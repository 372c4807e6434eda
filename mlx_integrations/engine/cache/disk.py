"""The disk tier of the prefix cache: prompt KV that outlives the process.

An engine made with ``cache_dir`` keeps its entries in one folder of it per model and
KV format, ``<model>-<identity>-<kv format>/``, one file per token prefix
(:mod:`.kv_files`), within ``disk_cache_mb``. The identity
(:func:`~mlx_integrations.models.manifest.model_identity`) changes with the weights, so
new weights start an empty folder, and the folder of the old ones, found by the model
path it records, is removed.

What is written:

- entries that the memory tier evicts, or cannot hold (larger than its budget), whole:
  the next turn of that conversation, in this process or the next, prefills only what
  is new;
- once per prefix, for a prompt of two prefill pieces (``prefill_step_size``) or more,
  the KV of the longer of: its longest prefix of a whole number of ``ALIGN`` tokens (or
  of pieces, when a piece is shorter), and the prefix it shared with an earlier prompt
  (what the prefix cache served it). The first keeps most of an agent's long system
  prompt and tools after its first request, whatever the memory tier does later, and
  is the same for requests that differ only after it, so it is written once. The
  second is what requests turn out to share (the whole system prompt and tools, up to
  the user's turn), known from the second request on.

Writing never holds up decoding: on the owner thread a write costs views of the KV
(no copy; :func:`~.kv_files.snapshot`); a writer thread writes the bytes to a temporary
file and renames it, so a file is whole or absent. At most ``MAX_PENDING`` entries wait;
beyond that an entry is skipped. The KV buffers of a written entry are let go on the
owner thread, at its next call. The budget is kept by removing the least recently used
files (a hit touches its file); processes that share the folder see each other's files
when they write.

Reading: the folder is indexed when the engine is made (headers only), as hashes of
each entry's prefixes at every ``BLOCK`` tokens, so a lookup hashes the prompt once. On
a lookup the memory tier cannot match as far, the best file is loaded on the owner
thread, cut to what it shares with the prompt, and only the rest is prefilled. A file
that is damaged (cut short, a bad header, tensors that do not fit), made for other
weights or of another KV format is removed with a warning and never loaded. The data
itself carries no checksum (checking one would read the whole file at every load).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlx_integrations.engine.cache import kv_files
from mlx_integrations.engine.cache.cut import cut_length, lay_out, plain_kv
from mlx_integrations.engine.cache.kv_files import (
    FORMAT,
    SUFFIX,
    BadEntry,
    ForeignEntry,
    Snapshot,
    prefix_digests,
)
from mlx_integrations.engine.stats import DiskCacheStats
from mlx_integrations.runtime.owner import close_at_exit

if TYPE_CHECKING:
    from mlx_integrations.engine.options import EngineOptions

logger = logging.getLogger(__name__)

MiB = 1024 * 1024
MAX_PENDING = 4
"""Entries that may wait for the writer thread; more are skipped, never waited for."""
ALIGN = 256
"""A long prompt's stored prefix ends on a multiple of it (of the prefill step if smaller)."""
MODEL_FILE = "model.json"
"""In each model folder: the model path, identity and KV format it holds entries of."""
EXIT_FLUSH_S = 10.0
"""At interpreter exit, how long queued writes may still take."""


@dataclass
class _File:
    tokens: int
    size: int
    used: float  # the file's mtime: written, or last served
    digests: tuple[bytes, ...]


def open_disk_cache(model_dir: Path, options: EngineOptions, piece: int) -> DiskCache | None:
    """The disk tier an engine's options ask for (None without ``cache_dir``).

    Raises:
        ValueError: ``cache_dir`` cannot be made or written to.
    """
    if options.cache_dir is None:
        return None
    from mlx_integrations.models.manifest import model_identity

    kv = kv_files.kv_format(options.kv_bits, options.kv_group_size, options.quantized_kv_start)
    identity = model_identity(model_dir)
    if options.adapter_path is not None:  # another model's KV: entries of its own
        from mlx_integrations.models.lora.adapter import adapter_identity

        mixed = f"{identity}\0{adapter_identity(options.adapter_path)}"
        identity = hashlib.sha256(mixed.encode()).hexdigest()
    return DiskCache(
        Path(options.cache_dir),
        model_dir,
        identity=identity,
        adapter=options.adapter_path,
        kv=kv,
        kv_bits=options.kv_bits,
        kv_group_size=options.kv_group_size,
        max_bytes=int(options.disk_cache_mb * MiB),
        piece=piece,
    )


class DiskCache:
    """Prompt KV files of one model and KV format, under a byte budget.

    ``take``, ``offer``, ``offer_prompt``, ``bind`` and ``close`` run on the model's
    owner thread; ``flush``, ``clear`` and ``stats`` on any thread.

    Args:
        root: The engine's ``cache_dir``.
        model_dir: The model folder (named in the folder, recorded in its model.json).
        adapter: The adapter folder applied to the model, if any (recorded too: the
            entries of the model with and without it are kept apart).
        identity: The weights' identity.
        kv: The KV format tag (:func:`~.kv_files.kv_format`).
        kv_bits: Bits of a quantized cache (None for a plain one).
        kv_group_size: Its group size.
        max_bytes: Budget of the folder's files.
        piece: The engine's prefill step size.
    """

    def __init__(
        self,
        root: Path,
        model_dir: Path,
        *,
        identity: str,
        kv: str,
        kv_bits: int | None,
        kv_group_size: int,
        max_bytes: int,
        piece: int,
        adapter: str | None = None,
    ):
        self._adapter = adapter
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model_dir.name).strip(".-")[:48] or "model"
        self.folder = Path(root).expanduser().absolute() / f"{slug}-{identity[:12]}-{kv}"
        self.identity, self.kv, self.max_bytes, self.piece = identity, kv, max_bytes, piece
        self._kv_bits, self._group = kv_bits, kv_group_size
        self._seed = f"{FORMAT}\0{identity}\0{kv}\0".encode()
        self._layers: int | None = None  # layers of the model's cache, once bound
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._files: dict[str, _File] = {}
        self._by_digest: dict[bytes, set[str]] = {}
        self._queue: deque[Snapshot] = deque()
        self._busy: set[str] = set()  # names queued or being written
        self._retired: list[Snapshot] = []  # written: their MLX arrays go on the owner
        self._writer: threading.Thread | None = None
        self.hits = self.misses = self.tokens_loaded = self.writes = 0
        self.skipped = self.evictions = self.removed = 0
        self.load_seconds = 0.0
        self._prepare(model_dir)
        self._scan()
        close_at_exit(self, _flush_at_exit)

    # ------------------------------------------------------------ owner thread

    def bind(self, cache: list[Any]) -> None:
        """Learn the layers of the model's cache (a fresh one, at load).

        A model whose cache cannot be cut to a prefix (sliding windows, state-space
        layers) gets no disk tier: nothing is loaded or written for it.
        """
        self._layers = len(cache) if kv_files.storable_classes(cache) is not None else 0
        if not self._layers:
            logger.info("%s: this model's KV cache cannot be stored on disk", self.folder.name)

    def take(
        self, tokens: list[int], better_than: int = 0, key_step: int = 1
    ) -> tuple[list[Any], int] | None:
        """The KV of the longest stored prefix of ``tokens``, when it beats ``better_than``.

        ``key_step``: a plain KV cache's prefix is served in multiples of it, in buffers
        exactly that long (see :mod:`.cut`); a file that reaches no further than
        ``better_than`` so is not read.

        Returns:
            (cache, n): the cache holds the first ``n`` tokens of ``tokens`` (at least
            one is left to prefill); None when nothing on disk reaches further.
        """
        self.release()
        found = self._find(tokens) if self._layers != 0 else None
        reach = found[1] if found else 0
        if self._kv_bits is None:  # plain layers, cut to whole steps
            reach -= reach % key_step
        loaded = self._load(found[0], tokens) if found and reach > better_than else None
        if loaded is not None:
            cache, n = loaded
            served = cut_length(cache, n, key_step)
            if served <= better_than:
                loaded = None
            else:
                if key_step > 1 and plain_kv(cache):
                    lay_out(cache, served)
                loaded = cache, served
                with self._lock:
                    self.hits += 1
                    self.tokens_loaded += served
        if loaded is None and better_than == 0:
            self.misses += 1
        return loaded

    def offer_prompt(self, tokens: list[int], cache: list[Any], prompt: int, reused: int) -> None:
        """After a request: store the longer of its prompt's longest aligned prefix (see
        :data:`ALIGN`) and the prefix it shared with an earlier prompt (``reused``), once.

        ``tokens`` are those ``cache`` holds (the prompt, then the reply); only a
        prompt of two prefill pieces or more counts.
        """
        if prompt > self.piece:
            unit = min(self.piece, ALIGN)
            aligned = min(prompt, len(tokens)) // unit * unit
            self.offer(tokens, cache, max(aligned, min(reused, prompt, len(tokens))))

    def offer(
        self,
        tokens: list[int] | tuple[int, ...],
        cache: list[Any],
        n: int,
        min_tokens: int | None = None,
    ) -> None:
        """Queue the KV of ``tokens[:n]`` for writing, unless the disk holds it already.

        Prefixes shorter than ``min_tokens`` (default: a prefill piece) are not worth a file.
        """
        self.release()
        if n < max(1, self.piece if min_tokens is None else min_tokens) or n > len(tokens):
            return
        if not self._layers:
            return
        if len(cache) != self._layers or kv_files.storable_classes(cache) is None:
            return
        key = list(tokens[:n])
        name = prefix_digests(self._seed, key, [n])[n].hex() + SUFFIX
        found = self._find(key)
        with self._lock:
            if name in self._busy or (found is not None and found[1] >= n):
                return  # being written, or a file holds this whole prefix
            if len(self._queue) >= MAX_PENDING:
                self.skipped += 1
                return
        try:
            snap = kv_files.snapshot(cache, key, name, self._metadata(key, cache))
        except BadEntry as exc:
            logger.debug("Not storing a prefix of %d tokens: %s", n, exc)
            return
        if snap.nbytes > self.max_bytes:
            return
        with self._lock:
            self._queue.append(snap)
            self._busy.add(name)
            self._idle.notify_all()
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_loop, name=f"mlxi-disk-{self.folder.name}", daemon=True
                )
                self._writer.start()

    def release(self) -> None:
        """Let go of the KV arrays of finished writes (on the owner thread, which made them)."""
        with self._lock:
            done, self._retired = self._retired, []
        del done

    def close(self) -> None:
        """Write what is queued, stop the writer thread, release the arrays (at unload)."""
        self.flush()
        with self._lock:
            writer, self._writer = self._writer, None
            self._idle.notify_all()
        if writer is not None:
            writer.join()
        self.release()

    # -------------------------------------------------------------- any thread

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until queued entries are written; False if ``timeout`` s passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._busy, timeout)

    def clear(self) -> tuple[int, int]:
        """Remove every file of this folder; queued writes are dropped.

        Returns:
            (files removed, bytes they held).
        """
        with self._idle:
            while self._queue:
                snap = self._queue.popleft()
                self._busy.discard(snap.name)
                self._retired.append(snap)
            self._idle.wait_for(lambda: not self._busy)
            names = list(self._files)
            freed = sum(f.size for f in self._files.values())
            for name in names:
                self._forget(name)
        for name in names:
            (self.folder / name).unlink(missing_ok=True)
        return len(names), freed

    def stats(self) -> DiskCacheStats:
        with self._lock:
            return DiskCacheStats(
                path=str(self.folder),
                entry_count=len(self._files),
                current_disk_mb=sum(f.size for f in self._files.values()) / MiB,
                max_disk_mb=self.max_bytes / MiB,
                hits=self.hits,
                misses=self.misses,
                tokens_loaded=self.tokens_loaded,
                load_seconds=self.load_seconds,
                writes=self.writes,
                pending_writes=len(self._busy),
                skipped_writes=self.skipped,
                evictions=self.evictions,
                removed_files=self.removed,
            )

    # ----------------------------------------------------------------- internals

    def _prepare(self, model_dir: Path) -> None:
        """Make the folder; remove the folders of this model's earlier weights."""
        record: dict[str, str | None] = {
            "format": FORMAT,
            "model": str(model_dir.absolute()),
            "kv": self.kv,
            "adapter": self._adapter,  # folders of earlier versions have none: None
        }
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            target = self.folder / MODEL_FILE
            if not target.exists():
                tmp = self.folder / f".{MODEL_FILE}.{os.getpid()}.tmp"
                tmp.write_text(json.dumps({**record, "identity": self.identity}))
                os.replace(tmp, target)
        except OSError as exc:
            raise ValueError(
                f"cache_dir={str(self.folder.parent)!r} cannot hold the disk cache ({exc}); "
                "pass a folder you can write to, or cache_dir=None to keep the prefix cache "
                "in memory only"
            ) from exc
        for sibling in self.folder.parent.iterdir():
            if sibling == self.folder or not (sibling / MODEL_FILE).is_file():
                continue
            try:
                other = json.loads((sibling / MODEL_FILE).read_text())
            except (OSError, ValueError):
                continue
            stale = isinstance(other, dict) and other.get("identity") != self.identity
            if stale and all(other.get(k) == v for k, v in record.items()):
                logger.info("Removing %s: the disk cache of earlier weights", sibling)
                shutil.rmtree(sibling, ignore_errors=True)

    def _scan(self) -> None:
        """Index the folder's files (headers only); remove damaged and foreign ones."""
        seen: dict[str, os.stat_result] = {}
        with os.scandir(self.folder) as entries:
            for entry in entries:
                if entry.name.endswith(SUFFIX) and not entry.name.startswith("."):
                    seen[entry.name] = entry.stat()
                elif entry.name.endswith(".tmp") and _abandoned(entry.name):
                    Path(entry.path).unlink(missing_ok=True)
        with self._lock:
            for name in set(self._files) - set(seen):
                self._forget(name)  # removed by another process
            fresh = {n: s for n, s in seen.items() if n not in self._files}
            for name, st in seen.items():
                if name in self._files:
                    self._files[name].used = st.st_mtime
        for name, st in fresh.items():
            try:
                tensors, metadata = kv_files.read_header(self.folder / name)
                tokens = self._check(name, tensors, metadata)
            except FileNotFoundError:
                continue
            except (BadEntry, OSError) as exc:
                self._drop(name, exc)
                continue
            self._add(name, tokens, st.st_size, st.st_mtime)

    def _check(self, name: str, tensors: dict[str, Any], metadata: dict[str, str]) -> list[int]:
        stem = name[: -len(SUFFIX)]
        tokens = kv_files.check_entry(stem, tensors, metadata, self.identity, self.kv, self._seed)
        layers = len(json.loads(metadata["classes"]))
        if self._layers and layers != self._layers:
            raise BadEntry(f"{layers} layers where the model has {self._layers}")
        return tokens

    def _add(self, name: str, tokens: list[int], size: int, used: float) -> None:
        lengths = kv_files.lookup_lengths(len(tokens))
        digests = tuple(prefix_digests(self._seed, tokens, lengths).values())
        with self._lock:
            self._files[name] = _File(len(tokens), size, used, digests)
            for d in digests:
                self._by_digest.setdefault(d, set()).add(name)

    def _forget(self, name: str) -> None:
        """Drop a file from the index (the lock is held)."""
        gone = self._files.pop(name, None)
        for d in gone.digests if gone else ():
            names = self._by_digest.get(d)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._by_digest[d]

    def _drop(self, name: str, reason: BaseException) -> None:
        """Remove a file that must not be loaded, and say why."""
        what = "made for other weights" if isinstance(reason, ForeignEntry) else "damaged"
        logger.warning("Removing disk cache file %s (%s: %s)", self.folder / name, what, reason)
        with self._lock:
            self._forget(name)
            self.removed += 1
        (self.folder / name).unlink(missing_ok=True)

    def _find(self, tokens: list[int]) -> tuple[str, int] | None:
        """The file sharing the longest prefix with ``tokens`` (to ``BLOCK`` tokens), and
        a length it shares for sure."""
        with self._lock:
            if not self._files:
                return None
            ends = {f.tokens for f in self._files.values() if f.tokens <= len(tokens)}
        digests = prefix_digests(self._seed, tokens, [*kv_files.lookup_lengths(len(tokens)), *ends])
        with self._lock:
            for n in sorted(digests, reverse=True):
                names = self._by_digest.get(digests[n])
                if names:
                    return max(names, key=lambda nm: self._files[nm].used), n
        return None

    def _load(self, name: str, tokens: list[int]) -> tuple[list[Any], int] | None:
        """Read a file, check it, cut it to what it shares with ``tokens`` (owner thread)."""
        import mlx.core as mx

        path = self.folder / name
        start = time.perf_counter()
        try:
            tensors, metadata = kv_files.read_header(path)
            stored = self._check(name, tensors, metadata)
            loaded = mx.load(str(path))
            if not isinstance(loaded, dict) or set(loaded) != set(tensors):
                raise BadEntry("tensors changed while the file was read")
            mx.eval(list(loaded.values()))  # a bad file fails here, not inside a prefill
            cache = kv_files.build_cache(loaded, metadata)
        except (BadEntry, OSError, RuntimeError, ValueError, KeyError) as exc:
            if path.exists():
                self._drop(name, exc)
            else:  # removed meanwhile (the budget, another process): not damaged
                with self._lock:
                    self._forget(name)
            return None
        n = min(kv_files.common_prefix_len(stored, tokens), len(tokens) - 1)
        for layer in cache:
            layer.trim(len(stored) - n)
        now = time.time()
        try:
            os.utime(path, (now, now))  # the least recently used files go first
        except OSError:
            pass
        with self._lock:
            if name in self._files:
                self._files[name].used = now
            self.load_seconds += time.perf_counter() - start
        return cache, n

    def _metadata(self, tokens: list[int], cache: list[Any]) -> dict[str, str]:
        classes = kv_files.storable_classes(cache) or []
        first = cache[0].keys
        dtype = (first[1] if isinstance(first, tuple) else first).dtype
        return {
            "format": FORMAT,
            "identity": self.identity,
            "model": self.folder.name,
            "kv": self.kv,
            "kv_bits": "" if self._kv_bits is None else str(self._kv_bits),
            "kv_group_size": str(self._group),
            "dtype": str(dtype).rpartition(".")[2],
            "classes": json.dumps(classes),
            "tokens": json.dumps(tokens),
        }

    # ------------------------------------------------------------ writer thread

    def _write_loop(self) -> None:
        me = threading.current_thread()
        while True:
            with self._idle:
                self._idle.wait_for(lambda: self._queue or self._writer is not me)
                if not self._queue:
                    return  # closed
                snap = self._queue.popleft()
            try:
                self._write(snap)
            finally:
                with self._idle:
                    self._busy.discard(snap.name)
                    self._retired.append(snap)
                    self._idle.notify_all()
                del snap

    def _write(self, snap: Snapshot) -> None:
        path = self.folder / snap.name
        tmp = self.folder / f".{snap.name}.{os.getpid()}.tmp"
        try:
            kv_files.write_file(tmp, snap)
            os.replace(tmp, path)
            st = path.stat()
        except OSError as exc:
            logger.warning("Could not write disk cache file %s: %s", path, exc)
            tmp.unlink(missing_ok=True)
            with self._lock:
                self.skipped += 1
            return
        self._add(snap.name, list(snap.tokens), st.st_size, st.st_mtime)
        with self._lock:
            self.writes += 1
        self._fit(keep=snap.name)

    def _fit(self, keep: str) -> None:
        """Remove the least recently used files beyond the budget (files of other
        processes sharing the folder included)."""
        self._scan()
        with self._lock:
            total = sum(f.size for f in self._files.values())
            victims = []
            for name in sorted(self._files, key=lambda nm: self._files[nm].used):
                if total <= self.max_bytes:
                    break
                if name != keep:
                    total -= self._files[name].size
                    victims.append(name)
                    self._forget(name)
                    self.evictions += 1
        for name in victims:
            (self.folder / name).unlink(missing_ok=True)


def _abandoned(name: str) -> bool:
    """Whether a temporary file was left by a process that has ended."""
    try:
        pid = int(name.rsplit(".", 2)[-2])
        os.kill(pid, 0)
    except (ValueError, IndexError, ProcessLookupError):
        return True
    except PermissionError:
        return False
    return False


def _flush_at_exit(disk: DiskCache) -> None:
    if not disk.flush(EXIT_FLUSH_S):
        logger.warning("Exiting with disk cache writes unfinished in %s", disk.folder)
