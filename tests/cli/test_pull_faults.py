"""``mlxi pull`` when things go wrong: Ctrl-C on a slow Hub, the pull after it, a full disk."""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlx_integrations.cli.main import app
from typer.testing import CliRunner

from mlx_integrations.models import ModelStore, pull
from tests.support.fake_hub import FakeHub
from tests.support.signals import with_default_sigint

RATE = 100_000  # bytes per second: the weights take 20 s to arrive in full
WEIGHTS = os.urandom(2_000_000)
FILES = {"config.json": b'{"model_type": "llama"}', "model.safetensors": WEIGHTS}
SHA = hashlib.sha256(WEIGHTS).hexdigest()


@pytest.fixture
def hub():
    with FakeHub() as server:
        server.add_repo("org/slow", FILES)
        yield server


def blobs(env: dict[str, str]) -> Path:
    return Path(env["HF_HUB_CACHE"]) / "models--org--slow" / "blobs"


def wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _asked_for_weights(hub: FakeHub, since: int) -> bool:
    return bool(weights_ranges(hub, since))


def interrupted_pull(
    hub: FakeHub, env: dict[str, str], *, rate: float = RATE, after: int = 200_000
) -> tuple[int, str, float, int]:
    """Start ``mlxi pull`` on the slow Hub, press Ctrl-C once ``after`` more bytes were sent.

    Returns:
        Exit code, stderr, seconds from SIGINT to exit, body bytes sent before SIGINT.
    """
    hub.rate = rate
    before = len(hub.requests)
    exe = Path(sys.executable).with_name("mlxi")
    proc = subprocess.Popen(
        with_default_sigint([str(exe), "pull", "org/slow"]),
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Observable progress of this pull first: its request for the weights has come
        # (bytes counted before it may still belong to an earlier, interrupted transfer),
        # then part of the weights has left the Hub.
        wait_for(lambda: _asked_for_weights(hub, before), "the request for the weights")
        start_at = hub.sent_bytes("model.safetensors")
        wait_for(lambda: hub.sent_bytes("model.safetensors") >= start_at + after, "the download")
        sent = hub.sent_bytes("model.safetensors")
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=120)
        return proc.returncode, err, time.monotonic() - start, sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ctrl_c_stops_the_download_at_once_and_keeps_the_partial_file(hub, env):
    code, err, seconds, _sent = interrupted_pull(hub, env)
    assert code == 130, err
    assert "Interrupted." in err and "Traceback" not in err
    # Finishing the file would take 18 s more at this rate: stopping must not wait for it.
    assert seconds < 9, f"exit took {seconds:.1f} s after Ctrl-C"
    kept = blobs(env) / f"{SHA}.incomplete"
    assert kept.exists(), sorted(os.listdir(blobs(env)))
    # What had arrived when Ctrl-C came: the start of the file, not all of it.
    size = kept.stat().st_size
    assert 0 < size < len(WEIGHTS)
    assert kept.read_bytes() == WEIGHTS[:size]
    assert not (blobs(env) / SHA).exists()
    assert not ModelStore(Path(env["MLXI_HOME"])).contains("org/slow")


@pytest.mark.parametrize("left_by", ["ctrl-c", "kill"])
def test_pull_after_an_interrupted_one_asks_only_for_the_missing_bytes(
    hub, env, monkeypatch, left_by
):
    code, err, _seconds, _sent = interrupted_pull(hub, env)
    assert code == 130, err
    kept = (blobs(env) / f"{SHA}.incomplete").stat().st_size
    if left_by == "kill":
        # A killed pull leaves huggingface_hub's own file in flight, under its lock's name.
        (blobs(env) / f"{SHA}.incomplete").rename(blobs(env) / f"{SHA}.0badf00d.incomplete")

    hub.rate = None
    before = len(hub.requests)
    updates = []
    result = pull("org/slow", progress=updates.append)
    gets = [
        r
        for r in hub.requests_since(before)
        if r.method == "GET" and r.path.endswith("model.safetensors")
    ]
    assert [g.range for g in gets] == [f"bytes={kept}-"]
    entry = {f.path: f for f in result.model.manifest.files}["model.safetensors"]
    assert entry.sha256 == SHA and entry.size == len(WEIGHTS)
    # Whether the hash was taken while the file grew (the kept bytes included) or from
    # disk once it was whole depends on how fast the rest arrived; both are checked
    # against the sha256 the Hub published. The streamed case is tested in
    # tests/models/test_hashing.py without timing.
    assert not list(blobs(env).glob("*.incomplete"))
    first = next(u for u in updates if u.task == "bytes")
    assert first.completed == kept and first.total == len(WEIGHTS)
    assert ModelStore(Path(env["MLXI_HOME"])).verify("org/slow").ok


