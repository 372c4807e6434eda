"""Pull models from the Hugging Face Hub into the store.

Files are downloaded by ``huggingface_hub.snapshot_download`` into the Hugging Face cache
(shared with every other tool); the store's model folder links to them and pins the
resolved commit, so pulling a model again makes no request and works offline.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlx_integrations.models.errors import (
    GatedRepoError,
    HubError,
    IntegrityError,
    InvalidNameError,
    ModelExistsError,
    ModelNotFoundError,
    OfflineError,
    RemoteFileMissingError,
    RepoNotFoundError,
    RevisionNotFoundError,
    StoreError,
    StoreIOError,
)
from mlx_integrations.models.folders import read_json_object
from mlx_integrations.models.hub.downloads import (
    Cancellation,
    HubRevision,
    keep_partial,
    resume_partials,
    run_interruptibly,
)
from mlx_integrations.models.hub.hashing import DownloadHasher, HashedFile
from mlx_integrations.models.manifest import (
    Manifest,
    ModelSource,
    QuantizationInfo,
    hash_files,
    model_files,
)
from mlx_integrations.models.names import is_commit_sha, is_repo_id, validate_name
from mlx_integrations.models.progress import ProgressCallback, report, tqdm_bridge
from mlx_integrations.models.store import ModelStore, StoredModel, default_store

# What mlx-lm loads (its DEFAULT_ALLOW_PATTERNS), less "*.py": remote code is opt-in.
MODEL_FILE_PATTERNS: tuple[str, ...] = (
    "*.json",
    "model*.safetensors",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
)
_SHA256 = re.compile(r"[0-9a-f]{64}")
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class PullResult:
    """What :func:`pull` did.

    Attributes:
        model: The stored model.
        downloaded: False when the pinned model was already complete (no request made).
    """

    model: StoredModel
    downloaded: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data for ``mlxi pull --json``."""
        return {**self.model.summary(), "downloaded": self.downloaded}


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set (read at call time, not at import)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE:
        return True
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def hub_endpoint(endpoint: str | None = None) -> str | None:
    """The Hub endpoint: the argument, else ``HF_ENDPOINT`` read now, else the default."""
    return endpoint or os.environ.get("HF_ENDPOINT") or None


def hub_cache_dir(cache_dir: str | Path | None = None) -> str | None:
    """The Hugging Face cache folder: the argument, else ``HF_HUB_CACHE``/``HF_HOME`` now."""
    if cache_dir:
        return str(cache_dir)
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return None


