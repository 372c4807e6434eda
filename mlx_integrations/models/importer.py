"""Import a local Hugging Face/MLX model folder or a GGUF file into the store."""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import shutil
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mlx_integrations.models.errors import IntegrityError, ModelNotFoundError
from mlx_integrations.models.folders import read_json_object
from mlx_integrations.models.hub.pull import MODEL_FILE_PATTERNS, dtype_of, quantization_of
from mlx_integrations.models.manifest import (
    Manifest,
    ModelSource,
    hash_files,
    model_files,
    sha256_file,
)
from mlx_integrations.models.names import validate_name
from mlx_integrations.models.progress import ProgressCallback, report
from mlx_integrations.models.store import ModelStore, StoredModel, default_store

logger = logging.getLogger(__name__)


def import_model(
    source: str | Path,
    name: str,
    *,
    store: ModelStore | None = None,
    overwrite: bool = False,
    dtype: str = "float32",
    trust_remote_code: bool = False,
    progress: ProgressCallback | None = None,
) -> StoredModel:
    """Copy a model folder, or convert a GGUF file, into the store under ``name``.

    Args:
        source: A folder with ``config.json`` and ``*.safetensors``, or a ``.gguf`` file.
        name: The store name.
        store: The store (default: ``$MLXI_HOME``).
        overwrite: Replace a model of that name.
        dtype: Weight dtype of a GGUF conversion.
        trust_remote_code: Also copy the folder's ``*.py`` files.
        progress: Receives ``"import"`` updates (bytes copied).

    Returns:
        The stored model.

    Examples:
        >>> import_model("~/models/SmolLM2-135M.gguf", "smollm2")  # doctest: +SKIP
    """
    store = store or default_store()
    validate_name(name)
    given = given_path(source)
    # The name the user gave says GGUF: a link's target may be a suffix-less cache blob.
    if given.is_file() and given.suffix.lower() == ".gguf":
        if not overwrite and not store.contains(name):
            # One copy per file: the same file (or an identical one) stored under
            # another name gets this name as an alias.
            same = stored_gguf(given, store, dtype=dtype)
            if same is not None:
                logger.warning(
                    "%s is already in the model store as %r (the same file, sha256 %s); "
                    "%r now names it too, nothing was copied.",
                    given.name,
                    same.name,
                    (same.manifest.source.sha256 or "?")[:12],
                    name,
                )
                return store.tag(same.name, name)
        return _import_gguf(given, name, store, overwrite, dtype, progress)
    src = given.resolve()
    if not src.is_dir():
        raise ModelNotFoundError(
            f"{str(source)!r} is neither a folder nor a .gguf file.",
            hint="Pass a model folder (config.json + *.safetensors) or a .gguf file.",
        )
    patterns = [*MODEL_FILE_PATTERNS, *(["*.py"] if trust_remote_code else [])]
    # Subfolders count too: sentence-transformers keeps its pooling config in them.
    files = [
        f
        for f in model_files(src)
        if not any(part.startswith(".") for part in f.split("/"))
        and any(fnmatch.fnmatch(f, p) for p in patterns)
    ]
    if "config.json" not in files or not any(f.endswith(".safetensors") for f in files):
        raise ModelNotFoundError(
            f"{src} has no config.json and *.safetensors weights.",
            hint="Convert PyTorch checkpoints first (mlx_lm.convert), or import a .gguf file.",
        )
    for rel in files:
        if rel.endswith(".safetensors"):
            _check_safetensors(src / rel)
    total = float(sum((src / f).stat().st_size for f in files))
    with store.building(name, overwrite=overwrite) as build:
        done = 0.0
        for rel in files:
            (build.path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, build.path / rel)
            done += (build.path / rel).stat().st_size
            report(progress, "import", "Copying", done, total, "B")
        report(progress, "import", "Copying", total, total, "B", done=True)
        config = read_json_object(build.path / "config.json")
        manifest = Manifest(
            name=name,
            source=ModelSource(kind="local", path=str(src)),
            files=hash_files(build.path, files),
            quantization=quantization_of(config),
            dtype=dtype_of(config),
        )
        return build.commit(manifest)


