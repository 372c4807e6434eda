"""Rank 0's side channel (engine/control.py) over real loopback sockets, no MLX."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from mlx_integrations.engine.control import ControlServer, listen


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
