"""Removing from the store: ``mlxi rm`` (with ``--purge`` of the Hugging Face cache)
and ``mlxi prune`` (unfinished builds, trash, orphans, stale leases, partial downloads).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mlx_integrations.models.errors import ManifestError, ModelInUseError, ModelNotFoundError
from mlx_integrations.models.folders import (
    TMP_PREFIX,
    TRASH_PREFIX,
    discard,
    disk_usage,
    io_error,
)
from mlx_integrations.models.leases import holders, lease_alive, lease_files
from mlx_integrations.models.manifest import MANIFEST_FILE, Manifest
from mlx_integrations.models.names import folder_name, is_repo_id, validate_name
from mlx_integrations.models.store import ModelStore, StoredModel, default_store


@dataclass(frozen=True)
class RemoveResult:
    """What :meth:`ModelStore.remove` removed."""

    name: str
    kind: Literal["model", "alias", "hf_cache"]
    """``hf_cache``: no stored model, only a repo's revisions in the Hugging Face cache."""
    path: str | None
    freed_bytes: int
    aliases_removed: tuple[str, ...] = ()
    dry_run: bool = False
    in_use_by: tuple[int, ...] = ()
    hf_cache_bytes: int = 0
    hf_cache_freed: int = 0
    hf_cache_note: str = ""


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


@dataclass(frozen=True)
class _HubLinks:
    """The Hugging Face cache files a pulled model links to."""

    cache_dir: Path
    revision_dir: Path
    repo_id: str
    commit: str
    bytes: int


def remove_model(
    name: str,
    *,
    dry_run: bool = False,
    force: bool = False,
    purge_hf_cache: bool = False,
    store: ModelStore | None = None,
) -> RemoveResult:
    """Remove a model (and its aliases), or only an alias when ``name`` is one.

    A model that a process holds (an engine, ``mlxi run``; see :meth:`ModelStore.lease`) is
    kept unless ``force``: a loaded copy keeps working, but it could not load again.
    The files a pulled model links in the Hugging Face cache stay there (other tools
    share that cache; ``hf_cache_bytes`` says how much) unless ``purge_hf_cache``,
    which deletes that revision from the cache when no other stored model uses it.

    Raises:
        ModelInUseError: The model is held and ``force`` is False.
    """
    store = store or default_store()
    validate_name(name)
    with store.lock():
        aliases = store.aliases()
        if name in aliases:
            if not dry_run:
                del aliases[name]
                store.write_aliases(aliases)
            return RemoveResult(name, "alias", None, 0, dry_run=dry_run)
        try:
            model = store.get(name)
        except ModelNotFoundError as exc:
            return _remove_hf_leftovers(store, name, exc, dry_run, purge_hf_cache)
        except ManifestError:
            model = _damaged(store, name, aliases)  # what `show` and `verify` hint at
        freed = disk_usage(model.path)
        users = holders(store.home, model.path, clean=not dry_run)
        if users and not force and not dry_run:
            raise ModelInUseError(
                f"Model {name!r} is in use by process {', '.join(map(str, users))}.",
                hint=f"Stop it first, or remove the files anyway: mlxi rm {name} --force "
                "(a loaded copy keeps working until it stops).",
                pids=users,
            )
        links = _hub_links(model)
        sharing = _sharing(store, model, links) if links is not None else []
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
        trash = store.models_dir / f"{TRASH_PREFIX}{model.path.name}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(model.path, trash)
            if model.aliases:
                store.write_aliases({a: t for a, t in aliases.items() if t != model.name})
        except OSError as exc:
            raise io_error(exc, f"remove {name!r}") from exc
        # Under the lock: a pull of the same files commits before or after, never between.
        if links is not None and purge_hf_cache and not sharing:
            result = dataclasses.replace(result, hf_cache_freed=_purge_revision(links))
    discard(trash)
    return result


def _remove_hf_leftovers(
    store: ModelStore, name: str, exc: ModelNotFoundError, dry_run: bool, purge: bool
) -> RemoveResult:
    """``rm REPO --purge`` of a repo no longer stored: the revisions an earlier ``rm``
    (without ``--purge``) left in the Hugging Face cache; else ``exc``, with a hint."""
    leftovers = _unused_revisions(store, name) if is_repo_id(name) else []
    if not leftovers or not purge:
        hint = "See what is there: mlxi list"
        if leftovers:
            hint = f"Its files are still in the Hugging Face cache: mlxi rm {name} --purge"
        raise ModelNotFoundError(str(exc), hint=hint) from None
    cached = sum(links.bytes for links in leftovers)
    purged = cached if dry_run else sum(_purge_revision(links) for links in leftovers)
    return RemoveResult(
        name, "hf_cache", None, 0, dry_run=dry_run, hf_cache_bytes=cached, hf_cache_freed=purged
    )


def _damaged(store: ModelStore, name: str, aliases: dict[str, str]) -> StoredModel:
    """A model folder whose manifest cannot be read, as a model without files to remove."""
    from mlx_integrations.models.manifest import ModelSource
    from mlx_integrations.models.store import StoredModel

    canonical = aliases.get(name, name)
    manifest = Manifest(name=canonical, source=ModelSource(kind="local"))
    names = tuple(sorted(a for a, t in aliases.items() if t == canonical))
    return StoredModel(canonical, store.model_dir(canonical), manifest, names)