def pull(
    repo_id: str,
    *,
    name: str | None = None,
    revision: str | None = None,
    store: ModelStore | None = None,
    endpoint: str | None = None,
    cache_dir: str | Path | None = None,
    token: str | bool | None = None,
    update: bool = False,
    force: bool = False,
    trust_remote_code: bool = False,
    include: list[str] | None = None,
    max_workers: int = 8,
    progress: ProgressCallback | None = None,
) -> PullResult:
    """Download a model from the Hub into the store (or find it there already).

    Ctrl-C (KeyboardInterrupt in the calling thread) stops the transfers within a network
    read and keeps each partial weight file in the Hugging Face cache; the next pull
    resumes it from there and checks its sha256.

    Args:
        repo_id: ``namespace/name`` on the Hub.
        name: Store name (default: ``repo_id``).
        revision: Branch, tag or commit sha (default: ``main``).
        store: The store (default: ``$MLXI_HOME``).
        endpoint: Hub URL (default: ``HF_ENDPOINT`` or huggingface.co).
        cache_dir: Hugging Face cache (default: huggingface_hub's).
        token: Hub token; never printed or written to the manifest.
        update: Ask the Hub whether the branch moved even when the model is pinned.
        force: Replace a model of the same name that came from elsewhere.
        trust_remote_code: Also fetch the repository's ``*.py`` files.
        include: Extra glob patterns of files to fetch.
        max_workers: Parallel file downloads.
        progress: Receives ``"bytes"`` and ``"files"`` updates.

    Returns:
        The stored model and whether anything was downloaded.

    Examples:
        >>> from mlx_integrations.models import pull  # doctest: +SKIP
        >>> pull("mlx-community/SmolLM2-135M-Instruct-8bit").model.path  # doctest: +SKIP
    """
    if not is_repo_id(repo_id):
        raise InvalidNameError(
            f"{repo_id!r} is not a Hub repo id.",
            hint="A repo id looks like 'namespace/name', e.g. mlx-community/Qwen3-4B-4bit.",
        )
    store = store or default_store()
    name = validate_name(name or repo_id)
    existing = _existing(store, name)
    if existing is not None:
        src = existing.manifest.source
        if src.kind != "hub" or src.repo_id != repo_id:
            if not force:
                raise ModelExistsError(
                    f"Model {name!r} is already in the store, from {src.repo_id or src.path}.",
                    hint=f"Choose another --name, or replace it with: mlxi pull {repo_id} --force",
                )
        elif not update and revision in (None, src.revision, src.commit) and _complete(existing):
            return PullResult(existing, downloaded=False)
        elif not update and revision in (None, src.revision, src.commit):
            # Same pin, files gone from the HF cache: fetch that exact commit again.
            revision = src.commit

    requested = revision or "main"
    patterns = (
        list(MODEL_FILE_PATTERNS) + (["*.py"] if trust_remote_code else []) + list(include or [])
    )
    repo = HubRevision(repo_id, requested, hub_endpoint(endpoint), hub_cache_dir(cache_dir), token)
    # Files are hashed while they download; verifying afterwards reads only what is left.
    with DownloadHasher(_repo_folder(repo_id, repo.cache_dir) / "blobs") as hasher:
        snapshot = _snapshot(
            repo, patterns=patterns, max_workers=max_workers, progress=progress, hasher=hasher
        )
    commit = snapshot.name
    if not is_commit_sha(commit):
        raise HubError(f"The Hub cache returned an unexpected snapshot folder: {snapshot}.")
    files = model_files(snapshot)
    if not any(f.endswith(".safetensors") for f in files) or "config.json" not in files:
        raise RemoteFileMissingError(
            f"{repo_id}@{commit[:12]} has no MLX/safetensors model files "
            f"(found: {', '.join(files) or 'no config, weights or tokenizer files'}).",
            hint="For a GGUF repository, download the .gguf file and run: mlxi import FILE NAME",
        )
    if existing is not None and _unchanged(existing, repo_id, requested, commit, files):
        return PullResult(existing, downloaded=False)  # --update: the branch did not move

    with store.building(name, overwrite=existing is not None) as build:
        for rel in files:
            dst = build.path / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(snapshot / rel, dst)
        total = float(sum((snapshot / f).stat().st_size for f in files))
        done = [0.0]

        def hashed(_path: str, size: int) -> None:
            done[0] += size
            report(progress, "hash", "Verifying sha256", done[0], total, "B")

        known = hasher.entries(snapshot, files, trust=_published_sha256)
        entries = hash_files(build.path, files, on_file=hashed, known=known)
        report(progress, "hash", "Verifying sha256", total, total, "B", done=True)
        _check_lfs_hashes(snapshot, entries)
        config = read_json_object(snapshot / "config.json")
        manifest = Manifest(
            name=name,
            source=ModelSource(
                kind="hub",
                repo_id=repo_id,
                revision=requested,
                commit=commit,
                endpoint=repo.endpoint,
            ),
            files=entries,
            quantization=quantization_of(config),
            dtype=dtype_of(config),
        )
        model = build.commit(manifest)
    return PullResult(model, downloaded=True)


def _cache_root(cache_dir: str | None) -> Path:
    from huggingface_hub import constants

    return Path(cache_dir or constants.HF_HUB_CACHE)


def _repo_folder(repo_id: str, cache_dir: str | None) -> Path:
    """Where huggingface_hub keeps ``repo_id`` (its ``blobs``, ``snapshots``, ``trees``)."""
    from huggingface_hub.file_download import repo_folder_name

    return _cache_root(cache_dir) / repo_folder_name(repo_id=repo_id, repo_type="model")


def _published_sha256(path: Path, got: HashedFile) -> bool:
    """True when a streamed hash equals the sha256 the Hub published for the file.

    An LFS blob is named by its sha256; a file without one, or whose streamed bytes do
    not hash to it, is hashed again from disk.
    """
    blob = os.path.basename(os.path.realpath(path))
    return bool(_SHA256.fullmatch(blob)) and got.sha256 == blob


def _existing(store: ModelStore, name: str) -> StoredModel | None:
    try:
        return store.get(name)
    except ModelNotFoundError:
        return None


