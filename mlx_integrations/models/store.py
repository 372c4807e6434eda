"""The model store: ``$MLXI_HOME`` (default ``~/.cache/mlxi``), its models and aliases.

Layout::

    $MLXI_HOME/
      models/<namespace>--<name>/     one folder per model, loadable by mlx_lm.load
        mlxi-manifest.json            written last; no manifest, no model
        config.json, model.safetensors, ...  (pulled files link into the HF cache)
        warm/<prefix>.safetensors     stored prefix KV caches
      models/.tmp-<folder>-<pid>-<x>/ a model being built (pull, quantize, import)
      aliases.json                    alias -> store name
      in-use/<folder>.<pid>.<x>.lock  one per process holding a model (flock'ed while held)
      .lock                           serializes changes to names

A model is built in a temporary folder next to its target and renamed into place once
complete, so an interrupted pull, quantize or import never looks like a model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mlx_integrations.models.errors import (
    InvalidNameError,
    ModelExistsError,
    ModelInUseError,
    ModelNotFoundError,
    StoreError,
    StoreIOError,
)
from mlx_integrations.models.manifest import MANIFEST_FILE, Manifest, VerifyReport, verify_files
from mlx_integrations.models.names import folder_name, validate_name

logger = logging.getLogger(__name__)
# Store locks this thread holds (folder -> depth), so lock() can be nested.
_HELD_LOCKS = threading.local()

DEFAULT_HOME = "~/.cache/mlxi"
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
_IN_USE_DIR = "in-use"


def store_home() -> Path:
    """The store folder: ``$MLXI_HOME`` or ``~/.cache/mlxi``."""
    return Path(os.environ.get("MLXI_HOME") or DEFAULT_HOME).expanduser()


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


@dataclass(frozen=True)
class StoredModel:
    """A model of the store.

    Attributes:
        name: Its store name.
        path: Its folder (what ``mlx_lm.load`` opens).
        manifest: Its manifest.
        aliases: Other names that point to it.
    """

    name: str
    path: Path
    manifest: Manifest
    aliases: tuple[str, ...] = ()

    def summary(self) -> dict[str, Any]:
        """A JSON-ready line for ``mlxi list``."""
        m = self.manifest
        return {
            "name": self.name,
            "id": m.digest[:12],
            "size": m.size_bytes,
            "modified": m.created_at,
            "source": m.source.kind,
            "repo_id": m.source.repo_id,
            "commit": m.source.commit,
            "quantization": None
            if m.quantization is None
            else {
                "bits": m.quantization.bits,
                "group_size": m.quantization.group_size,
                "mode": m.quantization.mode,
                "recipe": m.quantization.recipe,
            },
            "aliases": list(self.aliases),
            "path": str(self.path),
        }


@dataclass(frozen=True)
class RemoveResult:
    """What :meth:`ModelStore.remove` removed."""

    name: str
    kind: Literal["model", "alias"]
    path: str | None
    freed_bytes: int
    aliases_removed: tuple[str, ...] = ()
    dry_run: bool = False
    in_use_by: tuple[int, ...] = ()
    hf_cache_bytes: int = 0
    hf_cache_freed: int = 0
    hf_cache_note: str = ""


@dataclass(frozen=True)
class _HubLinks:
    """The Hugging Face cache files a pulled model links to."""

    cache_dir: Path
    repo_id: str
    commit: str
    bytes: int


class ModelLease:
    """This process's claim on a stored model; ``mlxi rm`` refuses to remove it meanwhile.

    The claim is an exclusive ``flock`` on a file of its own under ``in-use/``; the
    system drops it when the process ends, however it ends, so a crash leaves no claim.
    Release it with :meth:`release` (engines do when they stop) or by ``with``.
    """

    def __init__(self, path: Path, fh: Any) -> None:
        self.path = path
        self._fh = fh
        self._pid = os.getpid()

    @property
    def held(self) -> bool:
        """True until released."""
        return not self._fh.closed

    def release(self) -> None:
        """Give the claim up. Idempotent.

        In a forked child the file is only closed: the claim is the parent's.
        """
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


@dataclass(frozen=True)
class PruneItem:
    """One thing :meth:`ModelStore.prune` removes (or would remove)."""

    kind: Literal[
        "incomplete_build",
        "trash",
        "dangling_alias",
        "orphan_folder",
        "broken_model",
        "incomplete_download",
        "stale_lease",
    ]
    path: str
    bytes: int
    detail: str = ""


@dataclass(frozen=True)
class PruneReport:
    """The result of :meth:`ModelStore.prune`."""

    items: tuple[PruneItem, ...]
    dry_run: bool

    @property
    def freed_bytes(self) -> int:
        """Bytes freed (or that would be freed)."""
        return sum(i.bytes for i in self.items)


class ModelBuild:
    """A model folder under construction; see :meth:`ModelStore.building`."""

    def __init__(self, store: ModelStore, name: str, path: Path, overwrite: bool) -> None:
        self.store = store
        self.name = name
        self.path = path
        self.overwrite = overwrite
        self.committed: StoredModel | None = None

    def commit(self, manifest: Manifest) -> StoredModel:
        """Write the manifest, then move the folder into place in one rename."""
        atomic_write_text(self.path / MANIFEST_FILE, manifest.to_json())
        target = self.store.model_dir(self.name)
        with self.store.lock():
            if self.name in self.store.aliases():
                raise ModelExistsError(
                    f"{self.name!r} is an alias; a model cannot take its name.",
                    hint=f"Remove the alias first: mlxi rm {self.name}",
                )
            trash = None
            if target.exists():
                if not self.overwrite:
                    raise ModelExistsError(
                        f"Model {self.name!r} is already in the store.",
                        hint="Pass --force (overwrite=True) to replace it.",
                    )
                users = self.store._holders(target.name, clean=True)
                if users:
                    raise ModelInUseError(
                        f"Model {self.name!r} is in use by process "
                        f"{', '.join(map(str, users))}; it was not replaced.",
                        hint=f"Stop it first, or remove it anyway (mlxi rm {self.name} --force) "
                        "and run the command again.",
                        pids=users,
                    )
                trash = (
                    self.store.models_dir / f"{_TRASH_PREFIX}{target.name}-{uuid.uuid4().hex[:8]}"
                )
                os.rename(target, trash)
            os.rename(self.path, target)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
        self.committed = self.store.get(self.name)
        return self.committed


class ModelStore:
    """The folder where ``mlxi`` keeps models, manifests and aliases.

    Example:
        >>> store = ModelStore("/tmp/mlxi-doc")
        >>> [m.name for m in store.list()]
        []
    """

    def __init__(self, home: str | Path | None = None) -> None:
        """Open (lazily create) a store.

        Args:
            home: The store folder; default ``$MLXI_HOME`` or ``~/.cache/mlxi``.
        """
        self.home = Path(home).expanduser() if home is not None else store_home()
        self.models_dir = self.home / "models"
        self.aliases_file = self.home / "aliases.json"

    def __repr__(self) -> str:
        return f"ModelStore({str(self.home)!r})"

    def ensure(self) -> None:
        """Create the store folders if needed."""
        try:
            self.models_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise io_error(exc, f"create the store folder {self.home}") from exc

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the store's lock (an flock across processes) while changing names.

        Re-entrant within a thread: a nested ``lock()`` of the same store folder
        does not wait for itself.
        """
        key = str(self.home.resolve())
        held = _HELD_LOCKS.__dict__.setdefault("counts", {})
        if held.get(key):
            held[key] += 1
            try:
                yield
            finally:
                held[key] -= 1
            return
        self.ensure()
        with open(self.home / ".lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            held[key] = 1
            try:
                yield
            finally:
                held[key] = 0
                fcntl.flock(fh, fcntl.LOCK_UN)

    # Models in use

    def lease(self, name: str) -> ModelLease:
        """Claim a stored model for this process until the lease is released.

        Example:
            >>> with store.lease("smollm2"):  # doctest: +SKIP
            ...     store.remove("smollm2")  # raises ModelInUseError
        """
        model = self.get(name)
        return self._lease_folder(model.path.name)

    def users(self, name: str) -> tuple[int, ...]:
        """Process ids holding a lease on a stored model (this one included).

        A store this process cannot write to (read-only disk, another user's) is read
        without its lock, and stale lease files stay.
        """
        model = self.get(name)
        try:
            with self.lock():
                return self._holders(model.path.name)
        except OSError:
            return self._holders(model.path.name, clean=False)

    def in_use(self) -> list[tuple[StoredModel, tuple[int, ...]]]:
        """The stored models that some process has loaded, with those processes' ids."""
        leased = {p.name.rsplit(".", 3)[0] for p in self._lease_files()}
        out = []
        for model in self.list():
            if model.path.name in leased:  # only these can have users
                users = self._holders(model.path.name, clean=False)
                if users:
                    out.append((model, users))
        return out

    def _lease_folder(self, folder: str) -> ModelLease:
        """Claim a model folder; raises OSError where the store cannot be written."""
        with self.lock():
            identity = _model_identity(self.models_dir / folder)
            if identity is None:
                raise FileNotFoundError(f"{self.models_dir / folder} is no longer in the store")
            leases = self.home / _IN_USE_DIR
            leases.mkdir(exist_ok=True)
            path = leases / f"{folder}.{os.getpid()}.{uuid.uuid4().hex[:8]}.lock"
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
            return ModelLease(path, fh)

    def _holders(self, folder: str, *, clean: bool = True) -> tuple[int, ...]:
        """Pids with a live lease on a model folder; stale lease files are removed.

        Call with the store lock held (leases are created under it).
        """
        identity = _model_identity(self.models_dir / folder)
        pids: list[int] = []
        for path in self._lease_files(folder):
            if not _lease_alive(path):
                if clean:
                    path.unlink(missing_ok=True)
                continue
            if _lease_identity(path) not in (None, identity):
                continue  # held on an earlier model of that name, removed with --force
            pids.append(int(path.name.rsplit(".", 3)[1]))
        return tuple(sorted(set(pids)))

    def _lease_files(self, folder: str | None = None) -> list[Path]:
        leases = self.home / _IN_USE_DIR
        if not leases.is_dir():
            return []
        out = []
        for path in leases.glob("*.lock"):
            parts = path.name.rsplit(".", 3)
            if len(parts) == 4 and parts[1].isdigit() and folder in (None, parts[0]):
                out.append(path)
        return sorted(out)

    def model_dir(self, name: str) -> Path:
        """The folder a store name lives in (whether or not it exists)."""
        return self.models_dir / folder_name(name)

    # Aliases

    def aliases(self) -> dict[str, str]:
        """All aliases, alias -> store name."""
        try:
            data = json.loads(self.aliases_file.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise StoreError(
                f"The alias file {self.aliases_file} is unreadable: {exc}.",
                hint="Fix or delete that file; models are not affected.",
            ) from exc
        return {str(k): str(v) for k, v in data.items()}

    def _write_aliases(self, aliases: dict[str, str]) -> None:
        atomic_write_text(self.aliases_file, json.dumps(dict(sorted(aliases.items())), indent=2))

    def tag(self, source: str, alias: str) -> StoredModel:
        """Give a stored model another name.

        Args:
            source: A store name or alias.
            alias: The new name.

        Returns:
            The model the alias points to.
        """
        validate_name(alias, what="alias")
        model = self.get(source)
        with self.lock():
            if self.model_dir(alias).joinpath(MANIFEST_FILE).exists():
                raise ModelExistsError(
                    f"{alias!r} is already the name of a model.",
                    hint="Choose another alias, or remove that model first.",
                )
            aliases = self.aliases()
            aliases[alias] = model.name
            try:
                self._write_aliases(aliases)
            except OSError as exc:
                raise io_error(exc, "write the alias file") from exc
        return self.get(model.name)

    # Lookup

    def canonical_name(self, name: str) -> str:
        """Follow an alias to its store name (a store name maps to itself)."""
        validate_name(name)
        return self.aliases().get(name, name)

    def get(self, name: str) -> StoredModel:
        """The stored model called ``name`` (a store name or an alias).

        Raises:
            ModelNotFoundError: When nothing in the store has that name.
        """
        canonical = self.canonical_name(name)
        path = self.model_dir(canonical)
        try:
            manifest = Manifest.read(path)
        except FileNotFoundError:
            raise ModelNotFoundError(
                f"Model {name!r} is not in the store ({self.home}).",
                hint=f"Run: mlxi pull {name}" if "/" in name else "See what is there: mlxi list",
            ) from None
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(
                f"The manifest of {name!r} is damaged: {exc}.",
                hint=f"Pull or import the model again, or remove it: mlxi rm {name}",
            ) from exc
        aliases = tuple(sorted(a for a, t in self.aliases().items() if t == canonical))
        return StoredModel(name=canonical, path=path, manifest=manifest, aliases=aliases)

    def contains(self, name: str) -> bool:
        """True when ``name`` is a store name or alias of a stored model."""
        try:
            self.get(name)
        except (ModelNotFoundError, InvalidNameError):
            return False
        return True

    def list(self, prefix: str | None = None) -> list[StoredModel]:
        """All stored models, sorted by name; ``prefix`` keeps names that start with it."""
        if not self.models_dir.is_dir():
            return []
        aliases = self.aliases()
        out = []
        for folder in sorted(self.models_dir.iterdir()):
            if folder.name.startswith(".") or not (folder / MANIFEST_FILE).is_file():
                continue
            try:
                manifest = Manifest.read(folder)
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if prefix and not manifest.name.startswith(prefix):
                continue
            names = tuple(sorted(a for a, t in aliases.items() if t == manifest.name))
            out.append(StoredModel(manifest.name, folder, manifest, names))
        return sorted(out, key=lambda m: m.name)

    # Changes

    @contextlib.contextmanager
    def building(self, name: str, *, overwrite: bool = False) -> Iterator[ModelBuild]:
        """Build a model in a temporary folder beside its target.

        Fill ``build.path`` and call ``build.commit(manifest)``; on an exception or
        without a commit, the temporary folder is removed and the store is unchanged.

        Args:
            name: The store name the model will have.
            overwrite: Replace a model of that name on commit.
        """
        validate_name(name)
        if not overwrite and self.model_dir(name).exists():
            raise ModelExistsError(
                f"Model {name!r} is already in the store.",
                hint="Pass --force (overwrite=True) to replace it, or choose another --name.",
            )
        self.ensure()
        tmp = self.models_dir / (
            f"{_TMP_PREFIX}{folder_name(name)}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        )
        try:
            tmp.mkdir()
        except OSError as exc:
            raise io_error(exc, f"create a build folder in {self.models_dir}") from exc
        build = ModelBuild(self, name, tmp, overwrite)
        try:
            yield build
        except OSError as exc:
            if isinstance(exc, StoreError) or exc.errno is None:
                raise
            raise io_error(exc, f"build model {name!r}") from exc
        finally:
            if build.committed is None:
                shutil.rmtree(tmp, ignore_errors=True)

    def verify(self, name: str) -> VerifyReport:
        """Check every file of a stored model against the sha256 in its manifest."""
        model = self.get(name)
        return verify_files(model.manifest, model.path)

    def remove(
        self,
        name: str,
        *,
        dry_run: bool = False,
        force: bool = False,
        purge_hf_cache: bool = False,
    ) -> RemoveResult:
        """Remove a model (and its aliases), or only an alias when ``name`` is one.

        A model that a process holds (an engine, ``mlxi run``; see :meth:`lease`) is
        kept unless ``force``: a loaded copy keeps working, but it could not load again.
        The files a pulled model links in the Hugging Face cache stay there (other tools
        share that cache; ``hf_cache_bytes`` says how much) unless ``purge_hf_cache``,
        which deletes that revision from the cache when no other stored model uses it.

        Raises:
            ModelInUseError: The model is held and ``force`` is False.
        """
        validate_name(name)
        with self.lock():
            aliases = self.aliases()
            if name in aliases:
                if not dry_run:
                    del aliases[name]
                    self._write_aliases(aliases)
                return RemoveResult(name, "alias", None, 0, dry_run=dry_run)
            model = self.get(name)
            freed = disk_usage(model.path)
            users = self._holders(model.path.name, clean=not dry_run)
            if users and not force and not dry_run:
                raise ModelInUseError(
                    f"Model {name!r} is in use by process {', '.join(map(str, users))}.",
                    hint=f"Stop it first, or remove the files anyway: mlxi rm {name} --force "
                    "(a loaded copy keeps working until it stops).",
                    pids=users,
                )
            links = _hub_links(model)
            sharing = (
                [
                    m.name
                    for m in self.list()
                    if m.name != model.name
                    and (m.manifest.source.repo_id, m.manifest.source.commit)
                    == (links.repo_id, links.commit)
                ]
                if links is not None
                else []
            )
            note = ""
            if links is not None and purge_hf_cache and sharing:
                note = f"kept in the Hugging Face cache: {', '.join(sharing)} uses the same files"
            result = RemoveResult(
                name,
                "model",
                str(model.path),
                freed,
                model.aliases,
                dry_run,
                users,
                hf_cache_bytes=links.bytes if links else 0,
                hf_cache_note=note,
            )
            if dry_run:
                if links is not None and purge_hf_cache and not sharing:
                    return dataclasses.replace(result, hf_cache_freed=links.bytes)
                return result
            trash = self.models_dir / f"{_TRASH_PREFIX}{model.path.name}-{uuid.uuid4().hex[:8]}"
            try:
                os.rename(model.path, trash)
                if model.aliases:
                    self._write_aliases({a: t for a, t in aliases.items() if t != model.name})
            except OSError as exc:
                raise io_error(exc, f"remove {name!r}") from exc
        shutil.rmtree(trash, ignore_errors=True)
        if links is not None and purge_hf_cache and not sharing:
            result = dataclasses.replace(result, hf_cache_freed=_purge_revision(links))
        return result

    def prune(
        self,
        *,
        dry_run: bool = False,
        hf_cache_dir: str | Path | None = None,
        incomplete_age_s: float = 3600.0,
    ) -> PruneReport:
        """Remove what no model needs: unfinished builds, trash, dangling aliases,
        folders without a manifest, models whose files are all gone, and partial Hub
        downloads older than ``incomplete_age_s``.

        Args:
            dry_run: Report without removing.
            hf_cache_dir: The Hugging Face cache to look for ``*.incomplete`` files in
                (default: the one huggingface_hub uses). Pass ``""`` to skip it.
            incomplete_age_s: Partial downloads younger than this may be in progress.
        """
        items: list[PruneItem] = []
        with self.lock():
            folders = sorted(self.models_dir.iterdir()) if self.models_dir.is_dir() else []
            for folder in folders:
                if folder.name.startswith(_TMP_PREFIX):
                    if _build_owner_alive(folder.name):
                        continue
                    items.append(PruneItem("incomplete_build", str(folder), disk_usage(folder)))
                elif folder.name.startswith(_TRASH_PREFIX):
                    items.append(PruneItem("trash", str(folder), disk_usage(folder)))
                elif folder.is_dir() and not (folder / MANIFEST_FILE).is_file():
                    items.append(PruneItem("orphan_folder", str(folder), disk_usage(folder)))
                elif folder.is_dir():
                    try:
                        manifest = Manifest.read(folder)
                    except (OSError, ValueError, KeyError, TypeError):
                        continue
                    if manifest.files and not any(
                        (folder / f.path).exists() for f in manifest.files
                    ):
                        items.append(
                            PruneItem(
                                "broken_model",
                                str(folder),
                                disk_usage(folder),
                                f"{manifest.name}: none of its files exist any more",
                            )
                        )
            aliases = self.aliases()
            broken = {i.path for i in items if i.kind == "broken_model"}
            kept = {}
            for alias, target in aliases.items():
                target_dir = self.models_dir / folder_name(target)
                if not (target_dir / MANIFEST_FILE).is_file() or str(target_dir) in broken:
                    items.append(PruneItem("dangling_alias", alias, 0, f"-> {target}"))
                else:
                    kept[alias] = target
            for lease in self._lease_files():
                if not _lease_alive(lease):
                    items.append(
                        PruneItem("stale_lease", str(lease), 0, "left by a process that ended")
                    )
            if hf_cache_dir != "":
                cache = Path(hf_cache_dir) if hf_cache_dir else _default_hf_cache()
                now = time.time()
                for part in sorted(cache.glob("models--*/blobs/*.incomplete")):
                    with contextlib.suppress(OSError):
                        st = part.stat()
                        if now - st.st_mtime >= incomplete_age_s:
                            items.append(PruneItem("incomplete_download", str(part), st.st_size))
            if not dry_run:
                for item in items:
                    if item.kind == "dangling_alias":
                        continue
                    path = Path(item.path)
                    if path.is_dir():
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        path.unlink(missing_ok=True)
                if len(kept) != len(aliases):
                    self._write_aliases(kept)
        return PruneReport(tuple(items), dry_run)


def _hub_links(model: StoredModel) -> _HubLinks | None:
    """Where a pulled model's files live in the Hugging Face cache, and their bytes."""
    src = model.manifest.source
    if src.kind != "hub" or not src.repo_id or not src.commit:
        return None
    cache_dir: Path | None = None
    blobs: set[Path] = set()
    for entry in model.manifest.files:
        link = model.path / entry.path
        if not link.is_symlink():
            continue
        target = Path(os.path.join(link.parent, os.readlink(link)))
        for parent in target.parents:
            if parent.name.startswith("models--"):
                cache_dir = parent.parent
                break
        blobs.add(Path(os.path.realpath(link)))
    if cache_dir is None:
        return None
    size = 0
    for blob in blobs:
        with contextlib.suppress(OSError):
            size += blob.stat().st_size
    return _HubLinks(cache_dir, src.repo_id, src.commit, size)


def _purge_revision(links: _HubLinks) -> int:
    """Delete one revision of a repo from the Hugging Face cache; returns bytes freed.

    huggingface_hub's own cache tools do it, so blobs that another revision still
    uses are kept.
    """
    from huggingface_hub import scan_cache_dir

    try:
        info = scan_cache_dir(links.cache_dir)
    except Exception:  # no cache any more, or not one huggingface_hub recognises
        return 0
    for repo in info.repos:
        if repo.repo_type != "model" or repo.repo_id != links.repo_id:
            continue
        if any(r.commit_hash == links.commit for r in repo.revisions):
            strategy = info.delete_revisions(links.commit)
            freed = strategy.expected_freed_size
            strategy.execute()
            return freed
    return 0


def _lease_alive(path: Path) -> bool:
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
    except BlockingIOError:
        return True
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _model_identity(model_dir: Path) -> str | None:
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


def _build_owner_alive(folder: str) -> bool:
    """True when the process that named a ``.tmp-...-<pid>-<x>`` folder still runs."""
    try:
        pid = int(folder.rsplit("-", 2)[-2])
    except (ValueError, IndexError):
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _default_hf_cache() -> Path:
    """The Hugging Face Hub cache folder, read from the environment at call time."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def default_store() -> ModelStore:
    """The store at ``$MLXI_HOME`` (read each call, so tests and scripts can change it)."""
    return ModelStore()


def list_models(prefix: str | None = None, *, store: ModelStore | None = None) -> list[StoredModel]:
    """The models of the store (see :meth:`ModelStore.list`)."""
    return (store or default_store()).list(prefix)


def get_model(name: str, *, store: ModelStore | None = None) -> StoredModel:
    """One stored model by name or alias (see :meth:`ModelStore.get`)."""
    return (store or default_store()).get(name)


def remove_model(
    name: str,
    *,
    dry_run: bool = False,
    force: bool = False,
    purge_hf_cache: bool = False,
    store: ModelStore | None = None,
) -> RemoveResult:
    """Remove a model or an alias (see :meth:`ModelStore.remove`)."""
    return (store or default_store()).remove(
        name, dry_run=dry_run, force=force, purge_hf_cache=purge_hf_cache
    )


def lease_model_folder(path: Path) -> ModelLease | None:
    """Claim the model at ``path`` when it is a store model folder; None otherwise.

    Engines call this when they load, so ``mlxi rm`` in any process sees the model in
    use; folders outside a store (or a store that cannot be written) are not claimed.
    """
    path = Path(path)
    models_dir = path.parent
    # A store folder: models/<folder>/manifest beside the store's own lock file.
    if (
        models_dir.name != "models"
        or not (path / MANIFEST_FILE).is_file()
        or not (models_dir.parent / ".lock").is_file()
    ):
        return None
    store = ModelStore(models_dir.parent)
    try:
        return store._lease_folder(path.name)
    except OSError as exc:  # read-only store, another user's, no flock on a network disk
        logger.warning("Cannot mark %s as in use (%s); mlxi rm will not see it loaded.", path, exc)
        return None


def tag_model(source: str, alias: str, *, store: ModelStore | None = None) -> StoredModel:
    """Give a stored model another name (see :meth:`ModelStore.tag`)."""
    return (store or default_store()).tag(source, alias)


def verify_model(name: str, *, store: ModelStore | None = None) -> VerifyReport:
    """Check a model's files against its manifest (see :meth:`ModelStore.verify`)."""
    return (store or default_store()).verify(name)


def prune(
    *,
    dry_run: bool = False,
    store: ModelStore | None = None,
    hf_cache_dir: str | Path | None = None,
) -> PruneReport:
    """Remove unfinished builds and orphaned data (see :meth:`ModelStore.prune`)."""
    return (store or default_store()).prune(dry_run=dry_run, hf_cache_dir=hf_cache_dir)


__all__ = [
    "DEFAULT_HOME",
    "ModelBuild",
    "ModelStore",
    "PruneItem",
    "PruneReport",
    "RemoveResult",
    "StoredModel",
    "atomic_write_text",
    "default_store",
    "disk_usage",
    "get_model",
    "list_models",
    "prune",
    "remove_model",
    "store_home",
    "tag_model",
    "verify_model",
]
