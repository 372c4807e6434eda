"""Hub downloads that stop at once on Ctrl-C, keep what arrived, and resume from it.

``huggingface_hub`` downloads each file into a process-unique ``<etag>.<id>.incomplete``
file that it deletes when the download fails, and a Ctrl-C only reaches the main thread,
which then waits for the files in flight. So :func:`run_interruptibly` runs the download
in a helper thread; on Ctrl-C the partial files are hard-linked to ``<etag>.incomplete``
(the name huggingface_hub gives interrupted downloads) and a :class:`Cancellation` ends
every body being read, within one network read. The next pull finds the kept file and
asks the Hub only for the bytes after it (:func:`resume_partials`, an HTTP ``Range``
request through ``huggingface_hub``'s own ``http_get``).
"""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from mlx_integrations.models.progress import ProgressCallback, tqdm_bridge

T = TypeVar("T")


@dataclass(frozen=True)
class HubRevision:
    """One revision of a Hub repository, and where and how to download it."""

    repo_id: str
    """``namespace/name`` on the Hub."""
    revision: str
    """Branch, tag or commit sha."""
    endpoint: str | None = None
    """Hub URL; None for huggingface_hub's default."""
    cache_dir: str | None = None
    """Hugging Face cache; None for huggingface_hub's default."""
    token: str | bool | None = field(default=None, repr=False)
    """Hub token; left out of the repr so that it is never printed."""


# <sha256>.<id>.incomplete: huggingface_hub's file in flight (LFS files, named by sha256).
_IN_FLIGHT = re.compile(r"([0-9a-f]{64})\.[0-9a-f]+\.incomplete")
_KEPT = re.compile(r"([0-9a-f]{64})\.incomplete")
_STOP_WAIT_S = 10.0  # after Ctrl-C, the longest wait for the transfers to stop


class Cancellation:
    """Ends the Hub responses of one repository's download when :meth:`cancel` is called.

    While :meth:`active`, every response whose URL (or the URL it was redirected from)
    is a file of ``repo_id``, or one of :meth:`allow`'s URLs, gets a body that stops at
    the next network read once cancelled; the socket is shut down so that a stalled read
    returns too. The body then ends early, huggingface_hub writes what it received and
    fails the file with a size error.
    """

    def __init__(self, repo_id: str) -> None:
        self.repo_id = repo_id
        self.event = threading.Event()
        self._urls: set[str] = set()
        self._streams: set[_StoppableStream] = set()
        self._lock = threading.Lock()

    @property
    def cancelled(self) -> bool:
        return self.event.is_set()

    def allow(self, url: str) -> None:
        """Also stop responses of ``url`` (a file's download location outside the Hub)."""
        with self._lock:
            self._urls.add(url)

    def cancel(self) -> None:
        """Stop every body being read now, and every later one."""
        self.event.set()
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            stream.shutdown()

    def matches(self, urls: list[str]) -> bool:
        marker = f"/{self.repo_id}/resolve/"
        with self._lock:
            return any(marker in url or url in self._urls for url in urls)

    def active(self) -> _Registration:
        """A context manager during which this cancellation watches the Hub responses."""
        return _Registration(self)

    def _track(self, stream: _StoppableStream, add: bool) -> None:
        with self._lock:
            if add:
                self._streams.add(stream)
            else:
                self._streams.discard(stream)


_ACTIVE: set[Cancellation] = set()
_ACTIVE_LOCK = threading.Lock()


class _Registration:
    def __init__(self, cancellation: Cancellation) -> None:
        self.cancellation = cancellation

    def __enter__(self) -> Cancellation:
        _install_hook()
        with _ACTIVE_LOCK:
            _ACTIVE.add(self.cancellation)
        return self.cancellation

    def __exit__(self, *exc: object) -> None:
        with _ACTIVE_LOCK:
            _ACTIVE.discard(self.cancellation)


