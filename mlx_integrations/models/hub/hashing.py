"""Hash model files while something else is still working, so verifying costs no wall time.

Two helpers, both run one background thread and are used as context managers:

- :class:`DownloadHasher` follows the files a download is writing (huggingface_hub's
  ``blobs/<etag>.<id>.incomplete``) and hashes each one as it grows. A result is only
  used when it equals the sha256 the Hub published for that blob; anything else (a
  restarted transfer, a file that arrived between two looks, a non-LFS file) is hashed
  again afterwards, so the result is never worse than hashing after the download.
- :class:`FinishedFilesHasher` waits until a writer marks its files finished (mlx-lm
  writes ``model.safetensors.index.json`` after the last weight shard) and hashes them
  while the writer goes on with config and tokenizer files. A result is only used when
  the file's size and modification time did not change after it was hashed.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from mlx_integrations.models.manifest import FileEntry, sha256_file

_BUFFER = 4 << 20
_PASS_LIMIT = 16 << 20  # bytes read from one file before looking at the others
_MIN_READ = 1 << 20  # bytes that must be new before a growing file is read


@dataclass(frozen=True)
class HashedFile:
    """The sha256 of a file's bytes and the file's identity when they were read."""

    sha256: str
    size: int
    inode: tuple[int, int]
    mtime_ns: int


class _Aborted(Exception):
    """The owner of a background hasher no longer wants its results."""


class _BackgroundWorker:
    """A daemon thread running ``self._run`` until ``stop``; errors end it quietly."""

    def __init__(self, poll_s: float) -> None:
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._abort = threading.Event()
        self._thread = threading.Thread(target=self._guarded, name=type(self).__name__, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # After an error (or Ctrl-C) nobody needs the hashes: give up at once.
        self.stop(abort=exc_type is not None)

    def stop(self, abort: bool = False) -> None:
        """Let the thread finish what it can read now (or drop it all), and wait for it."""
        if abort:
            self._abort.set()
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _guarded(self) -> None:
        try:
            self._run()
        except (OSError, _Aborted):
            # A file vanished or cannot be read: the caller hashes it afterwards.
            return

    def _check_abort(self) -> None:
        if self._abort.is_set():
            raise _Aborted

    def result_for(self, path: Path) -> HashedFile | None:  # pragma: no cover - overridden
        raise NotImplementedError

    def entries(
        self,
        model_dir: Path,
        paths: list[str],
        trust: Callable[[Path, HashedFile], bool] | None = None,
    ) -> dict[str, FileEntry]:
        """Manifest entries for those of ``paths`` (under ``model_dir``) hashed here.

        Args:
            model_dir: The folder ``paths`` are relative to.
            paths: Files to look up.
            trust: Also required of a result (given the file's path), when set.
        """
        out: dict[str, FileEntry] = {}
        for rel in paths:
            path = Path(model_dir) / rel
            got = self.result_for(path)
            if got is not None and (trust is None or trust(path, got)):
                out[rel] = FileEntry(path=rel, size=got.size, sha256=got.sha256)
        return out

    def _run(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class _Tail:
    """One growing file, read up to its current size on each pump."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fh = open(path, "rb")  # closed in finish()
        st = os.fstat(self.fh.fileno())
        self.inode = (st.st_dev, st.st_ino)
        self.hash = hashlib.sha256()
        self.offset = 0
        self._view = memoryview(bytearray(_BUFFER))

    def pump(self, limit: int, at_least: int = 1) -> int:
        """Hash up to ``limit`` new bytes, when ``at_least`` are there; returns how many."""
        size = os.fstat(self.fh.fileno()).st_size
        if size < self.offset:  # truncated: the transfer started over
            self.hash = hashlib.sha256()
            self.offset = 0
        if size - self.offset < at_least:
            return 0
        # Read (not map: a file truncated under a mapping kills the process with SIGBUS)
        # into one reused buffer, in big pieces so the GIL changes hands rarely.
        start, end = self.offset, min(size, self.offset + limit)
        self.fh.seek(start)
        while self.offset < end:
            got = self.fh.readinto(self._view[: end - self.offset])
            if not got:
                break
            self.hash.update(self._view[:got])
            self.offset += got
        return self.offset - start

    def finish(self, check: Callable[[], None]) -> HashedFile:
        while self.pump(_PASS_LIMIT):
            check()
        st = os.fstat(self.fh.fileno())
        self.fh.close()
        return HashedFile(self.hash.hexdigest(), self.offset, self.inode, st.st_mtime_ns)


class DownloadHasher(_BackgroundWorker):
    """Hash the files a download writes into ``folder`` while they are written.

    Examples:
        >>> import tempfile, time
        >>> folder = Path(tempfile.mkdtemp())
        >>> with DownloadHasher(folder) as hasher:
        ...     _ = (folder / "x.incomplete").write_bytes(b"abc")
        ...     time.sleep(0.05)
        ...     _ = (folder / "x.incomplete").rename(folder / "x")
        >>> hasher.result_for(folder / "x").sha256[:12]
        'ba7816bf8f01'
    """

    def __init__(self, folder: Path, suffix: str = ".incomplete", poll_s: float = 0.01) -> None:
        super().__init__(poll_s)
        self.folder = Path(folder)
        self.suffix = suffix
        self._tails: dict[str, _Tail] = {}
        self._done: dict[tuple[int, int], HashedFile] = {}
        self._lock = threading.Lock()
        # Partial files of earlier, killed downloads: not this download's to hash.
        try:
            self._old = {n for n in os.listdir(self.folder) if n.endswith(suffix)}
        except OSError:
            self._old = set()

    def follow(self, path: Path) -> None:
        """Hash ``path`` too, from its first byte, though it was there before (a resumed file)."""
        self._old.discard(Path(path).name)

    def partial_files(self) -> list[Path]:
        """The files of this download being written now."""
        return [Path(self.folder) / name for name in list(self._tails)]

    def result_for(self, path: Path) -> HashedFile | None:
        """What was hashed of the file now at ``path``, when it covered the whole file."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        with self._lock:
            found = self._done.get((st.st_dev, st.st_ino))
        # Size and modification time too: an inode number is reused once freed.
        if found is None or (found.size, found.mtime_ns) != (st.st_size, st.st_mtime_ns):
            return None
        return found

    def _run(self) -> None:
        try:
            while True:
                stopping = self._stop.is_set()
                self._discover()
                for name, tail in list(self._tails.items()):
                    if not os.path.exists(tail.path):
                        # Renamed into place (or removed): the writer closed it.
                        self._record(tail.finish(self._check_abort))
                        del self._tails[name]
                    else:
                        # Big reads only: many small ones would cost more than the hash.
                        tail.pump(_PASS_LIMIT, at_least=_MIN_READ)
                if stopping:
                    break
                self._check_abort()
                self._stop.wait(self.poll_s)
            for tail in self._tails.values():
                self._record(tail.finish(self._check_abort))
        finally:
            for tail in self._tails.values():
                if not tail.fh.closed:
                    tail.fh.close()
            self._tails.clear()

    def _discover(self) -> None:
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return
        for name in names:
            if name.endswith(self.suffix) and name not in self._tails and name not in self._old:
                try:
                    self._tails[name] = _Tail(self.folder / name)
                except OSError:
                    continue

    def _record(self, result: HashedFile) -> None:
        with self._lock:
            self._done[result.inode] = result


class FinishedFilesHasher(_BackgroundWorker):
    """Hash files in ``folder`` matching ``select`` once ``marker`` exists there.

    Examples:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> with FinishedFilesHasher(folder, "done", lambda n: n.endswith(".bin")) as hasher:
        ...     _ = (folder / "a.bin").write_bytes(b"abc")
        ...     _ = (folder / "done").write_text("")
        >>> hasher.result_for(folder / "a.bin").size
        3
    """

    def __init__(
        self,
        folder: Path,
        marker: str,
        select: Callable[[str], bool],
        *,
        workers: int = 4,
        poll_s: float = 0.005,
    ) -> None:
        super().__init__(poll_s)
        self.folder = Path(folder)
        self.marker = marker
        self.select = select
        self.workers = workers
        self._done: dict[str, HashedFile] = {}

    def result_for(self, path: Path) -> HashedFile | None:
        """The hash of the file now at ``path`` (which may have been renamed since)."""
        found = self._done.get(Path(path).name)
        if found is None:
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None
        if (st.st_size, st.st_mtime_ns, (st.st_dev, st.st_ino)) != (
            found.size,
            found.mtime_ns,
            found.inode,
        ):
            return None
        return found

    def _run(self) -> None:
        while not (self.folder / self.marker).exists():
            if self._stop.is_set():
                if not (self.folder / self.marker).exists():
                    return
                break
            self._stop.wait(self.poll_s)
        names = sorted(n for n in os.listdir(self.folder) if self.select(n))
        if len(names) <= 1:  # one shard: no pool, fewer threads waiting for the GIL
            results = [self._hash(n) for n in names]
        else:
            with ThreadPoolExecutor(max_workers=min(self.workers, len(names))) as pool:
                results = list(pool.map(self._hash, names))
        for name, result in zip(names, results, strict=True):
            if result is not None:
                self._done[name] = result

    def _hash(self, name: str) -> HashedFile | None:
        path = self.folder / name
        try:
            self._check_abort()
            before = os.stat(path)
            digest = sha256_file(path, check=self._check_abort)
            after = os.stat(path)
        except OSError:
            return None
        if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
            return None
        return HashedFile(digest, after.st_size, (after.st_dev, after.st_ino), after.st_mtime_ns)
