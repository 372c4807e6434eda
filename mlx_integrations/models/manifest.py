"""The manifest of a stored model: where it came from and the sha256 of every file.

Each model folder in the store holds ``mlxi-manifest.json``. It is written last, by
an atomic rename, so a folder without a manifest is never taken for a model.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from mlx_integrations.models.folders import read_json
from mlx_integrations.models.quality.report import QuantizationQuality, Verdict

MANIFEST_FILE = "mlxi-manifest.json"
SCHEMA_VERSION = 1

SourceKind = Literal["hub", "local", "gguf", "quantize", "fuse"]

# Files that belong to the store's bookkeeping rather than to the model.
_NOT_MODEL_FILES = {MANIFEST_FILE}
_NOT_MODEL_DIRS = {"warm", ".cache"}


@dataclass(frozen=True)
class ModelSource:
    """Where a stored model came from.

    Attributes:
        kind: ``"hub"`` (pulled), ``"local"`` (imported folder), ``"gguf"`` (imported
            GGUF file), ``"quantize"`` (made from another model) or ``"fuse"`` (a model
            with an adapter folded in).
        repo_id: Hub repository, for pulled models.
        revision: The revision that was asked for (branch, tag or sha).
        commit: The resolved 40-hex commit sha the files come from.
        endpoint: Hub endpoint used, when not the default one.
        path: The imported file or folder, for local and GGUF imports: absolute, as
            the user named it (a symbolic link is kept, not followed); the adapter
            folder, for a fused model.
        base: The store name or path a quantized or fused model was made from.
        sha256: The sha256 of the imported GGUF file (None in manifests written
            before it was recorded).
        adapter_sha256: The sha256 of the ``adapters.safetensors`` folded into a fused
            model (None for other models).
    """

    kind: SourceKind
    repo_id: str | None = None
    revision: str | None = None
    commit: str | None = None
    endpoint: str | None = None
    path: str | None = None
    base: str | None = None
    sha256: str | None = None
    adapter_sha256: str | None = None


@dataclass(frozen=True)
class FileEntry:
    """One file of a model, relative to the model folder."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class QuantizationInfo:
    """How a model's weights are quantized (mlx-lm's ``quantization`` config)."""

    bits: int
    group_size: int
    mode: str = "affine"
    recipe: str | None = None


@dataclass(frozen=True)
class Manifest:
    """What the store knows about one model.

    ``quality`` holds what quantization cost a model that ``quantize_model`` made
    (None for other models, for vision models, with ``evaluate=False`` and in manifests
    written before it was measured); the manifest file stores its figures with their
    verdict, and :attr:`verdict` says it.

    Examples:
        >>> m = Manifest(name="tiny", source=ModelSource(kind="local", path="/m"))
        >>> Manifest.from_json(m.to_json()) == m
        True
    """

    name: str
    source: ModelSource
    files: tuple[FileEntry, ...] = ()
    quantization: QuantizationInfo | None = None
    dtype: str | None = None
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    schema: int = SCHEMA_VERSION
    quality: QuantizationQuality | None = None

    @property
    def size_bytes(self) -> int:
        """Total size of the model files."""
        return sum(f.size for f in self.files)

    @property
    def verdict(self) -> Verdict | None:
        """What quantization did to the model: ``"close"``, ``"degraded"`` or
        ``"damaged"`` (see :attr:`QuantizationQuality.verdict`); None where it was not
        measured."""
        return self.quality.verdict if self.quality is not None else None

    @property
    def digest(self) -> str:
        """A sha256 over the files' names and hashes: the model's identity."""
        h = hashlib.sha256()
        for f in sorted(self.files, key=lambda f: f.path):
            h.update(f"{f.path}\0{f.sha256}\n".encode())
        return h.hexdigest()

    def to_dict(self) -> dict[str, Any]:
        """The manifest as JSON-ready data."""
        data = asdict(self)
        data["files"] = [asdict(f) for f in self.files]
        # With its verdict, for whoever reads the file (from_dict works it out again).
        data["quality"] = self.quality.to_dict() if self.quality is not None else None
        if data["source"]["adapter_sha256"] is None:
            # Only fused models have one: other manifests stay as earlier versions read them.
            del data["source"]["adapter_sha256"]
        return data

    def to_json(self) -> str:
        """The manifest as indented JSON text."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        """Build a manifest from :meth:`to_dict` data."""
        q = data.get("quantization")
        quality = data.get("quality")
        return cls(
            name=data["name"],
            source=ModelSource(**data["source"]),
            files=tuple(FileEntry(**f) for f in data.get("files", [])),
            quantization=QuantizationInfo(**q) if q else None,
            dtype=data.get("dtype"),
            created_at=data.get("created_at", ""),
            schema=data.get("schema", SCHEMA_VERSION),
            quality=QuantizationQuality.from_dict(quality) if quality else None,
        )

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse manifest JSON text."""
        return cls.from_dict(json.loads(text))

    @classmethod
    def read(cls, model_dir: Path) -> Manifest:
        """Read the manifest of a model folder.

        Raises:
            FileNotFoundError: The folder has no manifest.
            JSONFileError: The manifest cannot be read or is not JSON.
        """
        return cls.from_dict(read_json(Path(model_dir) / MANIFEST_FILE))


