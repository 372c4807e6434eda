"""The model store: ``$MLXI_HOME`` (default ``~/.cache/mlxi``), its models and aliases.

Layout::

    $MLXI_HOME/
      models/<namespace>--<name>/     one folder per model, loadable by mlx_lm.load
        mlxi-manifest.json            written last; no manifest, no model
        config.json, model.safetensors, ...  (pulled files link into the HF cache)
        warm/<prefix>.safetensors     stored prefix KV caches
      models/.tmp-<folder>-<pid>-<x>/ a model being built (pull, quantize, import)
      aliases.json                    alias -> store name
      in-use/<folder>.<pid>.<x>.lock  one per process holding a model (see leases.py)
      .lock                           serializes changes to names

A model is built in a temporary folder next to its target and renamed into place once
complete, so an interrupted pull, quantize or import never looks like a model.
Removing and pruning (over a store) live in cleanup.py, models in use in leases.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlx_integrations.models.errors import (
    InvalidNameError,
    JSONFileError,
    ManifestError,
    ModelExistsError,
    ModelInUseError,
    ModelNotFoundError,
    StoreError,
)
from mlx_integrations.models.folders import (
    TMP_PREFIX,
    atomic_write_text,
    building_folder,
    discard,
    disk_usage,
    io_error,
    read_json,
    rename_into_place,
    write_json,
)
from mlx_integrations.models.leases import (
    ModelLease,
    holders,
    lease_details,
    leased_folders,
    take_lease,
)
from mlx_integrations.models.manifest import MANIFEST_FILE, Manifest, VerifyReport, verify_files
from mlx_integrations.models.names import folder_name, validate_name

logger = logging.getLogger(__name__)
# Store locks this thread holds (folder -> depth), so lock() can be nested.
_HELD_LOCKS = threading.local()

DEFAULT_HOME = "~/.cache/mlxi"


def store_home() -> Path:
    """The store folder: ``$MLXI_HOME`` or ``~/.cache/mlxi``."""
    return Path(os.environ.get("MLXI_HOME") or DEFAULT_HOME).expanduser()


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
            # What quantizing cost, with its verdict ("damaged": expect garbled answers).
            "quality": m.quality.to_dict() if m.quality is not None else None,
        }


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
            if target.exists():
                if not self.overwrite:
                    raise ModelExistsError(
                        f"Model {self.name!r} is already in the store.",
                        hint="Pass overwrite=True to replace it.",
                    )
                users = holders(self.store.home, target)
                if users:
                    raise ModelInUseError(
                        f"Model {self.name!r} is in use by process "
                        f"{', '.join(map(str, users))}; it was not replaced.",
                        hint=f"Stop it first, or remove it anyway (mlxi rm {self.name} --force) "
                        "and run the command again.",
                        pids=users,
                    )
            gone = _dangling_links(self.path)
            if gone:
                raise StoreError(
                    f"Files of {self.name!r} were deleted while it was built "
                    f"({', '.join(gone[:3])}{', ...' if len(gone) > 3 else ''}); "
                    "it was not stored.",
                    hint="Another process removed them (mlxi rm --purge?); run the command again.",
                )
            replaced = rename_into_place(self.path, target, replace=self.overwrite)
        discard(replaced)
        self.committed = self.store.get(self.name)
        return self.committed


class ModelStore:
    """The folder where ``mlxi`` keeps models, manifests and aliases.

    Examples:
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

    # Models in use (leases.py)

    def lease(self, name: str) -> ModelLease:
        """Claim a stored model for this process until the lease is released.

        Examples:
            >>> with store.lease("smollm2"):  # doctest: +SKIP
            ...     remove_model("smollm2", store=store)  # raises ModelInUseError
        """
        return self.lease_folder(self.get(name).path)

    def lease_folder(self, model_dir: Path) -> ModelLease:
        """Claim a model folder of this store; raises OSError where it cannot be written."""
        with self.lock():
            return take_lease(self.home, model_dir)

    def users(self, name: str) -> tuple[int, ...]:
        """Process ids holding a lease on a stored model (this one included).

        A store this process cannot write to (read-only disk, another user's) is read
        without its lock, and stale lease files stay.
        """
        model = self.get(name)
        try:
            with self.lock():
                return holders(self.home, model.path)
        except OSError:
            return holders(self.home, model.path, clean=False)

    def in_use(self) -> list[tuple[StoredModel, tuple[int, ...]]]:
        """The stored models that some process has loaded, with those processes' ids."""
        return [(model, tuple(sorted(procs))) for model, procs in self.loaded()]

    def loaded(self) -> list[tuple[StoredModel, dict[int, dict[str, Any]]]]:
        """The stored models that some process has loaded, with what each process
        reports of it: pid -> memory, last use, keep-alive, expiry
        (:func:`~mlx_integrations.models.leases.lease_details`; empty from processes
        of earlier versions)."""
        leased = leased_folders(self.home)
        out = []
        for model in self.list():
            if model.path.name in leased:  # only these can have users
                procs = lease_details(self.home, model.path)
                if procs:
                    out.append((model, procs))
        return out

    def model_dir(self, name: str) -> Path:
        """The folder a store name lives in (whether or not it exists)."""
        return self.models_dir / folder_name(name)

    # Aliases

    def aliases(self) -> dict[str, str]:
        """All aliases, alias -> store name."""
        try:
            data = read_json(self.aliases_file)
        except FileNotFoundError:
            return {}
        except JSONFileError as exc:
            raise StoreError(
                f"The alias file is unreadable: {exc}",
                hint="Fix or delete that file; models are not affected.",
            ) from exc
        return {str(k): str(v) for k, v in data.items()}

    def write_aliases(self, aliases: dict[str, str]) -> None:
        """Replace the alias file (call with the store lock held)."""
        write_json(self.aliases_file, dict(sorted(aliases.items())))

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
                self.write_aliases(aliases)
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
            what = f"it lacks {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ManifestError(
                f"The manifest of {name!r} is damaged: {what}.",
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

    def damaged(self) -> list[str]:
        """Names of the model folders whose manifest cannot be read (:meth:`list` skips
        them; :meth:`remove` removes them)."""
        if not self.models_dir.is_dir():
            return []
        names = []
        for folder in sorted(self.models_dir.iterdir()):
            if folder.name.startswith(".") or not (folder / MANIFEST_FILE).is_file():
                continue
            try:
                Manifest.read(folder)
            except (OSError, ValueError, KeyError, TypeError):
                names.append(folder.name.replace("--", "/", 1))
        return names

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
                hint="Pass overwrite=True to replace it, or choose another name.",
            )
        self.ensure()
        tmp = self.models_dir / (
            f"{TMP_PREFIX}{folder_name(name)}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        )
        made = False
        try:
            with building_folder(tmp):
                made = True
                yield ModelBuild(self, name, tmp, overwrite)
        except OSError as exc:
            if made and (isinstance(exc, StoreError) or exc.errno is None):
                raise
            action = f"build model {name!r}" if made else f"create a build folder in {tmp.parent}"
            raise io_error(exc, action) from exc

    def verify(self, name: str) -> VerifyReport:
        """Check every file of a stored model against the sha256 in its manifest."""
        model = self.get(name)
        return verify_files(model.manifest, model.path)


def _dangling_links(folder: Path) -> list[str]:
    """Paths under ``folder`` of symlinks whose target no longer exists (sorted)."""
    out = []
    for root, _dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            if os.path.islink(path) and not os.path.exists(path):
                out.append(os.path.relpath(path, folder))
    return sorted(out)


def default_store() -> ModelStore:
    """The store at ``$MLXI_HOME`` (read each call, so tests and scripts can change it)."""
    return ModelStore()


def list_models(prefix: str | None = None, *, store: ModelStore | None = None) -> list[StoredModel]:
    """The models of the store (see :meth:`ModelStore.list`)."""
    return (store or default_store()).list(prefix)


def get_model(name: str, *, store: ModelStore | None = None) -> StoredModel:
    """One stored model by name or alias (see :meth:`ModelStore.get`)."""
    return (store or default_store()).get(name)


def lease_model_folder(path: Path) -> ModelLease | None:
    """Claim the model at ``path`` when it is a store model folder; None otherwise.

    Engines call this when they load, so ``mlxi rm`` in any process sees the model in
    use; folders outside a store (or a store that cannot be written) are not claimed.
    A path through a symlink claims the store folder it leads to.
    """
    path = Path(os.path.realpath(path))
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
        return store.lease_folder(path)
    except OSError as exc:  # read-only store, another user's, no flock on a network disk
        logger.warning("Cannot mark %s as in use (%s); mlxi rm will not see it loaded.", path, exc)
        return None


def tag_model(source: str, alias: str, *, store: ModelStore | None = None) -> StoredModel:
    """Give a stored model another name (see :meth:`ModelStore.tag`)."""
    return (store or default_store()).tag(source, alias)


def verify_model(name: str, *, store: ModelStore | None = None) -> VerifyReport:
    """Check a model's files against its manifest (see :meth:`ModelStore.verify`)."""
    return (store or default_store()).verify(name)


__all__ = [
    "DEFAULT_HOME",
    "ModelBuild",
    "ModelLease",
    "ModelStore",
    "StoredModel",
    "atomic_write_text",
    "default_store",
    "disk_usage",
    "get_model",
    "lease_model_folder",
    "list_models",
    "store_home",
    "tag_model",
    "verify_model",
]
