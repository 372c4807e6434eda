"""Turn a model name into a folder that ``mlx_lm.load`` opens.

A name is tried, in order, as:

1. a path (absolute, ``./``, ``~``, or a ``.gguf`` file): a model folder is used as is; a
   GGUF file is imported into the store once and the imported folder is used after that;
2. a store name or alias (``qwen3-4b-q4``, ``org/model`` pulled with ``mlxi pull``);
3. a Hub repo id already in the Hugging Face cache (no request is made);
4. an existing folder relative to the working directory.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from mlx_integrations.models.errors import InvalidNameError, ModelNotFoundError
from mlx_integrations.models.names import is_repo_id, is_valid_name, looks_like_path
from mlx_integrations.models.store import ModelStore, default_store


def resolve_model(
    name: str | Path,
    *,
    store: ModelStore | None = None,
    download: bool = False,
) -> Path:
    """The folder of a model given by store alias, repo id, folder or GGUF file.

    Args:
        name: What to resolve.
        store: The store (default: ``$MLXI_HOME``).
        download: Pull a repo id that is neither stored nor cached (default: never
            touch the network).

    Returns:
        A folder with ``config.json`` and ``*.safetensors``.

    Raises:
        ModelNotFoundError: Nothing by that name; the hint says how to get it.
        InvalidNameError: ``name`` is neither a path nor a valid name.

    Example:
        >>> resolve_model("qwen3-4b-q4")  # doctest: +SKIP
        PosixPath('/home/me/.cache/mlxi/models/qwen3-4b-q4')
    """
    store = store or default_store()
    text = str(name)
    if isinstance(name, Path) or looks_like_path(text):
        return _resolve_path(Path(text).expanduser(), store)
    if not is_valid_name(text):
        if Path(text).exists():
            return _resolve_path(Path(text), store)
        raise InvalidNameError(
            f"{text!r} is neither a model name nor an existing path.",
            hint="Give a store name (mlxi list), a repo id like org/model, or a folder path.",
        )
    if store.contains(text):
        return store.get(text).path
    if is_repo_id(text):
        cached = _hf_cached(text)
        if cached is not None:
            return cached
    if Path(text).is_dir():
        return Path(text).resolve()
    if download and is_repo_id(text):
        from mlx_integrations.models.hub import pull

        return pull(text, store=store).model.path
    raise ModelNotFoundError(
        f"Model {text!r} is not in the store ({store.home}) nor in the Hugging Face cache.",
        hint=f"Run: mlxi pull {text}" if is_repo_id(text) else "See what is there: mlxi list",
    )


def _resolve_path(path: Path, store: ModelStore) -> Path:
    if path.is_dir():
        return path.resolve()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return _gguf_in_store(path.resolve(), store)
    if path.is_file() and path.name == "config.json":
        return path.parent.resolve()
    raise ModelNotFoundError(
        f"{str(path)!r} is not a model folder or a .gguf file.",
        hint="Pass a folder with config.json and *.safetensors, or a .gguf file.",
    )


def gguf_store_name(path: Path) -> str:
    """The store name a GGUF file is imported under: its stem plus a hash of where it is."""
    path = Path(path).resolve()
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem).strip("-._").lower()[:60] or "model"
    stem = re.sub(r"-{2,}", "-", stem)
    tag = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    return f"gguf-{stem}-{tag}"


def _gguf_in_store(path: Path, store: ModelStore) -> Path:
    """Import a GGUF file once; reuse the import while the file is unchanged."""
    from mlx_integrations.models.importer import import_model

    name = gguf_store_name(path)
    st = path.stat()
    if store.contains(name):
        model = store.get(name)
        src = model.manifest.source
        if src.path == str(path) and src.revision == f"{st.st_size}:{st.st_mtime_ns}":
            return model.path
    return import_model(path, name, store=store, overwrite=True).path


def _hf_cached(repo_id: str) -> Path | None:
    """The cached snapshot of ``repo_id`` at ``main``, without any request."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    from mlx_integrations.models.hub import MODEL_FILE_PATTERNS, hub_cache_dir

    try:
        path = Path(
            snapshot_download(
                repo_id,
                local_files_only=True,
                allow_patterns=list(MODEL_FILE_PATTERNS),
                cache_dir=hub_cache_dir(),
            )
        )
    except (LocalEntryNotFoundError, ValueError, OSError):
        return None
    return path if (path / "config.json").is_file() else None


__all__ = ["InvalidNameError", "ModelNotFoundError", "gguf_store_name", "resolve_model"]
