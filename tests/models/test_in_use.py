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
from mlx_integrations.models import ModelInUseError, ModelStore, import_model, show_model

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
            store.remove("tiny")
        assert "--force" in (info.value.hint or "")
        assert store.contains("tiny")
        out = await engine.generate("Hello", max_tokens=3, temperature=0.0)
        assert out.completion_tokens > 0  # the refused removal changed nothing
    finally:
        await engine.stop()
    assert store.users("tiny") == ()
    assert store.remove("tiny").kind == "model"


def test_a_model_held_by_another_process_is_kept_until_forced(store, tiny_llama):
    import_model(tiny_llama, "tiny", store=store)
    store.tag("tiny", "fast")
    proc = _holder(store, "tiny")
    try:
        assert store.users("fast") == (proc.pid,)
        with pytest.raises(ModelInUseError) as info:
            store.remove("tiny")
        assert info.value.pids == (proc.pid,)
        assert store.remove("fast").kind == "alias"  # an alias is only a name
        dry = store.remove("tiny", dry_run=True, force=True)
        assert dry.in_use_by == (proc.pid,) and store.contains("tiny")
        removed = store.remove("tiny", force=True)
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
    report = store.prune(dry_run=True, hf_cache_dir="")
    assert [i.kind for i in report.items] == ["stale_lease"]
    assert store.users("tiny") == ()
    assert store.remove("tiny").kind == "model"
    assert list((store.home / "in-use").iterdir()) == []


def test_lease_names_do_not_mix_up_models_with_similar_names(store, tiny_llama):
    import_model(tiny_llama, "tiny", store=store)
    import_model(tiny_llama, "tiny.v2", store=store)
    with store.lease("tiny.v2"):
        assert store.users("tiny") == ()
        assert store.remove("tiny").kind == "model"
        with pytest.raises(ModelInUseError):
            store.remove("tiny.v2")
    assert store.remove("tiny.v2").kind == "model"


def test_a_folder_outside_the_store_is_not_claimed(tiny_llama, tmp_path):
    from mlx_integrations.models import lease_model_folder

    assert lease_model_folder(tiny_llama) is None


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
        forced = CliRunner().invoke(app, ["rm", "tiny", "--yes", "--force"])
        assert forced.exit_code == 0, forced.stderr
        assert f"still loaded by process {proc.pid}" in forced.stdout
        assert not store.contains("tiny")
    finally:
        proc.kill()
        proc.wait()