def _unchanged(
    model: StoredModel, repo_id: str, revision: str, commit: str, files: list[str]
) -> bool:
    """True when ``model`` already is that revision's pull: same pin, commit and files."""
    src = model.manifest.source
    return (
        (src.kind, src.repo_id, src.revision, src.commit) == ("hub", repo_id, revision, commit)
        and {f.path for f in model.manifest.files} == set(files)
        and _complete(model)
    )


def _complete(model: StoredModel) -> bool:
    """Every file of the manifest is present with its size (a stat, no hashing)."""
    for f in model.manifest.files:
        try:
            if (model.path / f.path).stat().st_size != f.size:
                return False
        except OSError:
            return False
    return True


def _snapshot(
    repo: HubRevision,
    *,
    patterns: list[str],
    max_workers: int,
    progress: ProgressCallback | None,
    hasher: DownloadHasher,
) -> Path:
    """Call ``snapshot_download`` and turn its exceptions into store errors.

    Partial files that an interrupted pull kept are resumed first. On Ctrl-C the files
    in flight are kept and their transfers stopped, then KeyboardInterrupt goes on.
    """
    from huggingface_hub import snapshot_download

    repo_id, revision, token = repo.repo_id, repo.revision, repo.token  # for the messages
    offline = hub_offline()
    storage = _repo_folder(repo_id, repo.cache_dir)
    cancellation = Cancellation(repo_id)

    def download() -> str:
        resumed = 0.0
        if not offline:
            resumed = resume_partials(
                repo,
                storage=storage,
                locks=_cache_root(repo.cache_dir) / ".locks" / storage.name,
                cancellation=cancellation,
                follow=hasher.follow,
                progress=progress,
            )
        return snapshot_download(
            repo_id,
            revision=revision,
            endpoint=repo.endpoint,
            cache_dir=repo.cache_dir,
            token=token,
            allow_patterns=patterns,
            local_files_only=offline,
            max_workers=max_workers,
            tqdm_class=tqdm_bridge(progress, base=resumed),
        )

    def interrupt() -> None:
        # Link the partial files before the stopped transfers delete them.
        for partial in hasher.partial_files():
            keep_partial(partial)
        cancellation.cancel()

    try:
        with warnings.catch_warnings(), cancellation.active():
            # A full disk is reported below as an error with a hint, not as a warning.
            warnings.filterwarnings("ignore", "Not enough free disk space", UserWarning)
            path = run_interruptibly(download, interrupt)
    except Exception as exc:
        error = _hub_error(exc, repo, offline)
        if error is not None:
            raise error from _scrub(exc, token)
        if isinstance(exc, StoreError):
            raise
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _disk_full(repo_id, exc, _cache_root(repo.cache_dir)) from None
        # httpx/httpx2 transport errors after the library's own retries.
        if type(exc).__module__.split(".")[0] in {"httpx", "httpx2", "httpcore", "requests"}:
            raise HubError(
                f"The download of {repo_id} failed: {type(exc).__name__}: {_scrub(exc, token)}.",
                hint="Run the command again; files already downloaded are kept in the cache.",
            ) from None
        raise
    return Path(path)


