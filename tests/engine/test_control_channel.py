"""Rank 0's side channel (engine/distributed/control.py) over real loopback sockets, no MLX."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from mlx_integrations.engine.distributed import control
from mlx_integrations.engine.distributed.control import ControlServer, listen


def _follower(address: tuple[str, int], rank: int) -> socket.socket:
    sock = socket.create_connection(address, timeout=30)
    sock.sendall((json.dumps({"rank": rank, "pid": 0, "host": "test"}) + "\n").encode())
    return sock


def _reader_of(rank: int) -> threading.Thread:
    return next(t for t in threading.enumerate() if t.name == f"mlxi-control-{rank}")


def _orders(sock: socket.socket) -> Iterator[dict[str, object]]:
    for line in sock.makefile("r", encoding="utf-8"):
        yield json.loads(line)


@pytest.fixture
def three_ranks() -> Iterator[tuple[ControlServer, list[socket.socket], list[str]]]:
    failures: list[str] = []
    server = ControlServer(listen("127.0.0.1"), 3, rank_timeout=30, on_failure=failures.append)
    followers: list[socket.socket] = []
    accept = threading.Thread(target=server.accept_all, args=(30,))
    accept.start()
    followers = [_follower(server.address, rank) for rank in (1, 2)]
    accept.join(30)
    server.start()
    yield server, followers, failures
    server.close(0, "")
    for sock in followers:
        sock.close()


def test_a_follower_that_leaves_after_the_exit_order_is_no_failure(
    three_ranks: tuple[ControlServer, list[socket.socket], list[str]],
) -> None:
    server, (first, second), failures = three_ranks
    server.expect_exits()
    reader = _reader_of(1)
    first.close()  # rank 1 took the exit order first and is gone
    reader.join(30)
    server.close(0, "")
    assert failures == [] and server.lost == {}
    exit_order = next(m for m in _orders(second) if m.get("op") == "exit")
    assert exit_order["code"] == 0  # rank 2 is told to exit cleanly, not with status 1


def test_a_follower_that_leaves_unasked_is_a_failure_named_for_the_others(
    three_ranks: tuple[ControlServer, list[socket.socket], list[str]],
) -> None:
    server, (first, _), failures = three_ranks
    reader = _reader_of(1)
    first.close()
    reader.join(30)
    assert failures == ["rank 1 of 3 exited (its connection closed)"]
    assert server.lost == {1: "exited (its connection closed)"}


def _server(world: int, stalled: float | None = None) -> tuple[ControlServer, list[str]]:
    failures: list[str] = []
    server = ControlServer(
        listen("127.0.0.1"),
        world,
        rank_timeout=30,
        on_failure=failures.append,
        stalled=lambda: stalled,
    )
    return server, failures


def _accepted(server: ControlServer, ranks: list[int]) -> list[socket.socket]:
    accept = threading.Thread(target=server.accept_all, args=(30,))
    accept.start()
    followers = [_follower(server.address, rank) for rank in ranks]
    accept.join(30)
    assert sorted(server.peers) == ranks
    return followers


def test_a_stalled_step_while_a_rank_misses_its_beats_is_that_ranks_loss() -> None:
    # Rank 1 hangs (SIGSTOP): its beats stop and rank 0's step stalls. The stall may pass
    # rank_timeout before the silence does (its last beat was read after the last step).
    server, failures = _server(3, stalled=31.0)
    followers = _accepted(server, [1, 2])
    now = server.peers[2].last_seen
    server.peers[1].last_seen = now - 29.0  # missed its beats, not yet rank_timeout
    server.check(now)
    assert failures == ["rank 1 of 3 sent no heartbeat for 29s (hung?)"]
    assert list(server.lost) == [1]
    for sock in followers:
        sock.close()


def test_a_stalled_step_while_every_rank_beats_is_rank_zeros_loss() -> None:
    server, failures = _server(2, stalled=31.0)
    followers = _accepted(server, [1])
    server.check(server.peers[1].last_seen + 0.5)  # beats on time (one a second)
    assert failures == ["rank 0 of 2 waited 31s on a step that did not complete"]
    followers[0].close()


def test_rank_zero_counts_silence_from_start() -> None:
    # Between accept and start rank 0 forms the MLX group; mx.distributed.init holds the
    # GIL of every rank meanwhile, so no rank beats: that time is no silence.
    server, failures = _server(2)
    followers = _accepted(server, [1])
    server.peers[1].last_seen -= 100.0
    server.start()
    server.check(server.peers[1].last_seen + 1.0)
    assert failures == []
    server.close(0, "")
    followers[0].close()


def test_wait_lost_names_the_rank_whose_connection_closed(
    three_ranks: tuple[ControlServer, list[socket.socket], list[str]],
) -> None:
    server, (first, _), _ = three_ranks
    first.close()
    assert server.wait_lost(30) == {1: "exited (its connection closed)"}


def test_wait_lost_returns_at_once_once_the_ranks_are_told_to_leave(
    three_ranks: tuple[ControlServer, list[socket.socket], list[str]],
) -> None:
    server, _, _ = three_ranks
    server.expect_exits()
    assert server.wait_lost(3600) == {}


def test_wait_errors_waits_for_each_ranks_words_or_its_end(
    three_ranks: tuple[ControlServer, list[socket.socket], list[str]],
) -> None:
    server, (first, second), _ = three_ranks
    server.expect_exits()
    first.sendall(b'{"error": "could not load the model: no such file"}\n')
    second.close()  # said nothing, and is gone
    assert server.wait_errors([1, 2], 3600) == ["could not load the model: no such file", ""]


def test_a_follower_counts_rank_zeros_silence_only_once_armed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exits: list[str] = []
    parked = threading.Semaphore(0)

    def record(code: int, message: str) -> None:
        exits.append(message)
        parked.release()
        threading.Event().wait()  # os._exit never returns: the thread stays here

    monkeypatch.setattr(control, "_exit", record)
    leader = listen("127.0.0.1")  # rank 0 inside mx.distributed.init: it never speaks
    connected = time.time()
    host, port = leader.getsockname()[:2]
    client = control.ControlClient.connect(host, port, 1, 0.2, timeout=30)
    conn, _ = leader.accept()
    client.start(dict)
    beats = conn.makefile("r", encoding="utf-8")
    assert "rank" in json.loads(beats.readline())  # the hello
    # A beat sent well past rank_timeout, then the next: the silence check that comes
    # after each beat has run with rank 0 silent for over 0.6 s.
    while json.loads(beats.readline())["beat"] < connected + 0.6:
        pass
    assert "beat" in json.loads(beats.readline())
    assert exits == []
    client.arm()
    assert parked.acquire(timeout=30)
    assert exits[0].startswith("rank 1: no heartbeat from rank 0 for")
    beats.close()
    conn.close()  # the reader sees rank 0's end and parks too: no thread is left to
    leader.close()  # call the real os._exit once the patch is undone
    assert parked.acquire(timeout=30)
    assert exits[1] == "rank 1: lost the connection to rank 0; exiting"


def test_a_rank_whose_beats_wait_unread_is_not_silent() -> None:
    # Rank 0 itself was frozen (a C call holding the GIL, a starved CPU): rank 1's
    # beats sit in the socket, unread; the time since the last one read is no silence.
    server, failures = _server(2)
    followers = _accepted(server, [1])  # no readers yet: what rank 1 sends stays unread
    followers[0].sendall(b'{"beat": 0, "stats": {}}\n')
    assert select.select([server.peers[1].sock], [], [], 30)[0]  # it has arrived
    assert control._pending(server.peers[1].sock)
    server.check(server.peers[1].last_seen + 100.0)
    assert failures == []
    followers[0].close()
