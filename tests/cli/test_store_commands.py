"""Store commands given input they cannot use: each is refused, naming it, before any
work, and the store keeps only what was asked for (real commands on tiny models)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlx_integrations.cli.main import app
from typer.testing import CliRunner

from tests.support.fake_hub import FakeHub


@pytest.fixture
def hub():
    with FakeHub() as server:
        yield server


def mlxi(*args: str):
    return CliRunner().invoke(app, list(args))


def names() -> list[str]:
    listed = mlxi("list", "--json")
    assert listed.exit_code == 0, listed.stderr
    return [m["name"] for m in json.loads(listed.stdout)]


def test_quantizing_a_quantized_model_is_refused_naming_its_original(env, tiny_llama):
    assert mlxi("import", str(tiny_llama), "tiny").exit_code == 0
    assert mlxi("quantize", "tiny", "tiny-q8", "--bits", "8").exit_code == 0
    again = mlxi("quantize", "tiny-q8", "--bits", "4")
    # mlx-lm would copy the 8-bit layers as they are, under a name and manifest saying 4.
    assert again.exit_code == 1
    assert "'tiny-q8' is already quantized (8 bits, group 64, affine)" in again.stderr
    assert "mlxi quantize tiny --bits N" in again.stderr
    assert names() == ["tiny", "tiny-q8"]


def test_import_q_bits_quantizes_the_folder_not_a_store_model_of_that_name(
    env, tiny_llama, tiny_qwen2, tmp_path, monkeypatch
):
    assert mlxi("import", str(tiny_llama), "model").exit_code == 0
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_qwen2, tmp_path / "model")  # ./model, a Qwen2
    result = mlxi("import", "model", "model-q4", "--q-bits", "4", "--dtype", "float16")
    assert result.exit_code == 0, result.stderr
    shown = json.loads(mlxi("show", "model-q4", "--json").stdout)
    assert shown["architecture"] == "qwen2"
    assert shown["dtype"] == "float16" and shown["quantization"]["bits"] == 4
    assert shown["source"]["base"] == str(tmp_path / "model")


def test_quantizing_a_gguf_file_leaves_no_unquantized_copy_in_the_store(env, tmp_path):
    from tests.models.test_gguf_import import write_tiny_gguf
    from tests.support.tiny_models import train_tokenizer

    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf, train_tokenizer())
    result = mlxi("import", str(gguf), "tiny-q4", "--q-bits", "4")
    assert result.exit_code == 0, result.stderr
    result = mlxi("quantize", str(gguf), "tiny-q8", "--bits", "8")
    assert result.exit_code == 0, result.stderr
    assert names() == ["tiny-q4", "tiny-q8"]
    models = Path(env["MLXI_HOME"]) / "models"
    assert sorted(p.name for p in models.iterdir()) == ["tiny-q4", "tiny-q8"]
    assert not list(models.rglob("gguf-source"))
    shown = json.loads(mlxi("show", "tiny-q4", "--json").stdout)
    assert shown["source"]["path"] == str(gguf) and shown["quantization"]["bits"] == 4
    assert mlxi("verify").exit_code == 0


def test_pull_checks_quantize_bits_before_downloading(hub, env, tiny_llama):
    hub.add_repo("org/tiny", tiny_llama)
    result = mlxi("pull", "org/tiny", "--quantize", "7")
    assert result.exit_code == 2
    assert "bits=7 is not possible" in result.stderr
    assert hub.requests == [] and names() == []


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--q-group-size", "32"], "--q-group-size has no effect without --q-bits"),
        (["--q-mode", "mxfp4"], "--q-mode has no effect without --q-bits"),
        (["--dtype", "float16"], "--dtype applies to a .gguf file"),
    ],
)
def test_import_refuses_options_that_would_do_nothing(env, tiny_llama, options, named):
    result = mlxi("import", str(tiny_llama), "tiny", *options)
    assert result.exit_code == 2
    assert named in result.stderr
    assert names() == []


def test_import_refuses_a_cut_short_weights_file(env, tiny_llama, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama, broken)
    weights = broken / "model.safetensors"
    os.truncate(weights, weights.stat().st_size - 100)
    result = mlxi("import", str(broken), "broken")
    assert result.exit_code == 1
    assert f"{weights} is not a whole safetensors file" in result.stderr
    assert "of the" in result.stderr and names() == []


def test_rm_purge_after_rm_deletes_what_the_hf_cache_kept(hub, env, tiny_llama):
    hub.add_repo("org/tiny", tiny_llama)
    assert mlxi("pull", "org/tiny").exit_code == 0
    repo = Path(env["HF_HUB_CACHE"]) / "models--org--tiny"
    removed = mlxi("rm", "org/tiny")
    assert removed.exit_code == 0
    assert "mlxi rm org/tiny --purge deletes it" in removed.stdout
    plain = mlxi("rm", "org/tiny")
    assert plain.exit_code == 1 and "mlxi rm org/tiny --purge" in plain.stderr
    assert list((repo / "snapshots").iterdir())
    purged = mlxi("rm", "org/tiny", "--purge")
    assert purged.exit_code == 0, purged.stderr
    assert "of org/tiny from the Hugging Face cache" in purged.stdout
    assert not (repo / "snapshots").exists() or not list((repo / "snapshots").iterdir())
    again = mlxi("rm", "org/tiny", "--purge")
    assert again.exit_code == 1 and "See what is there: mlxi list" in again.stderr


def test_rm_purge_of_an_unstored_repo_keeps_revisions_a_stored_model_uses(hub, env, tiny_llama):
    sha = hub.add_repo("org/tiny", tiny_llama)
    assert mlxi("pull", "org/tiny", "--name", "kept").exit_code == 0
    result = mlxi("rm", "org/tiny", "--purge")
    assert result.exit_code == 1
    snapshot = Path(env["HF_HUB_CACHE"]) / "models--org--tiny" / "snapshots" / sha
    assert snapshot.is_dir()
    assert mlxi("run", "kept", "Hi", "--max-tokens", "2").exit_code == 0


def test_verify_names_the_failing_model_in_its_hint(env, tiny_llama):
    for name in ("a", "b"):
        assert mlxi("import", str(tiny_llama), name).exit_code == 0
    with (Path(env["MLXI_HOME"]) / "models" / "b" / "config.json").open("a") as f:
        f.write(" ")
    result = mlxi("verify")
    assert result.exit_code == 1
    assert "Hint:" in result.stderr and result.stderr.rstrip().endswith("mlxi rm b")


def test_warm_with_nothing_to_do_is_a_usage_error(env, tiny_llama):
    assert mlxi("import", str(tiny_llama), "tiny").exit_code == 0
    result = mlxi("warm", "tiny", "--no-weights")
    assert result.exit_code == 2 and "nothing to warm" in result.stderr


def test_a_closed_stdout_ends_the_command_quietly(env, tiny_llama):
    for name in ("a", "b"):
        assert mlxi("import", str(tiny_llama), name).exit_code == 0
    exe = Path(sys.executable).with_name("mlxi")
    proc = subprocess.Popen(
        [str(exe), "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    proc.stdout.close()  # the reader is gone before the first line is written (`| head`)
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141
    assert err == ""


def test_pull_update_keeps_a_model_whose_branch_did_not_move(hub, env, tiny_llama, tiny_qwen2):
    hub.add_repo("org/tiny", tiny_llama)
    first = json.loads(mlxi("pull", "org/tiny", "--json").stdout)
    same = mlxi("pull", "org/tiny", "--update", "--json")
    assert same.exit_code == 0, same.stderr
    kept = json.loads(same.stdout)
    assert kept["downloaded"] is False and kept["modified"] == first["modified"]
    assert "org/tiny is up to date" in mlxi("pull", "org/tiny", "--update").stdout
    moved = hub.add_repo("org/tiny", tiny_qwen2)
    updated = json.loads(mlxi("pull", "org/tiny", "--update", "--json").stdout)
    assert updated["downloaded"] is True and updated["commit"] == moved


def test_show_of_a_folder_that_is_no_model_says_what_to_pass(env, tmp_path):
    (tmp_path / "notes").mkdir()
    result = mlxi("show", str(tmp_path / "notes"))
    assert result.exit_code == 1
    assert "has no readable config.json" in result.stderr
    assert "Pass a model folder (config.json + *.safetensors) or a .gguf file." in result.stderr


def test_prune_with_nothing_to_remove_is_no_dry_run(env):
    result = mlxi("prune", "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {"dry_run": False, "freed_bytes": 0, "items": []}
    assert mlxi("prune").stdout == "0 items, freed 0 B\n"


def test_a_model_with_a_damaged_manifest_is_named_by_list_and_removed_by_rm(env, tiny_llama):
    for name in ("good", "bad"):
        assert mlxi("import", str(tiny_llama), name).exit_code == 0
    assert mlxi("tag", "bad", "bad-alias").exit_code == 0
    folder = Path(env["MLXI_HOME"]) / "models" / "bad"
    (folder / "mlxi-manifest.json").write_text('{"x": 1}')
    shown = mlxi("show", "bad")
    assert shown.exit_code == 1 and "damaged: it lacks 'name'" in shown.stderr
    assert "mlxi rm bad" in shown.stderr
    listed = mlxi("list", "--json")
    assert [m["name"] for m in json.loads(listed.stdout)] == ["good"]
    assert "the manifest of 'bad' is damaged; mlxi rm bad removes it" in listed.stderr
    removed = mlxi("rm", "bad")
    assert removed.exit_code == 0, removed.stderr
    assert "deleted 'bad'" in removed.stdout and "aliases bad-alias" in removed.stdout
    assert not folder.exists() and names() == ["good"]
    assert "damaged" not in mlxi("list").stderr
