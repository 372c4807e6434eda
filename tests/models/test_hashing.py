"""Hashing files while they are written: right answers, and no answer rather than a wrong one."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

from mlx_integrations.models.hub.hashing import DownloadHasher, FinishedFilesHasher


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _write_slowly(path: Path, data: bytes, pieces: int = 8) -> None:
    step = max(1, len(data) // pieces)
    with open(path, "wb") as fh:
        for i in range(0, len(data), step):
            fh.write(data[i : i + step])
            fh.flush()
            time.sleep(0.01)


def test_a_file_is_hashed_while_it_grows_and_found_after_its_rename(tmp_path):
    data = os.urandom(3 << 20)
    blobs = tmp_path / "blobs"
    with DownloadHasher(blobs) as hasher:
        blobs.mkdir()  # the folder may appear only once the download starts
        partial = blobs / "abc.1234.incomplete"
        _write_slowly(partial, data)
        partial.rename(blobs / "abc")
    got = hasher.result_for(blobs / "abc")
    assert got is not None
    assert (got.sha256, got.size) == (_sha(data), len(data))


def test_a_transfer_that_starts_over_is_hashed_from_its_new_start(tmp_path):
    first, final = os.urandom(1 << 20), os.urandom(2 << 20)
    partial = tmp_path / "blob.1.incomplete"
    with DownloadHasher(tmp_path) as hasher:
        fh = open(partial, "wb")
        fh.write(first)
        fh.flush()
        # Let the hasher read the first attempt, then truncate as a restarted transfer does.
        time.sleep(0.2)
        fh.seek(0)
        fh.truncate()
        time.sleep(0.2)
        fh.write(final)
        fh.close()
        partial.rename(tmp_path / "blob")
    got = hasher.result_for(tmp_path / "blob")
    assert got is not None and got.sha256 == _sha(final)


def test_a_file_that_never_completes_gives_no_result(tmp_path):
    partial = tmp_path / "blob.2.incomplete"
    with DownloadHasher(tmp_path) as hasher:
        partial.write_bytes(b"half a file")
        time.sleep(0.05)
        partial.unlink()  # the download failed and removed its temporary file
        (tmp_path / "blob").write_bytes(b"another file entirely")
    assert hasher.result_for(tmp_path / "blob") is None
    assert hasher.result_for(tmp_path / "missing") is None


def test_finished_files_are_hashed_after_the_marker_and_survive_a_rename(tmp_path):
    out = tmp_path / "out"
    shards = {"model-1.safetensors": os.urandom(1 << 20), "model-2.safetensors": b"x" * 1000}
    with FinishedFilesHasher(out, "index.json", lambda n: n.endswith(".safetensors")) as hasher:
        out.mkdir()
        for name, data in shards.items():
            (out / name).write_bytes(data)
        (out / "index.json").write_text("{}")
        (out / "config.json").write_text("{}")
        _wait_until(lambda: all(hasher.result_for(out / n) for n in shards))
    moved = tmp_path / "moved"
    os.rename(out, moved)
    entries = hasher.entries(moved, [*shards, "config.json"])
    assert {k: v.sha256 for k, v in entries.items()} == {k: _sha(v) for k, v in shards.items()}


def test_a_file_changed_after_it_was_hashed_is_not_trusted(tmp_path):
    with FinishedFilesHasher(tmp_path, "done", lambda n: n == "w.bin") as hasher:
        (tmp_path / "w.bin").write_bytes(b"before")
        (tmp_path / "done").write_text("")
        _wait_until(lambda: hasher.result_for(tmp_path / "w.bin") is not None)
    time.sleep(0.02)
    (tmp_path / "w.bin").write_bytes(b"after!")  # same size, new bytes
    os.utime(tmp_path / "w.bin", ns=(time.time_ns(), time.time_ns() + 10**9))
    assert hasher.result_for(tmp_path / "w.bin") is None


def test_without_the_marker_nothing_is_hashed_and_stop_returns(tmp_path):
    (tmp_path / "w.bin").write_bytes(b"data")
    hasher = FinishedFilesHasher(tmp_path, "never", lambda n: True)
    with hasher:
        pass
    assert hasher.result_for(tmp_path / "w.bin") is None


def test_stop_waits_for_the_background_thread(tmp_path):
    before = threading.active_count()
    with DownloadHasher(tmp_path):
        (tmp_path / "a.incomplete").write_bytes(b"a")
    assert threading.active_count() == before


def test_partial_files_of_earlier_downloads_are_not_hashed(tmp_path):
    (tmp_path / "old.1.incomplete").write_bytes(os.urandom(1 << 20))  # a killed pull's
    with DownloadHasher(tmp_path) as hasher:
        time.sleep(0.05)
        (tmp_path / "old.1.incomplete").rename(tmp_path / "old")
    assert hasher.result_for(tmp_path / "old") is None


def test_a_new_file_on_a_reused_inode_is_not_taken_for_the_old_one(tmp_path):
    with DownloadHasher(tmp_path) as hasher:
        partial = tmp_path / "a.1.incomplete"
        partial.write_bytes(b"A" * 4096)
        time.sleep(0.05)
        partial.unlink()  # failed download; its inode is free again
        time.sleep(0.05)
    new = tmp_path / "b"
    new.write_bytes(b"B" * 4096)  # same size, likely the same inode
    os.utime(new, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert hasher.result_for(new) is None


def test_an_error_in_the_with_block_stops_hashing_at_once(tmp_path):
    (tmp_path / "w.bin").write_bytes(os.urandom(8 << 20))
    hasher = FinishedFilesHasher(tmp_path, "done", lambda n: n == "w.bin")
    try:
        with hasher:
            (tmp_path / "done").write_text("")
            raise RuntimeError("disk full")
    except RuntimeError:
        pass
    assert not hasher._thread.is_alive()


def test_a_resumed_partial_file_is_hashed_from_its_first_byte_when_followed(tmp_path):
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    head, tail = os.urandom(1 << 20), os.urandom(3 << 20)
    partial = blobs / ("a" * 64 + ".incomplete")
    partial.write_bytes(head)  # kept by an interrupted pull
    with DownloadHasher(blobs) as hasher:
        hasher.follow(partial)
        with open(partial, "ab") as fh:  # the resumed transfer appends the rest
            for i in range(0, len(tail), 1 << 19):
                fh.write(tail[i : i + (1 << 19)])
                fh.flush()
                time.sleep(0.01)
        _wait_until(lambda: hasher.partial_files() == [partial])
        partial.rename(blobs / ("a" * 64))
    got = hasher.result_for(blobs / ("a" * 64))
    assert got is not None and got.sha256 == _sha(head + tail) and got.size == len(head + tail)
