"""The side channel of a distributed engine: heartbeats and exit orders over TCP.

A collective that waits for a rank that died or hangs cannot be interrupted from
Python, so the ranks also keep one plain TCP connection to rank 0, beside MLX's own
transport. Each side sends a heartbeat several times per ``rank_timeout``; the other
side treats a closed connection, or silence longer than ``rank_timeout``, as the loss
of that rank. Rank 0 then fails its requests with a clear error and orders the others
to exit; a follower that loses rank 0 ends its process at once (``os._exit``), since its
own thread may be blocked inside a collective.

Silence counts only once the group is formed: ``mx.distributed.init`` holds the GIL
while MLX's ring connects (retrying each second and more), so no Python thread of a
rank beats then. Rank 0 counts from :meth:`ControlServer.start`, a follower from
:meth:`ControlClient.arm`; before that, ``start_timeout`` and a closed connection bound
the wait.

Rank 0 also rings the others before each message it shares through MLX (``"work"``):
MLX's ring backend spins while it waits in a collective, so an idle rank waits on
its socket instead, and the CPU stays free.

Messages are JSON lines. Follower to rank 0: ``{"rank", "pid", "host"}`` once, then
``{"beat": ..., "stats": {...}}``. Rank 0 to followers: ``{"op": "go"}``,
``{"op": "work"}``, ``{"op": "beat"}``, ``{"op": "exit", "code", "reason"}``.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


def beat_interval(rank_timeout: float) -> float:
    """Seconds between heartbeats: several per timeout, at most one a second."""
    return max(0.05, min(1.0, rank_timeout / 8))


class _Peer:
    """One follower's connection as rank 0 sees it."""

    def __init__(self, sock: socket.socket, reader: Any, hello: dict[str, Any]):
        self.sock = sock
        self.rank = int(hello["rank"])
        self.pid = int(hello.get("pid", 0))
        self.host = str(hello.get("host", ""))
        self.last_seen = time.monotonic()
        self.stats: dict[str, Any] = {}
        self.error = ""
        """What the rank said went wrong (a failed load), if it did."""
        self.ended = False
        """Its connection has closed (its reader is done)."""
        self.lock = threading.Lock()
        self.reader = reader

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self.lock:
            self.sock.sendall(data)


