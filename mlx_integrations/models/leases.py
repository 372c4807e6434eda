"""Models in use: one ``flock``'ed lease file per process that holds a stored model.

Layout: ``$MLXI_HOME/in-use/<folder>.<pid>.<x>.lock``, holding ``"<pid> <identity>"``,
then on a second line what the process holds of the model, as JSON (memory, last use,
keep-alive, expiry: see :func:`lease_details`), rewritten as that changes. Files of
earlier versions have the first line alone, and read as leases without details.
The system drops the flock when the process ends, however it ends, so a lease whose
file nobody locks is stale and is cleaned up. These functions expect the store's
lock to be held where they change files (see :meth:`ModelStore.lock`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlx_integrations.models.manifest import MANIFEST_FILE

IN_USE_DIR = "in-use"


class ModelLease:
    """This process's claim on a stored model; ``mlxi rm`` refuses to remove it meanwhile.

    The claim is an exclusive ``flock`` on a file of its own under ``in-use/``; the
    system drops it when the process ends, however it ends, so a crash leaves no claim.
    Release it with :meth:`release` (engines do when they stop) or by ``with``.
    """

    def __init__(self, path: Path, fh: Any, identity: str = "") -> None:
        self.path = path
        self._fh = fh
        self._pid = os.getpid()
        self._identity = identity
        self._lock = threading.Lock()

    @property
    def held(self) -> bool:
        """True until released."""
        return not self._fh.closed

    def update(self, details: Mapping[str, Any]) -> None:
        """Record what this process holds of the model, for ``mlxi ps``: memory, last use,
        keep-alive and expiry (a JSON object; see :func:`lease_details`).

        The file is rewritten in place (the flock stays on it); a reader that catches it
        half-written sees no details this once. Does nothing once released.
        """
        text = f"{self._pid} {self._identity}\n{json.dumps(dict(details), sort_keys=True)}\n"
        with self._lock:
            if self._fh.closed or os.getpid() != self._pid:
                return
            try:
                self._fh.seek(0)
                self._fh.truncate()
                self._fh.write(text)
                self._fh.flush()
            except (OSError, ValueError):  # a full disk: the claim itself still holds
                pass

    def release(self) -> None:
        """Give the claim up. Idempotent.

        In a forked child the file is only closed: the claim is the parent's.
        """
        with self._lock:
            if self._fh.closed:
                return
            if os.getpid() == self._pid:
                with contextlib.suppress(OSError):
                    self.path.unlink()
            self._fh.close()

    def __enter__(self) -> ModelLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


def take_lease(home: Path, model_dir: Path) -> ModelLease:
    """Claim the model folder ``model_dir`` of the store at ``home`` (store lock held).

    Raises:
        FileNotFoundError: The folder holds no model (any more).
        OSError: The store cannot be written.
    """
    identity = model_identity(model_dir)
    if identity is None:
        raise FileNotFoundError(f"{model_dir} is no longer in the store")
    leases = home / IN_USE_DIR
    leases.mkdir(exist_ok=True)
    path = leases / f"{model_dir.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.lock"
    fh = open(path, "w")  # held open while the lease lives
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: never contended
        # Which model: one removed with --force and made again under the same
        # name is not held by the old one's users.
        fh.write(f"{os.getpid()} {identity}")
        fh.flush()
    except BaseException:
        fh.close()
        path.unlink(missing_ok=True)
        raise
    return ModelLease(path, fh, identity)


def holders(home: Path, model_dir: Path, *, clean: bool = True) -> tuple[int, ...]:
    """Pids with a live lease on a model folder; with ``clean``, stale lease files go.

    Call with the store lock held when ``clean`` (leases are created under it).
    """
    identity = model_identity(model_dir)
    pids: list[int] = []
    for path in lease_files(home, model_dir.name):
        if not lease_alive(path):
            if clean:
                path.unlink(missing_ok=True)
            continue
        if _lease_identity(path) not in (None, identity):
            continue  # held on an earlier model of that name, removed with --force
        pids.append(int(path.name.rsplit(".", 3)[1]))
    return tuple(sorted(set(pids)))


def lease_files(home: Path, folder: str | None = None) -> list[Path]:
    """The lease files of the store at ``home`` (only those of ``folder`` when given)."""
    leases = home / IN_USE_DIR
    if not leases.is_dir():
        return []
    out = []
    for path in leases.glob("*.lock"):
        parts = path.name.rsplit(".", 3)
        if len(parts) == 4 and parts[1].isdigit() and folder in (None, parts[0]):
            out.append(path)
    return sorted(out)


def lease_details(home: Path, model_dir: Path) -> dict[int, dict[str, Any]]:
    """What each live process records of a model folder: pid -> details.

    The details are the process's last report (``memory_bytes``, ``weights_bytes``,
    ``cache_bytes``, ``state``, ``in_use``, ``last_used``, ``keep_alive_s``,
    ``expires_at``, ``pinned``...: the keys of ``ResidencyStats`` but the spans
    ``idle_s`` and ``expires_in_s``, and ``updated_at``, seconds since the epoch);
    an empty dict for a lease without them (written by an earlier version, or caught
    mid-write). A process
    holding the model twice (two engines) gives the one with the most memory.
    """
    identity = model_identity(model_dir)
    out: dict[int, dict[str, Any]] = {}
    for path in lease_files(home, model_dir.name):
        if not lease_alive(path) or _lease_identity(path) not in (None, identity):
            continue
        pid = int(path.name.rsplit(".", 3)[1])
        details = _lease_json(path)
        if pid not in out or details.get("memory_bytes", 0) > out[pid].get("memory_bytes", 0):
            out[pid] = details
    return out


def _lease_json(path: Path) -> dict[str, Any]:
    try:
        lines = path.read_text().splitlines()
        data = json.loads(lines[1]) if len(lines) > 1 else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def leased_folders(home: Path) -> set[str]:
    """Names of the model folders that have lease files (live or stale)."""
    return {p.name.rsplit(".", 3)[0] for p in lease_files(home)}


def lease_alive(path: Path) -> bool:
    """True when some process holds the flock of a lease file.

    Opened read-only (flock needs no write access); a file that cannot be checked
    counts as held, so a lease is never taken for stale by mistake.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # BlockingIOError included: held
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def model_identity(model_dir: Path) -> str | None:
    """Which model a folder holds now: its manifest's inode and modification time.

    (Inode numbers alone are reused once a removed folder is freed.)
    """
    try:
        st = os.stat(model_dir / MANIFEST_FILE)
    except OSError:
        return None
    return f"{st.st_ino}:{st.st_mtime_ns}"


def _lease_identity(path: Path) -> str | None:
    """The model identity a lease file records (None for an unreadable one)."""
    try:
        return path.read_text().split()[1]
    except (OSError, IndexError):
        return None
