"""Files and folders of the store on disk: JSON reading, atomic writes, build-then-rename.

Every model folder (pull, quantize, import, GGUF conversion) is built in a temporary
folder beside its target and renamed into place in one step by :func:`rename_into_place`,
so an interrupted build never looks like a model.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlx_integrations.models.errors import JSONFileError, StoreIOError

TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"


def read_json(path: str | os.PathLike[str]) -> Any:
    """The value a JSON file holds.

    Raises:
        FileNotFoundError: There is no such file (callers decide what that means).
        JSONFileError: The file cannot be read or is not valid JSON; the message names it.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise JSONFileError(f"{path} cannot be read: {reason}.", str(path)) from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        raise JSONFileError(f"{path} is not valid JSON: {exc}.", str(path)) from exc


def read_json_object(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A JSON object file that may be absent (``config.json``): ``{}`` when missing or bad."""
    try:
        data = read_json(path)
    except (FileNotFoundError, JSONFileError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented UTF-8 JSON, atomically."""
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def atomic_write_text(path: Path, text: str) -> None:
    """Write a text file by writing a sibling temporary file and renaming it over."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def building_folder(tmp: Path) -> Iterator[Path]:
    """Create the folder ``tmp``; remove it on the way out unless it was renamed away.

    Raises:
        OSError: ``tmp`` cannot be created.
    """
    tmp.mkdir()
    try:
        yield tmp
    finally:
        # After rename_into_place there is nothing left here to remove.
        shutil.rmtree(tmp, ignore_errors=True)


def rename_into_place(tmp: Path, target: Path, *, replace: bool) -> Path | None:
    """Move the finished folder ``tmp`` to ``target`` in one rename.

    With ``replace``, an existing ``target`` is first renamed aside (and put back if the
    second rename fails); without it only an empty folder may stand at ``target``.

    Returns:
        The folder moved aside, for the caller to :func:`discard` once nothing needs it.

    Raises:
        OSError: ``target`` holds files (without ``replace``) or a rename failed.
    """
    aside = None
    if replace and (target.exists() or target.is_symlink()):
        aside = target.with_name(f"{TRASH_PREFIX}{target.name}-{uuid.uuid4().hex[:8]}")
        os.rename(target, aside)
    try:
        os.rename(tmp, target)  # replaces an empty folder; fails on one that holds files
    except OSError:
        if aside is not None and not target.exists():
            os.rename(aside, target)
        raise
    return aside


def discard(path: Path | None) -> None:
    """Delete a folder or file moved aside (nothing for None); errors are ignored."""
    if path is None:
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def disk_usage(path: Path) -> int:
    """Bytes of the regular files under ``path`` (symlinks are not followed or counted)."""
    path = Path(path)
    if path.is_symlink() or path.is_file():
        return 0 if path.is_symlink() else path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                with contextlib.suppress(OSError):
                    total += os.stat(p).st_size
    return total


def io_error(exc: OSError, action: str) -> StoreIOError:
    """Turn an OSError into a StoreIOError with a hint for the usual causes."""
    hints = {
        errno.ENOSPC: "Free some disk space (mlxi prune, mlxi rm) or set MLXI_HOME to a larger disk.",
        errno.EACCES: "Check the permissions of the store folder, or set MLXI_HOME to a writable folder.",
        errno.EROFS: "The store is on a read-only file system; set MLXI_HOME to a writable folder.",
        errno.EDQUOT: "Your disk quota is exhausted; free space or set MLXI_HOME elsewhere.",
    }
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    err = StoreIOError(
        f"Could not {action}: {reason} ({exc.filename or ''}). The store was left as it was.",
        hint=hints.get(exc.errno or 0),
    )
    err.errno = exc.errno
    return err
