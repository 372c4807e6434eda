"""Model names: what a store name may be, and how a name maps to a folder.

A store name is ``name`` or ``namespace/name`` (the shape of a Hugging Face repo id),
made of letters, digits, ``.``, ``_`` and ``-``. Names never hold path syntax, so a
name can never address a folder outside the store.
"""

from __future__ import annotations

import re
from pathlib import Path

from mlx_integrations.models.errors import InvalidNameError

_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
# Hugging Face repo ids: namespace/name, same rules as the Hub's validator.
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_HEX40 = re.compile(r"[0-9a-f]{40}")


def validate_name(name: str, *, what: str = "model name") -> str:
    """Check that ``name`` can be a store name and return it unchanged.

    Args:
        name: ``name`` or ``namespace/name``.
        what: How the message calls the value (``"alias"``, ``"model name"``).

    Raises:
        InvalidNameError: For empty names, absolute paths, ``..``, backslashes,
            more than one ``/``, ``--`` (the folder separator) or other characters.
    """
    if not isinstance(name, str):
        raise InvalidNameError(f"The {what} must be a string, got {type(name).__name__}.")
    hint = "Use letters, digits, '.', '_' and '-', with at most one '/', e.g. 'qwen3-4b-q4'."
    if not name:
        raise InvalidNameError(f"The {what} is empty.", hint=hint)
    if name.startswith(("/", "~")) or "\\" in name or ":" in name:
        raise InvalidNameError(f"The {what} {name!r} looks like a path, not a name.", hint=hint)
    parts = name.split("/")
    if any(p in {"", ".", ".."} for p in parts):
        raise InvalidNameError(f"The {what} {name!r} contains path traversal.", hint=hint)
    if len(parts) > 2:
        raise InvalidNameError(f"The {what} {name!r} has more than one '/'.", hint=hint)
    for part in parts:
        if not _SEGMENT.fullmatch(part) or "--" in part or part.endswith("."):
            raise InvalidNameError(
                f"The {what} {name!r} has characters a name cannot hold.", hint=hint
            )
    return name


def is_valid_name(name: str) -> bool:
    """True when ``name`` passes :func:`validate_name`."""
    try:
        validate_name(name)
    except InvalidNameError:
        return False
    return True


def is_repo_id(name: str) -> bool:
    """True for ``namespace/name`` strings that the Hub accepts as a repo id."""
    return bool(_REPO_ID.fullmatch(name)) and "--" not in name and ".." not in name


def is_commit_sha(revision: str | None) -> bool:
    """True for a full 40-hex commit sha (which the Hub cache resolves without a request)."""
    return bool(revision) and bool(_HEX40.fullmatch(str(revision)))


def folder_name(name: str) -> str:
    """The folder of a store name: ``org/model`` -> ``org--model`` (as the Hub cache does)."""
    return validate_name(name).replace("/", "--")


def looks_like_path(name: str) -> bool:
    """True when ``name`` is written as a path (absolute, ``./``, ``~``, or a ``.gguf`` file)."""
    return (
        name.startswith(("/", "./", "../", "~", "\\"))
        or name in {".", ".."}
        or name.lower().endswith(".gguf")
        or Path(name).is_absolute()
    )