def _hub_error(exc: Exception, repo: HubRevision, offline: bool) -> StoreError | None:
    """The store error, with one line of advice, for a huggingface_hub exception (or None).

    The first row whose exception class matches wins (GatedRepoError is also a
    RepositoryNotFoundError; most are HfHubHTTPErrors). Messages and hints are formatted
    with ``repo_id``, ``revision``, ``where`` (the Hub URL), ``file`` and ``status``.
    """
    from huggingface_hub import errors as hf

    not_cached = (
        (
            "{repo_id}@{revision} is not in the Hugging Face cache and HF_HUB_OFFLINE is set.",
            "Unset HF_HUB_OFFLINE and run: mlxi pull {repo_id}",
        )
        if offline
        else (
            "Could not reach {where} to download {repo_id}, and it is not cached.",
            "Check the network connection (or HF_ENDPOINT) and run the command again.",
        )
    )
    table: tuple[tuple[Any, type[StoreError], tuple[str, str]], ...] = (
        (
            hf.GatedRepoError,
            GatedRepoError,
            (
                "{repo_id} is a gated repository: its terms must be accepted first.",
                "Accept them on {where}/{repo_id}, then log in (hf auth login) or set HF_TOKEN.",
            ),
        ),
        (
            hf.RepositoryNotFoundError,
            RepoNotFoundError,
            (
                "Repository {repo_id} was not found on {where}.",
                "Check the spelling; a private repository needs a token (HF_TOKEN).",
            ),
        ),
        (
            hf.RevisionNotFoundError,
            RevisionNotFoundError,
            (
                "Revision {revision!r} does not exist in {repo_id}.",
                "Use a branch, tag or full commit sha of that repository.",
            ),
        ),
        (
            hf.RemoteEntryNotFoundError,
            RemoteFileMissingError,
            (
                "A file of {repo_id}@{revision} is listed but missing on {where}: {file}.",
                "The repository is inconsistent; try another revision or report it to its owner.",
            ),
        ),
        ((hf.LocalEntryNotFoundError, hf.OfflineModeIsEnabled), OfflineError, not_cached),
        (
            hf.HfHubHTTPError,
            HubError,
            (
                "{where} answered HTTP {status} for {repo_id}.",
                "Run the command again; files already downloaded are kept in the cache.",
            ),
        ),
    )
    for kinds, error, (message, hint) in table:
        if isinstance(exc, kinds):
            values = {
                "repo_id": repo.repo_id,
                "revision": repo.revision,
                "where": repo.endpoint or "the Hub",
                "file": _url_file(exc),
                "status": getattr(getattr(exc, "response", None), "status_code", "?"),
            }
            return error(message.format(**values), hint=hint.format(**values))
    return None


def _disk_full(repo_id: str, exc: OSError, cache: Path) -> StoreIOError:
    """The error for a download that filled the disk (or the quota) of the HF cache."""
    try:
        free = f"{shutil.disk_usage(cache).free / 1e6:.1f} MB free"
    except OSError:
        free = "free space unknown"
    err = StoreIOError(
        f"Could not download {repo_id}: {os.strerror(exc.errno or errno.ENOSPC)} "
        f"in the Hugging Face cache {cache} ({free}). The store was left as it was.",
        hint="Free some disk space (mlxi prune, mlxi rm), or set HF_HOME (where downloads "
        "go) and MLXI_HOME to a disk with room.",
    )
    err.errno = exc.errno
    return err


def _scrub(exc: BaseException, token: str | bool | None) -> BaseException:
    """Remove a token from an exception's message before it can be shown."""
    if isinstance(token, str) and token and token in str(exc):
        exc.args = tuple(str(a).replace(token, "***") for a in exc.args)
    return exc


def _url_file(exc: BaseException) -> str:
    match = re.search(r"/resolve/[^/\s]+/(\S+)", str(exc))
    return match.group(1).rstrip(".") if match else "unknown file"


def _check_lfs_hashes(snapshot: Path, entries: tuple) -> None:
    """Compare each file's sha256 with its Hub LFS object id (the blob's name)."""
    for entry in entries:
        blob = Path(os.path.realpath(snapshot / entry.path))
        if _SHA256.fullmatch(blob.name) and blob.name != entry.sha256:
            # Drop the bad blob so the next pull fetches it again.
            blob.unlink(missing_ok=True)
            (snapshot / entry.path).unlink(missing_ok=True)
            raise IntegrityError(
                f"{entry.path} does not match its sha256 on the Hub "
                f"(expected {blob.name[:12]}, got {entry.sha256[:12]}).",
                hint="The corrupted file was removed from the cache; run the pull again.",
            )


def quantization_of(config: dict[str, Any]) -> QuantizationInfo | None:
    """The quantization recorded in an mlx-lm ``config.json``, if any."""
    q = config.get("quantization") or config.get("quantization_config")
    if not isinstance(q, dict) or "bits" not in q:
        return None
    return QuantizationInfo(
        bits=int(q["bits"]),
        group_size=int(q.get("group_size", 64)),
        mode=str(q.get("mode", "affine")),
        recipe=q.get("recipe"),
    )


def dtype_of(config: dict[str, Any]) -> str | None:
    """The floating dtype a config declares (``torch_dtype`` or ``dtype``)."""
    dtype = config.get("torch_dtype") or config.get("dtype")
    if dtype is None and isinstance(config.get("text_config"), dict):
        dtype = config["text_config"].get("torch_dtype") or config["text_config"].get("dtype")
    return str(dtype) if dtype else None