def _sharing(store: ModelStore, model: StoredModel, links: _HubLinks) -> list[str]:
    """What else uses a pulled model's revision in the Hugging Face cache: other stored
    models, and models being built (a pull in progress) that link to it."""
    users = [
        m.name
        for m in store.list()
        if m.name != model.name
        and (m.manifest.source.repo_id, m.manifest.source.commit) == (links.repo_id, links.commit)
    ]
    builds = store.models_dir.glob(f"{TMP_PREFIX}*") if store.models_dir.is_dir() else []
    for build in builds:
        if _build_owner_alive(build.name) and _links_into(build, links.revision_dir):
            users.append(f"a model being built ({build.name})")
    return users


def _links_into(folder: Path, target: Path) -> bool:
    """True when a symlink under ``folder`` points into the folder ``target``."""
    prefix = str(target) + os.sep
    for root, dirs, files in os.walk(folder):
        for name in files + dirs:
            link = os.path.join(root, name)
            if os.path.islink(link) and os.path.join(root, os.readlink(link)).startswith(prefix):
                return True
    return False


def prune(
    *,
    dry_run: bool = False,
    store: ModelStore | None = None,
    hf_cache_dir: str | Path | None = None,
    incomplete_age_s: float = 3600.0,
) -> PruneReport:
    """Remove what no model needs: unfinished builds, trash, dangling aliases,
    folders without a manifest, models whose files are all gone, stale leases, and
    partial Hub downloads older than ``incomplete_age_s``.

    Args:
        dry_run: Report without removing.
        store: The store (default: ``$MLXI_HOME``).
        hf_cache_dir: The Hugging Face cache to look for ``*.incomplete`` files in
            (default: the one huggingface_hub uses). Pass ``""`` to skip it.
        incomplete_age_s: Partial downloads younger than this may be in progress.
    """
    store = store or default_store()
    items: list[PruneItem] = []
    with store.lock():
        folders = sorted(store.models_dir.iterdir()) if store.models_dir.is_dir() else []
        for folder in folders:
            item = _leftover(folder)
            if item is not None:
                items.append(item)
        aliases = store.aliases()
        broken = {i.path for i in items if i.kind == "broken_model"}
        kept = {}
        for alias, target in aliases.items():
            target_dir = store.models_dir / folder_name(target)
            if not (target_dir / MANIFEST_FILE).is_file() or str(target_dir) in broken:
                items.append(PruneItem("dangling_alias", alias, 0, f"-> {target}"))
            else:
                kept[alias] = target
        for lease in lease_files(store.home):
            if not lease_alive(lease):
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
                if item.kind != "dangling_alias":
                    discard(Path(item.path))
            if len(kept) != len(aliases):
                store.write_aliases(kept)
    return PruneReport(tuple(items), dry_run)


def _leftover(folder: Path) -> PruneItem | None:
    """What prune removes of one entry of ``models/``; None for a model (or a live build)."""
    if folder.name.startswith(TMP_PREFIX):
        if _build_owner_alive(folder.name):
            return None
        return PruneItem("incomplete_build", str(folder), disk_usage(folder))
    if folder.name.startswith(TRASH_PREFIX):
        return PruneItem("trash", str(folder), disk_usage(folder))
    if not folder.is_dir():
        return None
    if not (folder / MANIFEST_FILE).is_file():
        return PruneItem("orphan_folder", str(folder), disk_usage(folder))
    try:
        manifest = Manifest.read(folder)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if manifest.files and not any((folder / f.path).exists() for f in manifest.files):
        detail = f"{manifest.name}: none of its files exist any more"
        return PruneItem("broken_model", str(folder), disk_usage(folder), detail)
    return None


def _hub_links(model: StoredModel) -> _HubLinks | None:
    """Where a pulled model's files live in the Hugging Face cache, and their bytes."""
    src = model.manifest.source
    if src.kind != "hub" or not src.repo_id or not src.commit:
        return None
    repo_dir: Path | None = None
    blobs: set[Path] = set()
    for entry in model.manifest.files:
        link = model.path / entry.path
        if not link.is_symlink():
            continue
        target = Path(os.path.join(link.parent, os.readlink(link)))
        for parent in target.parents:
            if parent.name.startswith("models--"):
                repo_dir = parent
                break
        blobs.add(Path(os.path.realpath(link)))
    if repo_dir is None:
        return None
    size = 0
    for blob in blobs:
        with contextlib.suppress(OSError):
            size += blob.stat().st_size
    revision_dir = repo_dir / "snapshots" / src.commit
    return _HubLinks(repo_dir.parent, revision_dir, src.repo_id, src.commit, size)


def _unused_revisions(store: ModelStore, repo_id: str) -> list[_HubLinks]:
    """The revisions of ``repo_id`` in the Hugging Face cache that no stored model, nor
    a pull in progress, uses."""
    cache = _default_hf_cache()
    snapshots = cache / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    if not snapshots.is_dir():
        return []
    used = {(m.manifest.source.repo_id, m.manifest.source.commit) for m in store.list()}
    builds = list(store.models_dir.glob(f"{TMP_PREFIX}*")) if store.models_dir.is_dir() else []
    out = []
    for revision in sorted(p for p in snapshots.iterdir() if p.is_dir()):
        if (repo_id, revision.name) in used or any(
            _build_owner_alive(b.name) and _links_into(b, revision) for b in builds
        ):
            continue
        blobs = {Path(os.path.realpath(f)) for f in revision.rglob("*") if f.is_file()}
        size = sum(b.stat().st_size for b in blobs if b.is_file())
        out.append(_HubLinks(cache, revision, repo_id, revision.name, size))
    return out


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