def _install_hook() -> None:
    """Add the response hook to huggingface_hub's shared HTTP client (once per client)."""
    from huggingface_hub import get_session

    session = get_session()
    hooks = session.event_hooks
    if _on_response not in hooks.get("response", []):
        session.event_hooks = {**hooks, "response": [*hooks.get("response", []), _on_response]}


def _on_response(response: Any) -> None:
    with _ACTIVE_LOCK:
        active = list(_ACTIVE)
    if not active:
        return
    urls = [str(r.request.url) for r in [*response.history, response]]
    for cancellation in active:
        if cancellation.matches(urls):
            response.stream = _stoppable(response, cancellation)
            return


def _stoppable(response: Any, cancellation: Cancellation) -> Any:
    return _stream_class()(response, cancellation)


@functools.cache
def _stream_class() -> type:
    import httpx  # huggingface_hub's HTTP library: imported only once a download starts

    class Stoppable(_StoppableStream, httpx.SyncByteStream):
        pass

    return Stoppable


class _StoppableStream:
    """A response body that ends at the first read after its cancellation is set."""

    def __init__(self, response: Any, cancellation: Cancellation) -> None:
        self._inner = response.stream
        self._response = response
        self._cancellation = cancellation

    def __iter__(self) -> Iterator[bytes]:
        cancellation = self._cancellation
        cancellation._track(self, add=True)
        try:
            if cancellation.cancelled:
                return
            for chunk in self._inner:
                yield chunk
                if cancellation.cancelled:
                    return
        except Exception:
            if cancellation.cancelled:  # the read that shutdown() ended
                return
            raise
        finally:
            cancellation._track(self, add=False)

    def close(self) -> None:
        self._inner.close()

    def shutdown(self) -> None:
        """Wake a read blocked on this response's socket."""
        stream = self._response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def run_interruptibly(work: Callable[[], T], on_interrupt: Callable[[], None]) -> T:
    """Run ``work`` in a helper thread; on Ctrl-C call ``on_interrupt``, wait, re-raise.

    ``on_interrupt`` must make ``work`` return soon (see :class:`Cancellation`). Whatever
    ``work`` raised after that is dropped: the KeyboardInterrupt is what happened. The
    wait is bounded, for a helper stuck where no cancellation reaches (a lock another
    process holds); a second Ctrl-C ends it too.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # re-raised in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="mlxi-download", daemon=True)
    thread.start()
    try:
        thread.join()
    except KeyboardInterrupt:
        on_interrupt()
        thread.join(timeout=_STOP_WAIT_S)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def keep_partial(path: Path) -> Path | None:
    """Hard-link huggingface_hub's file in flight to ``<sha256>.incomplete``, so it survives.

    Returns:
        The kept file, or None when ``path`` is not an LFS download or is already gone.
    """
    path = Path(path)
    match = _IN_FLIGHT.fullmatch(path.name)
    if match is None:
        return None
    kept = path.with_name(f"{match.group(1)}.incomplete")
    staged = path.with_name(f"{match.group(1)}.{os.getpid()}.keep")
    try:
        os.link(path, staged)
        os.replace(staged, kept)
    except OSError:  # finished (renamed into place) or removed meanwhile
        staged.unlink(missing_ok=True)
        return None
    return kept


def resume_partials(
    repo: HubRevision,
    *,
    storage: Path,
    locks: Path,
    cancellation: Cancellation,
    follow: Callable[[Path], None] | None = None,
    progress: ProgressCallback | None = None,
) -> float:
    """Finish the kept partial files of ``repo_id`` with HTTP Range requests.

    A partial file is resumed when the Hub still serves a file of ``revision`` with the
    same sha256 (ETag); it is then renamed to its blob, which ``snapshot_download`` reuses
    without downloading it again. Its sha256 is checked by the pull afterwards, as for
    any LFS blob. Partial files the revision no longer has are removed; files a killed
    pull left in flight are taken over when no other process holds their lock.

    Args:
        repo: The repository and revision being pulled, with the Hub URL and token.
        storage: The repository's folder in the Hugging Face cache.
        locks: The repository's folder of lock files.
        cancellation: Stops the transfer on Ctrl-C.
        follow: Called with each file before it grows (the streamed hasher).
        progress: Receives ``"bytes"`` updates, starting at the size already on disk.

    Returns:
        The bytes of the files completed here (the progress base for the rest).
    """
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import EntryNotFoundError
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    blobs = storage / "blobs"
    etags = _partial_etags(blobs)
    if not etags:
        return 0.0
    names = _tree_names(storage)
    done = 0.0
    for etag in etags:
        filename = names.get(etag)
        if filename is None:
            continue
        locks.mkdir(parents=True, exist_ok=True)
        with WeakFileLock(locks / f"{etag}.lock"):
            partial = _adopt(blobs, etag)
            if partial is None:
                continue
            if (blobs / etag).exists():
                partial.unlink(missing_ok=True)
                continue
            url = hf_hub_url(repo.repo_id, filename, revision=repo.revision, endpoint=repo.endpoint)
            try:
                meta = get_hf_file_metadata(url, token=repo.token, endpoint=repo.endpoint)
            except EntryNotFoundError:
                continue  # not in this revision: kept for the one that has it
            if meta.etag != etag or meta.size is None:
                partial.unlink(missing_ok=True)  # the file changed: these bytes are stale
                continue
            if meta.xet_file_data is not None and not constants.HF_HUB_DISABLE_XET:
                continue  # huggingface_hub fetches it through Xet, not by HTTP ranges
            have = partial.stat().st_size
            if have > meta.size:
                partial.unlink(missing_ok=True)
                continue
            cancellation.allow(meta.location)
            if follow is not None:
                follow(partial)
            bar = tqdm_bridge(progress, task="bytes", base=done)
            with partial.open("ab") as fh:
                http_get(
                    meta.location,
                    fh,
                    resume_size=have,
                    headers=build_hf_headers(token=repo.token),
                    expected_size=meta.size,
                    displayed_filename=filename,
                    tqdm_class=bar,
                )
            os.replace(partial, blobs / etag)
            done += meta.size
    return done


def _partial_etags(blobs: Path) -> list[str]:
    try:
        names = os.listdir(blobs)
    except OSError:
        return []
    found = set()
    for name in names:
        match = _KEPT.fullmatch(name) or _IN_FLIGHT.fullmatch(name)
        if match is not None:
            found.add(match.group(1))
    return sorted(found)


def _adopt(blobs: Path, etag: str) -> Path | None:
    """The longest partial file of ``etag`` as ``<etag>.incomplete`` (the others removed).

    Called under the etag's lock, so no other download writes these files now.
    """
    candidates = []
    for name in os.listdir(blobs):
        if name == f"{etag}.incomplete" or (
            name.startswith(f"{etag}.") and _IN_FLIGHT.fullmatch(name)
        ):
            try:
                candidates.append((os.stat(blobs / name).st_size, blobs / name))
            except OSError:
                continue
    if not candidates:
        return None
    candidates.sort(key=lambda c: c[0], reverse=True)
    kept = blobs / f"{etag}.incomplete"
    os.replace(candidates[0][1], kept)
    for _size, other in candidates[1:]:
        if other != candidates[0][1]:
            other.unlink(missing_ok=True)
    return kept


def _tree_names(storage: Path) -> dict[str, str]:
    """sha256 -> file name, from the tree listings huggingface_hub caches per commit.

    The listings are ``<repo folder>/trees/<commit>.json`` (``format_version`` 1); an
    unknown format gives nothing, so the file is downloaded from the start.
    """
    names: dict[str, str] = {}
    try:
        listings = sorted((storage / "trees").glob("*.json"), key=os.path.getmtime)
    except OSError:
        return names
    for listing in listings:
        try:
            data = json.loads(listing.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or data.get("format_version") != 1:
            continue
        for name, info in (data.get("files") or {}).items():
            if isinstance(info, dict) and isinstance(info.get("lfs_sha256"), str):
                names[info["lfs_sha256"]] = name
    return names
