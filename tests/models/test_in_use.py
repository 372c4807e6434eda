"""A model that a process has loaded is not removed from under it (unless forced)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlx_integrations.cli.main import app
from typer.testing import CliRunner

from mlx_integrations.engine import SimpleEngine
from mlx_integrations.models import (
    ModelInUseError,
    ModelStore,
    import_model,
    prune,
    remove_model,
    show_model,
)

_HOLDER = textwrap.dedent(
    """
    import sys
    from mlx_integrations.models import ModelStore
    lease = ModelStore(sys.argv[1]).lease(sys.argv[2])
    print("held", flush=True)
    sys.stdin.read()
    """
)


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "mlxi")


def _holder(store: ModelStore, name: str) -> subprocess.Popen[str]:
    """Another process that holds ``name`` until its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(store.home), name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


async def test_an_engine_holds_its_store_model_until_it_stops(store, tiny_llama):
    import_model(tiny_llama, "tiny", store=store)
    engine = SimpleEngine(store.get("tiny").path)
    await engine.start()
    try:
        assert store.users("tiny") == (os.getpid(),)
        assert show_model("tiny", store=store).in_use_by == (os.getpid(),)
        with pytest.raises(ModelInUseError, match=rf"in use by process {os.getpid()}") as info:
            remove_model("tiny", store=store)
        assert "--force" in (info.value.hint or "")
        assert store.contains("tiny")
        out = await engine.generate("Hello", max_tokens=3, temperature=0.0)
        assert out.completion_tokens > 0  # the refused removal changed nothing
    finally:
        await engine.stop()
    assert store.users("tiny") == ()
    assert remove_model("tiny", store=store).kind == "model"


def test_a_model_held_by_another_process_is_kept_until_forced(store, tiny_llama):
    import_model(tiny_llama, "tiny", store=store)
    store.tag("tiny", "fast")
    proc = _holder(store, "tiny")
    try:
        assert store.users("fast") == (proc.pid,)
        with pytest.raises(ModelInUseError) as info:
            remove_model("tiny", store=store)
        assert info.value.pids == (proc.pid,)
        assert remove_model("fast", store=store).kind == "alias"  # an alias is only a name
        dry = remove_model("tiny", dry_run=True, force=True, store=store)
        assert dry.in_use_by == (proc.pid,) and store.contains("tiny")
        removed = remove_model("tiny", force=True, store=store)
        assert removed.in_use_by == (proc.pid,) and not store.contains("tiny")
    finally:
        proc.kill()
        proc.wait()


def test_a_holder_that_died_does_not_block_removal(store, tiny_llama):
    import_model(tiny_llama, "tiny", store=store)
    proc = _holder(store, "tiny")
    proc.kill()  # no chance to clean up: the system drops its lock
    proc.wait()
    leases = list((store.home / "in-use").iterdir())
    assert len(leases) == 1
    report = prune(dry_run=True, hf_cache_dir="", store=store)
    assert [i.kind for i in report.items] == ["stale_lease"]
    assert store.users("tiny") == ()
    assert remove_model("tiny", store=store).kind == "model"
    assert list((store.home / "in-use").iterdir()) == []


def test_lease_names_do_not_mix_up_models_with_similar_names(store, tiny_llama):
    import_model(tiny_llama, "tiny", store=store)
    import_model(tiny_llama, "tiny.v2", store=store)
    with store.lease("tiny.v2"):
        assert store.users("tiny") == ()
        assert remove_model("tiny", store=store).kind == "model"
        with pytest.raises(ModelInUseError):
            remove_model("tiny.v2", store=store)
    assert remove_model("tiny.v2", store=store).kind == "model"