def test_ctrl_c_during_a_stalled_read_of_a_resumed_download(hub, env):
    code, err, _seconds, _sent = interrupted_pull(hub, env)
    assert code == 130, err
    kept = blobs(env) / f"{SHA}.incomplete"
    first = kept.stat().st_size
    assert first > 0

    # The next pull resumes; the Hub sends 8 KiB and then nothing for 80 s, so the read
    # is blocked when Ctrl-C comes. It stops at once and keeps at least what it had.
    resumed_from = len(hub.requests)
    code, err, seconds, _sent = interrupted_pull(hub, env, rate=100, after=8192)
    assert code == 130, err
    assert seconds < 9, f"exit took {seconds:.1f} s after Ctrl-C"
    second = kept.stat().st_size
    assert first <= second < len(WEIGHTS)
    assert kept.read_bytes() == WEIGHTS[:second]
    # Its transfer asked only for what the first pull had left. (huggingface_hub's
    # http_get retries once with the same range when Ctrl-C cuts its stream.)
    assert set(weights_ranges(hub, resumed_from)) == {f"bytes={first}-"}

    hub.rate = None
    last_from = len(hub.requests)
    assert ModelStore(Path(env["MLXI_HOME"])).verify(pull("org/slow").model.name).ok
    assert weights_ranges(hub, 0)[0] is None  # the first pull started from byte 0
    assert weights_ranges(hub, last_from) == [f"bytes={second}-"]


def weights_ranges(hub: FakeHub, since: int) -> list[str | None]:
    """The Range headers of the requests for the weights, from request ``since`` on."""
    return [
        r.range
        for r in hub.requests_since(since)
        if r.method == "GET" and r.path.endswith("model.safetensors")
    ]


def test_a_corrupt_partial_file_is_caught_by_its_sha256_and_fetched_again(hub, env):
    code, err, _seconds, _sent = interrupted_pull(hub, env)
    assert code == 130, err
    kept = blobs(env) / f"{SHA}.incomplete"
    data = bytearray(kept.read_bytes())
    data[10] ^= 0xFF
    kept.write_bytes(bytes(data))

    hub.rate = None
    from mlx_integrations.models import IntegrityError

    with pytest.raises(IntegrityError, match=r"model\.safetensors"):
        pull("org/slow")
    assert not (blobs(env) / SHA).exists() and not kept.exists()
    assert ModelStore(Path(env["MLXI_HOME"])).verify(pull("org/slow").model.name).ok


class FullDisk:
    """A download file on a disk that fills up after ``room`` bytes."""

    def __init__(self, fh, room: int) -> None:
        self._fh = fh
        self._room = room

    def write(self, data: bytes) -> int:
        if len(data) > self._room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._room -= len(data)
        return self._fh.write(data)

    def __getattr__(self, name: str):
        return getattr(self._fh, name)


def test_a_full_disk_is_one_error_with_a_hint_and_no_warning(hub, env, monkeypatch):
    import shutil

    from huggingface_hub import file_download

    real_get = file_download.http_get
    real_usage = shutil.disk_usage

    def http_get(url, temp_file, **kwargs):
        return real_get(url, FullDisk(temp_file, room=1000), **kwargs)

    def disk_usage(path):
        return real_usage(path)._replace(free=1000)

    # huggingface_hub warns when the free space looks too small, then the write fails.
    monkeypatch.setattr(file_download, "http_get", http_get)
    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    result = CliRunner().invoke(app, ["pull", "org/slow"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("Error: Could not download org/slow: No space left on device")
    assert lines[1].startswith("Hint: Free some disk space")
    assert "HF_HOME" in lines[1] and "MLXI_HOME" in lines[1]
    assert result.stdout == ""
    assert not ModelStore(Path(env["MLXI_HOME"])).contains("org/slow")
    assert not list(blobs(env).glob("*.incomplete"))