class ControlServer:
    """Rank 0's end: accepts every follower, watches their heartbeats.

    Args:
        sock: A listening socket.
        world_size: Ranks in the group, rank 0 included.
        rank_timeout: Silence, in seconds, after which a rank counts as lost.
        on_failure: Called once, from a watchdog thread, with a sentence naming the
            lost rank.
        stalled: Returns how long rank 0 has been waiting on one step of a request
            (None when idle); longer than ``rank_timeout`` is a failure too.
    """

    def __init__(
        self,
        sock: socket.socket,
        world_size: int,
        rank_timeout: float,
        on_failure: Callable[[str], None],
        stalled: Callable[[], float | None] = lambda: None,
    ):
        self._sock = sock
        self.world_size = world_size
        self.rank_timeout = rank_timeout
        self._on_failure = on_failure
        self._stalled = stalled
        self.peers: dict[int, _Peer] = {}
        self.lost: dict[int, str] = {}
        self._closed = threading.Event()
        self._leaving = threading.Event()
        self._settled = threading.Event()
        """Set once a rank is lost, or the ranks are told to exit."""
        self._errors = threading.Condition()
        self._failed = False

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    def accept_all(self, timeout: float) -> None:
        """Wait until every follower has connected and said which rank it is.

        Raises:
            TimeoutError: A rank did not connect within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while len(self.peers) < self.world_size - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(1, self.world_size)) - set(self.peers))
                raise TimeoutError(
                    f"rank(s) {missing} of {self.world_size} did not connect to rank 0 "
                    f"within {timeout:g}s; check that every rank was started (mlxi launch "
                    "starts them all) and can reach rank 0's address"
                )
            self._sock.settimeout(min(left, 1.0))
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            conn.settimeout(max(left, 1.0))
            try:
                reader = conn.makefile("r", encoding="utf-8")
                peer = _Peer(conn, reader, json.loads(reader.readline() or "{}"))
            except (OSError, ValueError, KeyError) as exc:
                logger.warning("Ignoring a connection that sent no valid hello: %s", exc)
                conn.close()
                continue
            conn.settimeout(None)
            self.peers[peer.rank] = peer
        self._sock.close()

    def start(self) -> None:
        """Start the reader of each follower and the watchdog; silence counts from now
        (a follower inside ``mx.distributed.init`` cannot beat before)."""
        now = time.monotonic()
        for peer in self.peers.values():
            peer.last_seen = now
        for peer in self.peers.values():
            threading.Thread(
                target=self._read, args=(peer,), name=f"mlxi-control-{peer.rank}", daemon=True
            ).start()
        threading.Thread(target=self._watch, name="mlxi-watchdog", daemon=True).start()

    def send_all(self, message: dict[str, Any]) -> None:
        for peer in list(self.peers.values()):
            if peer.rank in self.lost:
                continue
            try:
                peer.send(message)
            except OSError:
                pass  # its reader reports the loss

    def expect_exits(self) -> None:
        """Rank 0 is about to tell the ranks to exit: from now on a closed connection
        or a silence is their leaving, not a loss. Without this, a fast follower's exit
        reads as a failure and the slower ones are told to exit with status 1."""
        self._leaving.set()
        self._settled.set()

    def wait_lost(self, timeout: float) -> dict[int, str]:
        """The lost ranks, once a loss is known (at most ``timeout`` s, the watchdog's
        verdict comes within ``rank_timeout``), or at once if the ranks are leaving."""
        self._settled.wait(timeout)
        return dict(self.lost)

    def wait_errors(self, ranks: list[int], timeout: float) -> list[str]:
        """What each of ``ranks`` said went wrong, once all have said it or their
        connection has ended (at most ``timeout`` s); "" for a rank that said nothing."""
        deadline = time.monotonic() + timeout
        with self._errors:
            while not all(self.peers[r].error or self.peers[r].ended for r in ranks):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._errors.wait(left)
            return [self.peers[r].error for r in ranks]

    def close(self, code: int, reason: str) -> None:
        """Order every follower to exit with ``code``; stop watching. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._settled.set()
        self.send_all({"op": "exit", "code": code, "reason": reason})
        for peer in self.peers.values():
            try:
                peer.sock.close()
            except OSError:
                pass

    def _fail(self, rank: int, why: str) -> None:
        if self._closed.is_set() or self._leaving.is_set():
            return
        self.lost.setdefault(rank, why)
        self._settled.set()
        if not self._failed:
            self._failed = True
            self._on_failure(f"rank {rank} of {self.world_size} {why}")

    def _read(self, peer: _Peer) -> None:
        try:
            for line in peer.reader:
                message = json.loads(line)
                peer.last_seen = time.monotonic()
                if isinstance(message.get("stats"), dict):
                    peer.stats = message["stats"]
                if message.get("error"):
                    with self._errors:
                        peer.error = str(message["error"])
                        self._errors.notify_all()
        except (OSError, ValueError):
            pass
        with self._errors:
            peer.ended = True
            self._errors.notify_all()
        error = peer.error
        self._fail(peer.rank, f"failed: {error}" if error else "exited (its connection closed)")

    def _watch(self) -> None:
        interval = beat_interval(self.rank_timeout)
        while not self._closed.wait(interval):
            self.send_all({"op": "beat"})
            self.check(time.monotonic())

    def check(self, now: float) -> None:
        """One round of the watchdog: a rank silent past ``rank_timeout``, or a step
        waited on for longer, is a loss.

        A stalled step while a rank has missed its heartbeats (silent for over two
        beats: a live rank beats every one) is that rank's loss, not rank 0's: a rank
        that hangs (SIGSTOP, a frozen machine) stalls the step too, and which of the
        two passes ``rank_timeout`` first depends on when its last beat was read.
        """
        silences = {  # beats unread in its socket: this process was slow, not the rank
            peer.rank: now - peer.last_seen
            for peer in list(self.peers.values())
            if peer.rank not in self.lost and not _pending(peer.sock)
        }
        for rank, silent in silences.items():
            if silent > self.rank_timeout:
                self._fail(rank, f"sent no heartbeat for {silent:.0f}s (hung?)")
        stalled = self._stalled()
        if stalled is not None and stalled > self.rank_timeout:
            missed = {r: s for r, s in silences.items() if s > 2 * beat_interval(self.rank_timeout)}
            if missed:
                rank = max(missed, key=missed.__getitem__)
                self._fail(rank, f"sent no heartbeat for {missed[rank]:.0f}s (hung?)")
            else:
                self._fail(0, f"waited {stalled:.0f}s on a step that did not complete")