def sha256_file(
    path: Path, chunk_size: int = 4 << 20, check: Callable[[], None] | None = None
) -> str:
    """The sha256 of a file, read into one reused buffer of ``chunk_size`` bytes.

    Big reads keep the GIL changes rare (hashlib and the read release it), so hashing
    threads run beside a busy main thread. The file is read, not mapped: a file cut
    short under a mapping would kill the process.
    """
    h = hashlib.sha256()
    view = memoryview(bytearray(chunk_size))
    with open(path, "rb", buffering=0) as fh:
        while got := fh.readinto(view):
            h.update(view[:got])
            if check is not None:
                check()  # may raise to stop early
    return h.hexdigest()


def model_files(model_dir: Path) -> list[str]:
    """Relative paths of the model files in a folder, leaving out store bookkeeping."""
    model_dir = Path(model_dir)
    out: list[str] = []
    for root, dirs, files in os.walk(model_dir, followlinks=False):
        rel_root = Path(root).relative_to(model_dir)
        if rel_root == Path("."):
            dirs[:] = [d for d in dirs if d not in _NOT_MODEL_DIRS]
        for name in files:
            rel = (rel_root / name).as_posix()
            if rel not in _NOT_MODEL_FILES:
                out.append(rel)
    return sorted(out)


def model_identity(model_dir: Path) -> str:
    """A cheap identity of a model's weights: it changes when the weights do.

    The manifest digest of a stored model (the sha256 of its files, made once, when it
    was stored), with the name, size and modification time of every weight file and
    the bytes of config.json; no weight file is read. A copy of a folder outside the
    store is another identity (its files are newer), which is safe: what is keyed by
    it (the engines' disk cache of prompt KV) is computed again.
    """
    model_dir = Path(model_dir)
    h = hashlib.sha256(b"mlxi-model-identity/1\n")
    try:
        h.update(Manifest.read(model_dir).digest.encode())
    except (OSError, ValueError, KeyError, TypeError):
        pass  # outside the store: the files alone say it
    config = model_dir / "config.json"
    h.update(config.read_bytes() if config.is_file() else b"")
    for rel in model_files(model_dir):
        if rel.endswith((".safetensors", ".npz", ".gguf")):
            st = (model_dir / rel).stat()
            h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def hash_files(
    model_dir: Path,
    paths: Iterable[str],
    *,
    on_file: Callable[[str, int], None] | None = None,
    workers: int = 4,
    known: Mapping[str, FileEntry] | None = None,
) -> tuple[FileEntry, ...]:
    """Hash files of a model folder in parallel.

    Args:
        model_dir: The folder.
        paths: Relative paths to hash.
        on_file: Called with (path, size) after each file.
        workers: Hashing threads.
        known: Entries already hashed (while the files were written), used as they are.

    Returns:
        One entry per path, in the order of ``paths``.
    """
    model_dir = Path(model_dir)
    paths = list(paths)
    if known:
        for rel in paths:
            if rel in known and on_file is not None:
                on_file(rel, known[rel].size)
        fresh = {
            e.path: e
            for e in hash_files(
                model_dir, [p for p in paths if p not in known], on_file=on_file, workers=workers
            )
        }
        return tuple(known.get(p) or fresh[p] for p in paths)

    def one(rel: str) -> FileEntry:
        full = model_dir / rel
        entry = FileEntry(path=rel, size=full.stat().st_size, sha256=sha256_file(full))
        if on_file is not None:
            on_file(rel, entry.size)
        return entry

    if len(paths) <= 1:
        return tuple(one(p) for p in paths)
    with ThreadPoolExecutor(max_workers=min(workers, len(paths))) as pool:
        return tuple(pool.map(one, paths))


@dataclass(frozen=True)
class FileCheck:
    """The result of checking one file against the manifest.

    Attributes:
        path: File path relative to the model folder.
        status: ``"ok"``, ``"missing"``, ``"size_mismatch"`` or ``"sha256_mismatch"``.
        expected_sha256: The hash in the manifest.
        actual_sha256: The hash on disk (None when missing or skipped after a size mismatch).
    """

    path: str
    status: Literal["ok", "missing", "size_mismatch", "sha256_mismatch"]
    expected_sha256: str
    actual_sha256: str | None = None


@dataclass(frozen=True)
class VerifyReport:
    """The result of :func:`verify_files`."""

    name: str
    path: str
    files: tuple[FileCheck, ...]

    @property
    def ok(self) -> bool:
        """True when every file matches."""
        return all(f.status == "ok" for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (with ``ok``)."""
        return {
            "name": self.name,
            "path": self.path,
            "ok": self.ok,
            "files": [asdict(f) for f in self.files],
        }


def verify_files(manifest: Manifest, model_dir: Path) -> VerifyReport:
    """Check each file of ``model_dir`` against its size and sha256 in ``manifest``."""
    model_dir = Path(model_dir)

    def check(entry: FileEntry) -> FileCheck:
        full = model_dir / entry.path
        if not full.is_file():
            return FileCheck(entry.path, "missing", entry.sha256)
        if full.stat().st_size != entry.size:
            return FileCheck(entry.path, "size_mismatch", entry.sha256)
        actual = sha256_file(full)
        if actual != entry.sha256:
            return FileCheck(entry.path, "sha256_mismatch", entry.sha256, actual)
        return FileCheck(entry.path, "ok", entry.sha256, actual)

    with ThreadPoolExecutor(max_workers=4) as pool:
        checks = tuple(pool.map(check, manifest.files))
    return VerifyReport(name=manifest.name, path=str(model_dir), files=checks)