def test_a_folder_outside_the_store_is_not_claimed(store, tiny_llama, tmp_path):
    import shutil

    from mlx_integrations.models import lease_model_folder

    assert lease_model_folder(tiny_llama) is None
    # A models/<x>/ folder with a manifest, copied out of a store, is still not one.
    model = import_model(tiny_llama, "tiny", store=store)
    lookalike = tmp_path / "elsewhere" / "models" / "tiny"
    shutil.copytree(model.path, lookalike)
    assert lease_model_folder(lookalike) is None
    assert not (lookalike.parent.parent / "in-use").exists()
    with lease_model_folder(model.path) as lease:  # the real one is claimed
        assert lease is not None and store.users("tiny") == (os.getpid(),)


def test_cli_rm_refuses_a_model_in_use_and_force_removes_it(
    store, tiny_llama, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("MLXI_HOME", str(store.home))
    import_model(tiny_llama, "tiny", store=store)
    proc = _holder(store, "tiny")
    try:
        refused = CliRunner().invoke(app, ["rm", "tiny", "--yes"])
        assert refused.exit_code == 1
        assert f"in use by process {proc.pid}" in refused.stderr
        assert "mlxi rm tiny --force" in refused.stderr
        assert store.contains("tiny")
        shown = json.loads(CliRunner().invoke(app, ["show", "tiny", "--json"]).stdout)
        assert shown["in_use_by"] == [proc.pid]
        [loaded] = json.loads(CliRunner().invoke(app, ["ps", "--json"]).stdout)
        assert loaded["name"] == "tiny" and loaded["pids"] == [proc.pid]
        table = CliRunner().invoke(app, ["ps"]).stdout.splitlines()
        assert table[0].split() == [
            "NAME", "ID", "SIZE", "PROCESS", "MEMORY", "LAST", "USED", "UNTIL"
        ]  # fmt: skip
        # A lease with no details (a bare claim, as earlier versions wrote) reads as "-".
        row = table[1].split()
        assert row[0] == "tiny" and row[-4:] == [str(proc.pid), "-", "-", "-"]
        forced = CliRunner().invoke(app, ["rm", "tiny", "--yes", "--force"])
        assert forced.exit_code == 0, forced.stderr
        assert f"still loaded by process {proc.pid}" in forced.stdout
        assert not store.contains("tiny")
        assert json.loads(CliRunner().invoke(app, ["ps", "--json"]).stdout) == []
    finally:
        proc.kill()
        proc.wait()


def test_a_store_that_cannot_record_leases_still_serves_its_models(
    store, tiny_llama, caplog: pytest.LogCaptureFixture
):
    import asyncio

    import_model(tiny_llama, "tiny", store=store)
    (store.home / "in-use").write_text("not a folder")  # lease files cannot be made
    engine = SimpleEngine(store.get("tiny").path)

    async def run() -> int:
        await engine.start()
        try:
            out = await engine.generate("Hello", max_tokens=3, temperature=0.0)
            return out.completion_tokens
        finally:
            await engine.stop()

    with caplog.at_level("WARNING"):
        assert asyncio.run(run()) > 0
    assert "Cannot mark" in caplog.text and "in use" in caplog.text
    assert store.users("tiny") == ()
    assert show_model("tiny", store=store).in_use_by == ()


def test_a_forked_child_leaves_its_parents_lease_alone(store, tiny_llama):
    import_model(tiny_llama, "tiny", store=store)
    lease = store.lease("tiny")
    lease._pid = -1  # as if this process were a fork of the one that took it
    lease.release()
    assert lease.path.exists()  # the parent's claim file stays
    lease.path.unlink()


def test_replacing_a_model_in_use_is_refused(store, tiny_llama, tiny_qwen2):
    import_model(tiny_llama, "tiny", store=store)
    before = store.get("tiny").manifest.digest
    with store.lease("tiny"):
        with pytest.raises(ModelInUseError, match="was not replaced"):
            import_model(tiny_qwen2, "tiny", store=store, overwrite=True)
        assert store.get("tiny").manifest.digest == before
    assert import_model(tiny_qwen2, "tiny", store=store, overwrite=True).manifest.digest != before


def test_a_model_made_again_under_a_removed_name_is_not_held_by_old_users(store, tiny_llama):
    import_model(tiny_llama, "tiny", store=store)
    proc = _holder(store, "tiny")
    try:
        assert remove_model("tiny", force=True, store=store).in_use_by == (proc.pid,)
        import_model(tiny_llama, "tiny", store=store)
        assert store.users("tiny") == ()
        assert remove_model("tiny", store=store).kind == "model"
    finally:
        proc.kill()
        proc.wait()


def test_dry_run_reports_a_model_in_use_without_failing(store, tiny_llama):
    import_model(tiny_llama, "tiny", store=store)
    with store.lease("tiny"):
        dry = remove_model("tiny", dry_run=True, store=store)
        assert dry.dry_run and dry.in_use_by == (os.getpid(),)
        assert store.contains("tiny")


def test_the_store_lock_can_be_taken_inside_itself(store, tiny_llama):
    import_model(tiny_llama, "tiny", store=store)
    with store.lock(), store.lock():
        assert store.users("tiny") == ()  # takes the lock once more
        with store.lease("tiny"):
            assert store.users("tiny") == (os.getpid(),)
    with store.lease("tiny"):  # and it was given back
        assert store.users("tiny") == (os.getpid(),)


def test_a_model_reached_through_a_symlink_is_claimed(store, tiny_llama, tmp_path):
    import asyncio

    from mlx_integrations.models import lease_model_folder

    model = import_model(tiny_llama, "tiny", store=store)
    link = tmp_path / "my-model"
    link.symlink_to(model.path, target_is_directory=True)
    with lease_model_folder(link) as lease:
        assert lease is not None and store.users("tiny") == (os.getpid(),)
        with pytest.raises(ModelInUseError):
            remove_model("tiny", store=store)
    assert store.users("tiny") == ()

    engine = SimpleEngine(link)

    async def users_while_loaded() -> tuple[int, ...]:
        await engine.start()
        try:
            return store.users("tiny")
        finally:
            await engine.stop()

    assert asyncio.run(users_while_loaded()) == (os.getpid(),)
    assert remove_model("tiny", store=store).kind == "model"


async def test_ps_shows_what_a_process_holds_and_until_when(
    store, tiny_llama, monkeypatch: pytest.MonkeyPatch
):
    """The lease says memory, last use and expiry; `mlxi ps` reads it from any process."""
    import time

    monkeypatch.setenv("MLXI_HOME", str(store.home))
    import_model(tiny_llama, "tiny", store=store)
    engine = SimpleEngine(store.get("tiny").path, keep_alive="5m")
    await engine.generate("Hello", max_tokens=2, temperature=0.0)
    try:
        # Reports are at most one a second: the idle one after the request comes soon.
        deadline = time.monotonic() + 30
        while store.loaded()[0][1][os.getpid()].get("in_use"):
            assert time.monotonic() < deadline, "the idle state was never reported"
            time.sleep(0.05)
        [(model, procs)] = store.loaded()
        details = procs[os.getpid()]
        assert model.name == "tiny" and details["state"] == "loaded"
        assert details["memory_bytes"] >= details["weights_bytes"] > 0
        assert details["keep_alive_s"] == 300 and not details["pinned"]
        assert time.time() < details["expires_at"] <= time.time() + 300
        [shown] = json.loads(CliRunner().invoke(app, ["ps", "--json"]).stdout)
        [proc] = shown["processes"]
        assert proc["pid"] == os.getpid() and proc["keep_alive_s"] == 300
        row = CliRunner().invoke(app, ["ps"]).stdout.splitlines()[1]
        assert row.split()[0] == "tiny" and str(os.getpid()) in row.split()
        assert row.rstrip().endswith(("4 minutes from now", "5 minutes from now")), row
        # Idle past its keep-alive, the model is unloaded and leaves the list.
        engine.keep_alive = 0
        from mlx_integrations.runtime.residency import wake

        assert wake(wait=30) and not engine.is_loaded
        assert store.loaded() == []
    finally:
        await engine.stop()