def listen(host: str, port: int = 0) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(64)
    return sock


class ControlClient:
    """A follower's end: heartbeats to rank 0, and exits when rank 0 says or is lost."""

    def __init__(self, sock: socket.socket, rank: int, rank_timeout: float):
        self._sock = sock
        self.rank = rank
        self.rank_timeout = rank_timeout
        self._lock = threading.Lock()
        self._last_seen = time.monotonic()
        self._stats: Callable[[], dict[str, Any]] = dict
        self._go = threading.Event()
        self._work = threading.Semaphore(0)
        self._armed = False

    @classmethod
    def connect(
        cls, host: str, port: int, rank: int, rank_timeout: float, timeout: float
    ) -> ControlClient:
        """Connect to rank 0, retrying until it listens.

        Raises:
            TimeoutError: Rank 0 did not listen within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=5)
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"rank {rank}: rank 0 did not open its control port {host}:{port} "
                        f"within {timeout:g}s ({exc}); does the program on rank 0 create "
                        "a DistributedEngine?"
                    ) from None
                time.sleep(0.2)
        sock.settimeout(None)
        client = cls(sock, rank, rank_timeout)
        client.send({"rank": rank, "pid": os.getpid(), "host": socket.gethostname()})
        return client

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self._lock:
            self._sock.sendall(data)

    def start(self, stats: Callable[[], dict[str, Any]]) -> None:
        """Start heartbeats (carrying ``stats()``), the reader and the watchdog."""
        self._stats = stats
        threading.Thread(target=self._read, name="mlxi-control", daemon=True).start()
        threading.Thread(target=self._beat, name="mlxi-heartbeat", daemon=True).start()

    def wait_go(self, timeout: float) -> None:
        """Block until rank 0 says every rank has connected."""
        if not self._go.wait(timeout):
            _exit(1, f"rank {self.rank}: rank 0 gave no start signal within {timeout:g}s")

    def arm(self) -> None:
        """The group is formed: from now on, rank 0's silence past ``rank_timeout``
        ends this rank. Before, rank 0 may be inside ``mx.distributed.init``, which
        holds its GIL (no beats) while MLX's ring connects."""
        self._last_seen = time.monotonic()
        self._armed = True

    def wait_work(self) -> None:
        """Block until rank 0 rings: it is about to share a message.

        MLX's ring backend spins while it waits in a collective; an idle rank waits
        here, on a socket, instead.
        """
        self._work.acquire()

    def _read(self) -> None:
        try:
            for line in self._sock.makefile("r", encoding="utf-8"):
                message = json.loads(line)
                self._last_seen = time.monotonic()
                op = message.get("op")
                if op == "work":
                    self._work.release()
                elif op == "go":
                    self._go.set()
                elif op == "exit":
                    code = int(message.get("code", 1))
                    _exit(code, f"rank {self.rank}: {message.get('reason', '')}" if code else "")
        except (OSError, ValueError):
            pass
        _exit(1, f"rank {self.rank}: lost the connection to rank 0; exiting")

    def _beat(self) -> None:
        interval = beat_interval(self.rank_timeout)
        while True:
            try:
                self.send({"beat": time.time(), "stats": self._stats()})
            except OSError:
                _exit(1, f"rank {self.rank}: lost the connection to rank 0; exiting")
            silent = time.monotonic() - self._last_seen
            if self._armed and silent > self.rank_timeout and not _pending(self._sock):
                _exit(1, f"rank {self.rank}: no heartbeat from rank 0 for {silent:.0f}s; exiting")
            time.sleep(interval)


def _pending(sock: socket.socket) -> bool:
    """Whether ``sock`` holds data not read yet (its reader is behind, not its peer)."""
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):  # closed
        return False


def _exit(code: int, message: str) -> None:
    """End the process now: its main thread may be blocked inside a collective."""
    if message:
        print(message, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)
