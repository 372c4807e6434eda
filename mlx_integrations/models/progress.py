"""Progress reports of long store operations, free of any terminal library.

The store calls a :data:`ProgressCallback` with :class:`ProgressUpdate` values; the CLI
draws them with Rich, a script can log them or ignore them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ProgressUpdate:
    """The state of one task of an operation.

    Attributes:
        task: ``"bytes"`` (download), ``"files"`` (download), ``"hash"``, ``"quantize"``,
            ``"import"`` or ``"warm"``.
        description: A short human label.
        completed: Units done so far.
        total: Units in all, or None while unknown.
        unit: ``"B"`` for bytes, ``"file"``, ``"token"`` or ``"step"``.
        done: True on the task's last update.
    """

    task: str
    description: str
    completed: float
    total: float | None
    unit: str
    done: bool = False


ProgressCallback = Callable[[ProgressUpdate], None]


def report(
    callback: ProgressCallback | None,
    task: str,
    description: str,
    completed: float,
    total: float | None,
    unit: str = "step",
    *,
    done: bool = False,
) -> None:
    """Send one update when a callback is set."""
    if callback is not None:
        callback(ProgressUpdate(task, description, completed, total, unit, done))


def tqdm_bridge(
    callback: ProgressCallback | None, *, task: str | None = None, base: float = 0.0
) -> type:
    """A tqdm-like class for ``snapshot_download(tqdm_class=...)`` that feeds ``callback``.

    huggingface_hub drives three bars: ``"Downloading bytes"`` (network), ``"Reconstructing
    ..."`` (bytes written, same count for plain HTTP) and ``"Fetching N files"``. The bytes
    written and the file count are forwarded; the library grows ``total`` after creating
    a bar, so each update re-reads it. Without a callback the class draws nothing, so the
    library stays quiet on its own.

    Args:
        callback: Receives the updates.
        task: Report every bar as this task (``"bytes"`` for one ``http_get``, whose bar
            starts at the size already downloaded).
        base: Bytes done before these bars (files resumed first), added to count and total.
    """
    lock = threading.Lock()

    class _Bridge:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            desc = str(kwargs.get("desc") or "")
            self.desc = desc
            if task is not None:
                self.task: str | None = task
                self.unit = str(kwargs.get("unit") or "B")
            elif desc.startswith("Reconstruct"):
                self.task = "bytes"
                self.unit = "B"
            elif desc.startswith("Fetching") or desc.startswith("[dry-run]"):
                self.task = "files"
                self.unit = "file"
            else:
                self.task = None  # the network bar duplicates the bytes written
                self.unit = str(kwargs.get("unit") or "it")
            self.total = kwargs.get("total")
            self.n: float = kwargs.get("initial") or 0
            self._start = time.monotonic()
            if self.n:  # a resumed download: the bar starts where the file is
                self._emit()

        def __enter__(self) -> _Bridge:
            return self

        def __exit__(self, *exc: object) -> None:
            self.close()

        @property
        def format_dict(self) -> dict[str, Any]:
            elapsed = max(time.monotonic() - self._start, 1e-9)
            return {"n": self.n, "total": self.total, "rate": self.n / elapsed}

        def _emit(self, done: bool = False) -> None:
            if self.task is None or callback is None:
                return
            label = "Downloading" if self.task == "bytes" else "Files"
            extra = base if self.task == "bytes" else 0.0
            total = float(self.total) + extra if self.total else (extra or None)
            report(callback, self.task, label, self.n + extra, total, self.unit, done=done)

        def update(self, n: float | None = 1) -> None:
            with lock:
                self.n += n or 0
                self._emit()

        def refresh(self, *args: Any, **kwargs: Any) -> None:
            self._emit()

        def close(self) -> None:
            self._emit(done=True)

        def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
            self.desc = desc or ""

        set_description_str = set_description

        def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
            pass

        def set_postfix(self, *args: Any, **kwargs: Any) -> None:
            pass

    return _Bridge
