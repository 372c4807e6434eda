"""A Hugging Face Hub on 127.0.0.1 that ``huggingface_hub.snapshot_download`` accepts.

It speaks the three routes the download path uses (revision info, tree listing,
resolve with HEAD/GET and byte ranges), with the headers and ``X-Error-Code`` values the
real Hub sends, and it can inject faults: a connection cut mid-file, a corrupted body,
a missing file, a gated repository, a slow link (``rate``). Every request is logged, with
its ``Range`` header, and the body bytes sent per file are counted (``sent``).

Example:
    >>> with FakeHub() as hub:  # doctest: +SKIP
    ...     sha = hub.add_repo("org/tiny", {"config.json": b"{}"})
    ...     snapshot_download("org/tiny", endpoint=hub.url, cache_dir=tmp)
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


@dataclass
class FakeCommit:
    """One commit: file name -> content."""

    sha: str
    files: dict[str, bytes]


@dataclass
class FakeRepo:
    """A repository with commits and branches (branch -> commit sha)."""

    repo_id: str
    commits: dict[str, FakeCommit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    gated: bool = False


@dataclass(frozen=True)
class LoggedRequest:
    """A request the hub answered."""

    method: str
    path: str
    range: str | None


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob (the ETag of a non-LFS file)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file of a folder as name -> bytes (symlinks followed)."""
    folder = Path(folder)
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


class FakeHub:
    """A loopback Hub; use as a context manager or call start()/stop().

    Attributes:
        url: ``http://127.0.0.1:<port>`` once started.
        requests: Every request, in arrival order.
        cut: file name -> number of GETs still to cut off half way.
        corrupt: file names whose body is served with flipped bytes.
        missing: file names listed in the tree but answered 404 EntryNotFound.
        rate: Bytes per second of each file body, or None for full speed.
        sent: file name -> body bytes written to clients so far.
    """

    def __init__(self, rate: float | None = None) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[LoggedRequest] = []
        self.cut: dict[str, int] = {}
        self.corrupt: set[str] = set()
        self.missing: set[str] = set()
        self.rate = rate
        self.sent: dict[str, int] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # Content

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes] | Path,
        *,
        branch: str = "main",
        gated: bool = False,
    ) -> str:
        """Add a commit to ``repo_id`` (created when new) and point ``branch`` at it.

        Returns:
            The new commit's 40-hex sha.
        """
        if isinstance(files, Path | str):
            files = folder_files(Path(files))
        repo = self.repos.setdefault(repo_id, FakeRepo(repo_id))
        repo.gated = repo.gated or gated
        h = hashlib.sha1(f"{repo_id}:{len(repo.commits)}".encode())
        for name in sorted(files):
            h.update(name.encode() + b"\0" + files[name])
        sha = h.hexdigest()
        repo.commits[sha] = FakeCommit(sha, dict(files))
        repo.branches[branch] = sha
        return sha

    def sent_bytes(self, name: str) -> int:
        """Body bytes of ``name`` written to clients so far (all requests together)."""
        with self._lock:
            return self.sent.get(name, 0)

    def requests_since(self, start: int) -> list[LoggedRequest]:
        """Requests logged after the first ``start`` ones."""
        with self._lock:
            return list(self.requests[start:])

    # Server

    def start(self) -> FakeHub:
        """Serve on a free port of 127.0.0.1 in a daemon thread."""
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _log(self, method: str, path: str, rng: str | None) -> None:
        with self._lock:
            self.requests.append(LoggedRequest(method, path, rng))

    def _count(self, name: str, n: int) -> None:
        with self._lock:
            self.sent[name] = self.sent.get(name, 0) + n


