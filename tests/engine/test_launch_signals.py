"""SIGTERM to ``mlxi launch``: the launcher's watch of its ranks, on plain processes.

The signal itself is counted by the launcher's handler; here the count is given to the
watch directly (no signal is raced). Rank 0 stops as a server does (it finishes, then
lets the others know); rank 1 waits for that.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from mlx_integrations.engine.distributed.launch import _wait

RANK0 = """
import pathlib, signal, sys, time
done = pathlib.Path(sys.argv[1])
def stop(*_):
    time.sleep(0.3)  # what it was doing
    done.write_text("stop")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
pathlib.Path(sys.argv[2]).write_text("ready")
while True:
    time.sleep(0.05)
"""
RANK1 = """
import pathlib, sys, time
done = pathlib.Path(sys.argv[1])
while not done.exists():
    time.sleep(0.05)
"""


def start(tmp_path: Path, rank0: str = RANK0) -> list[subprocess.Popen[bytes]]:
    done, ready = tmp_path / "done", tmp_path / "ready"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(done), str(ready)], start_new_session=True
        )
        for code in (rank0, RANK1)
    ]
    deadline = time.monotonic() + 60
    while not ready.exists() and procs[0].poll() is None:  # its handler is installed
        assert time.monotonic() < deadline, "rank 0 did not start"
        time.sleep(0.02)
    return procs


def test_sigterm_goes_to_rank_0_which_ends_the_others(tmp_path):
    procs = start(tmp_path)
    result = _wait(procs, ["127.0.0.1"] * 2, grace=60, sigterms=[1])
    assert result.exit_code == 0, result
    assert [(r.returncode, r.stopped) for r in result.ranks] == [(0, False), (0, False)]


def test_a_second_sigterm_stops_every_rank_at_once(tmp_path):
    procs = start(tmp_path)
    result = _wait(procs, ["127.0.0.1"] * 2, grace=60, sigterms=[1, 1])
    assert result.failure == "stopped by a second SIGTERM"
    assert all(r.stopped for r in result.ranks)
    assert all(p.poll() is not None for p in procs)


def test_sigterm_after_rank_0_ended_stops_the_others_at_once(tmp_path):
    procs = start(tmp_path, rank0="pass")  # rank 0 ends at once; rank 1 would wait forever
    procs[0].wait(60)
    began = time.monotonic()
    result = _wait(procs, ["127.0.0.1"] * 2, grace=600, sigterms=[1])
    assert time.monotonic() - began < 60  # not the grace
    assert result.ranks[0].returncode == 0 and not result.ranks[0].stopped
    assert result.ranks[1].stopped
    assert procs[1].poll() is not None


def test_without_sigterm_the_grace_after_rank_0_still_applies(tmp_path):
    procs = start(tmp_path, rank0="pass")
    result = _wait(procs, ["127.0.0.1"] * 2, grace=0.5, sigterms=[])
    assert result.failure == "rank(s) [1] still ran 0.5s after rank 0 exited"
    assert result.ranks[1].stopped