def stored_gguf(path: Path, store: ModelStore, *, dtype: str | None = None) -> StoredModel | None:
    """The stored import of the GGUF file at ``path``, or of a file with the same bytes.

    Cheapest first: an import of this very file, unchanged since (its size and mtime
    are recorded), then an import whose source has the same sha256 (the file is read
    once for that, and only when some import records a sha256).

    Args:
        path: The GGUF file.
        store: The store to look in.
        dtype: Only imports converted to this weight dtype (None: any).
    """
    imports = [
        m
        for m in store.list()
        if m.manifest.source.kind == "gguf" and dtype in (None, m.manifest.dtype)
    ]
    if not imports:
        return None
    st = path.stat()
    revision = f"{st.st_size}:{st.st_mtime_ns}"
    real = path.resolve()
    for model in imports:
        src = model.manifest.source
        if src.path and src.revision == revision and Path(src.path).resolve() == real:
            return model
    hashed = [m for m in imports if m.manifest.source.sha256]
    if not hashed:
        return None
    digest = sha256_file(path)
    return next((m for m in hashed if m.manifest.source.sha256 == digest), None)


def given_path(source: str | Path) -> Path:
    """``source`` made absolute as the user wrote it: ``~`` and ``..`` expanded, a
    symbolic link kept (its target may be a cache blob or a temporary download)."""
    return Path(os.path.abspath(Path(source).expanduser()))


def _check_safetensors(path: Path) -> None:
    """Refuse a weights file cut short (an interrupted copy or download) before it is
    stored: its manifest would record the broken file's sha256 and `mlxi verify` pass."""
    size = path.stat().st_size
    end = None
    try:
        with path.open("rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            if length <= size - 8:
                header = json.loads(fh.read(length))
                ends = (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__")
                end = 8 + length + max(ends, default=0)
    except (struct.error, ValueError, KeyError, TypeError, IndexError, AttributeError):
        end = None
    if end is None or end > size:
        needs = f" of the {end:,} its header needs" if end is not None else ""
        raise IntegrityError(
            f"{path} is not a whole safetensors file ({size:,} bytes{needs}).",
            hint="Copy, download or convert the model again, then import it.",
        )


def _import_gguf(
    src: Path,
    name: str,
    store: ModelStore,
    overwrite: bool,
    dtype: str,
    progress: ProgressCallback | None,
) -> StoredModel:
    from mlx_integrations.models.gguf.convert import convert_gguf, read_supported_gguf

    st = src.stat()
    failed = threading.Event()

    def going_on() -> None:
        if failed.is_set():
            raise InterruptedError  # the conversion failed: stop hashing

    with store.building(name, overwrite=overwrite) as build, ThreadPoolExecutor(1) as pool:
        # The source's sha256 names exactly which file the model came from; it is
        # computed beside the conversion, which reads the same file.
        digest = pool.submit(sha256_file, src, check=going_on)
        report(progress, "import", "Converting GGUF", 0, None, "step")
        try:
            convert_gguf(read_supported_gguf(src), build.path, dtype=dtype)
        except BaseException:
            failed.set()
            raise
        report(progress, "import", "Converting GGUF", 1, 1, "step", done=True)
        files = model_files(build.path)
        config = read_json_object(build.path / "config.json")
        manifest = Manifest(
            name=name,
            # revision records the file's size and mtime, so a changed file is re-imported.
            source=ModelSource(
                kind="gguf",
                path=str(src),
                revision=f"{st.st_size}:{st.st_mtime_ns}",
                sha256=digest.result(),
            ),
            files=hash_files(build.path, files),
            quantization=quantization_of(config),
            dtype=dtype_of(config) or dtype,
        )
        return build.commit(manifest)