class _Handler(BaseHTTPRequestHandler):
    fake: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    # Routing

    def _route(self, head: bool) -> None:
        parsed = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(parsed.path)
        self.fake._log(self.command, path, self.headers.get("Range"))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6:
            repo_id = "/".join(parts[2:4])
            if parts[4] == "revision":
                return self._revision(repo_id, "/".join(parts[5:]))
            if parts[4] == "tree":
                return self._tree(repo_id, parts[5])
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), head)
        self._error(404, "EntryNotFound", "Not found")

    def _repo(self, repo_id: str) -> FakeRepo | None:
        repo = self.fake.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        if repo.gated and "authorization" not in {k.lower() for k in self.headers}:
            self._error(403, "GatedRepo", f"Access to model {repo_id} is restricted.")
            return None
        return repo

    def _commit(self, repo: FakeRepo, revision: str) -> FakeCommit | None:
        sha = repo.branches.get(revision, revision)
        commit = repo.commits.get(sha)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    def _revision(self, repo_id: str, revision: str) -> None:
        repo = self._repo(repo_id)
        commit = repo and self._commit(repo, revision)
        if commit is None:
            return
        body = {
            "id": repo_id,
            "modelId": repo_id,
            "sha": commit.sha,
            "private": False,
            "gated": repo.gated if repo else False,
            "siblings": [{"rfilename": n} for n in sorted(commit.files)],
        }
        self._send_json(body)

    def _tree(self, repo_id: str, revision: str) -> None:
        repo = self._repo(repo_id)
        commit = repo and self._commit(repo, revision)
        if commit is None:
            return
        entries = []
        for name, data in sorted(commit.files.items()):
            entry: dict[str, object] = {
                "type": "file",
                "path": name,
                "size": len(data),
                "oid": git_blob_sha1(data),
            }
            if name.endswith(LFS_SUFFIXES):
                sha = hashlib.sha256(data).hexdigest()
                entry["lfs"] = {"oid": sha, "size": len(data), "pointerSize": 134}
            entries.append(entry)
        self._send_json(entries)

    def _resolve(self, repo_id: str, revision: str, name: str, head: bool) -> None:
        repo = self._repo(repo_id)
        commit = repo and self._commit(repo, revision)
        if commit is None:
            return
        data = commit.files.get(name)
        if data is None or name in self.fake.missing:
            self._error(404, "EntryNotFound", f"{name} does not exist on {revision}")
            return
        lfs = name.endswith(LFS_SUFFIXES)
        etag = hashlib.sha256(data).hexdigest() if lfs else git_blob_sha1(data)
        if name in self.fake.corrupt:
            data = bytes(b ^ 0xFF for b in data)
        start, end = 0, len(data) - 1
        rng = self.headers.get("Range")
        if rng and not head and rng.startswith("bytes="):
            first, _, last = rng[len("bytes=") :].partition("-")
            start = int(first or 0)
            end = int(last) if last else len(data) - 1
        status = 206 if rng and not head else 200
        body = data[start : end + 1]
        self.send_response(status)
        self.send_header("X-Repo-Commit", commit.sha)
        self.send_header("ETag", f'"{etag}"')
        if lfs:
            self.send_header("X-Linked-Etag", f'"{etag}"')
            self.send_header("X-Linked-Size", str(len(data)))
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(len(body) if not head else len(data)))
        cut = False
        if not head:
            with self.fake._lock:
                if self.fake.cut.get(name, 0) > 0 and len(body) > 1:
                    self.fake.cut[name] -= 1
                    cut = True
        if cut:
            self.send_header("Connection", "close")
        self.end_headers()
        if head:
            return
        if cut:
            self._write_body(name, body[: len(body) // 2])
            self.close_connection = True
            return
        self._write_body(name, body)

    def _write_body(self, name: str, body: bytes) -> None:
        """Send ``body`` at the hub's rate, in small pieces; a client that left ends it."""
        rate = self.fake.rate
        piece = max(len(body), 1) if rate is None else 8192
        pace = 0.0 if rate is None else piece / rate
        try:
            for start in range(0, len(body), piece):
                self.wfile.write(body[start : start + piece])
                self.wfile.flush()
                self.fake._count(name, len(body[start : start + piece]))
                if pace:
                    time.sleep(pace)
        except OSError:  # the client closed the connection (Ctrl-C, cancelled download)
            self.close_connection = True

    # Responses

    def _send_json(self, body: object) -> None:
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _error(self, status: int, code: str, message: str) -> None:
        raw = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if self.command != "HEAD":  # a body after HEAD would garble the next response
            self.wfile.write(raw)
