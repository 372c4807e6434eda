"""The mlxi command through Typer's CliRunner, against a loopback Hub."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlx_integrations.cli.main import app
from typer.testing import CliRunner

from tests.support.fake_hub import FakeHub

SUMMARY_KEYS = {
    "name",
    "id",
    "size",
    "modified",
    "source",
    "repo_id",
    "commit",
    "quantization",
    "aliases",
    "path",
    "quality",
}


@pytest.fixture
def hub():
    with FakeHub() as server:
        yield server


def mlxi(*args: str):
    return CliRunner().invoke(app, list(args))


def ok_json(*args: str):
    result = mlxi(*args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_pull_list_show_verify_json(hub, env, tiny_llama):
    sha = hub.add_repo("org/tiny", tiny_llama)
    pulled = ok_json("pull", "org/tiny")
    assert set(pulled) == SUMMARY_KEYS | {"downloaded", "kind"}
    assert pulled["downloaded"] is True and pulled["commit"] == sha and pulled["kind"] == "chat"
    assert pulled["source"] == "hub" and pulled["repo_id"] == "org/tiny"

    before = len(hub.requests)
    again = ok_json("pull", "org/tiny")
    assert again["downloaded"] is False and hub.requests_since(before) == []

    listed = ok_json("list")
    assert [m["name"] for m in listed] == ["org/tiny"] and set(listed[0]) == SUMMARY_KEYS
    assert ok_json("ls") == listed

    shown = ok_json("show", "org/tiny")
    assert shown["architecture"] == "llama" and shown["template_takes_tools"] is True
    assert shown["source"]["commit"] == sha
    assert {f["path"] for f in shown["files"]} >= {"config.json", "model.safetensors"}
    assert all(len(f["sha256"]) == 64 for f in shown["files"])
    folder = CliRunner().invoke(app, ["show", "org/tiny", "--path"])
    assert folder.exit_code == 0 and folder.stdout.strip() == shown["path"]
    assert (Path(shown["path"]) / "config.json").is_file()

    [report] = ok_json("verify", "org/tiny")
    assert report["ok"] is True and {f["status"] for f in report["files"]} == {"ok"}

    text = mlxi("list")
    assert text.exit_code == 0
    assert text.stdout.splitlines()[0].split() == [
        "NAME",
        "ID",
        "SIZE",
        "WEIGHTS",
        "SOURCE",
        "MODIFIED",
    ]


def test_verify_fails_on_a_corrupted_file(env, tiny_llama):
    assert mlxi("import", str(tiny_llama), "tiny").exit_code == 0
    weights = Path(env["MLXI_HOME"]) / "models" / "tiny" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0x01
    weights.write_bytes(bytes(data))
    result = mlxi("verify", "tiny", "--json")
    assert result.exit_code == 1
    [report] = json.loads(result.stdout)
    assert report["ok"] is False
    assert {f["path"]: f["status"] for f in report["files"]}["model.safetensors"] == (
        "sha256_mismatch"
    )
    assert result.stderr.startswith("Error:") and "Hint:" in result.stderr


def test_tag_rm_dry_run_and_rm(env, tiny_llama):
    assert mlxi("import", str(tiny_llama), "tiny").exit_code == 0
    tagged = ok_json("tag", "tiny", "fast")
    assert tagged["aliases"] == ["fast"]

    dry = ok_json("rm", "tiny", "--dry-run")
    assert dry[0]["dry_run"] is True and dry[0]["freed_bytes"] > 0
    assert ok_json("show", "fast")["name"] == "tiny"

    # stdin is not a TTY under CliRunner: no prompt, removal goes ahead.
    [removed] = ok_json("rm", "tiny")
    assert removed["kind"] == "model" and removed["aliases_removed"] == ["fast"]
    assert ok_json("list") == []
    missing = mlxi("rm", "tiny")
    assert missing.exit_code == 1 and "not in the store" in missing.stderr


def test_rm_keeps_the_hf_cache_unless_purged_and_never_purges_shared_files(hub, env, tiny_llama):
    hub.add_repo("org/tiny", tiny_llama)
    assert mlxi("pull", "org/tiny").exit_code == 0
    assert mlxi("pull", "org/tiny", "--name", "copy").exit_code == 0
    snapshots = Path(env["HF_HUB_CACHE"]) / "models--org--tiny" / "snapshots"
    blob_bytes = sum(
        p.stat().st_size for p in (snapshots.parent / "blobs").iterdir() if p.is_file()
    )

    kept = mlxi("rm", "copy", "--dry-run")
    assert kept.exit_code == 0
    assert "stays in the Hugging Face cache" in kept.stdout and "--purge" in kept.stdout

    [shared] = ok_json("rm", "copy", "--purge")
    assert (
        shared["hf_cache_freed"] == 0 and "org/tiny uses the same files" in shared["hf_cache_note"]
    )
    assert shared["hf_cache_bytes"] == blob_bytes
    assert any(snapshots.iterdir())

    [dry] = ok_json("rm", "org/tiny", "--purge", "--dry-run")
    assert dry["hf_cache_freed"] == blob_bytes and any(snapshots.iterdir())
    purged = mlxi("rm", "org/tiny", "--purge")
    assert purged.exit_code == 0, purged.stderr
    assert "from the Hugging Face cache" in purged.stdout
    assert not snapshots.exists() or not any(snapshots.iterdir())
    assert not (snapshots.parent / "blobs").exists() or not any(
        (snapshots.parent / "blobs").iterdir()
    )


def test_errors_are_one_line_with_a_hint_and_traceback_only_in_debug(hub, env, monkeypatch):
    result = mlxi("pull", "org/nope", "--token", "hf_SECRET_VALUE_42")
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("Error: Repository org/nope was not found")
    assert lines[1].startswith("Hint:")
    assert "Traceback" not in result.stderr and "hf_SECRET_VALUE_42" not in result.stderr

    monkeypatch.setenv("MLXI_DEBUG", "1")
    debug = mlxi("pull", "org/nope")
    assert debug.exit_code == 1 and "Traceback" in debug.stderr


def test_usage_errors_exit_2(env, tiny_llama):
    assert mlxi("pull", "../../etc").exit_code == 2
    assert mlxi("import", str(tiny_llama), "../evil").exit_code == 2
    assert mlxi("quantize", str(tiny_llama), "q", "--bits", "7").exit_code == 2
    assert mlxi("list", "--no-such-flag").exit_code == 2


def test_quantize_warm_and_run(env, tiny_llama, tmp_path):
    assert mlxi("import", str(tiny_llama), "tiny").exit_code == 0
    quantized = ok_json("quantize", "tiny", "--bits", "4", "--group-size", "32")
    assert quantized["name"] == "tiny-q4"
    assert quantized["quantization"] == {
        "bits": 4,
        "group_size": 32,
        "mode": "affine",
        "recipe": None,
    }

    tools = tmp_path / "tools.json"
    tools.write_text(
        json.dumps(
            [
                {
                    "name": "get_weather",
                    "description": "Weather",
                    "parameters": {"type": "object", "properties": {}},
                }
            ]
        )
    )
    warmed = ok_json("warm", "tiny-q4", "--system", "Be brief.", "--tools", str(tools))
    assert warmed["weights_bytes"] > 0
    assert warmed["cache"]["name"] == "default" and warmed["cache"]["tokens"] > 10
    assert ok_json("show", "tiny-q4")["warm_caches"] == ["default"]

    answer = mlxi("run", "tiny-q4", "Hello", "--max-tokens", "5", "--temperature", "0")
    assert answer.exit_code == 0, answer.stderr
    assert answer.stdout.endswith("\n") and len(answer.stdout) > 1


def test_prune_dry_run_json(env, tiny_llama):
    assert mlxi("import", str(tiny_llama), "tiny").exit_code == 0
    orphan = Path(env["MLXI_HOME"]) / "models" / "leftover"
    orphan.mkdir()
    dry = ok_json("prune", "--dry-run")
    assert dry["dry_run"] is True
    assert [i["kind"] for i in dry["items"]] == ["orphan_folder"]
    assert orphan.exists()
    done = ok_json("prune", "--yes")
    assert done["dry_run"] is False and not orphan.exists()
    assert [m["name"] for m in ok_json("list")] == ["tiny"]


def test_help_imports_no_heavy_module():
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from mlx_integrations.cli.main import app\n"
        "r = CliRunner().invoke(app, ['--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "heavy = [m for m in ('mlx.core', 'mlx_lm', 'huggingface_hub', 'transformers', "
        "'torch') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_python_dash_m_runs_the_command(env):
    """Where no ``mlxi`` script is on the PATH (a --target install), ``python -m`` runs it."""
    args = [sys.executable, "-m", "mlx_integrations.cli", "doctor", "--json"]
    out = subprocess.run(args, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["store"] == env["MLXI_HOME"]


def test_version_and_doctor(env):
    assert mlxi("--version").stdout.startswith("mlxi ")
    doctor = ok_json("doctor")
    assert doctor["store"] == env["MLXI_HOME"] and doctor["backend"] in {"cpu", "metal", "cuda"}


def test_run_names_a_lone_surrogate_in_the_prompt(env, tiny_llama):
    # A byte that is not UTF-8 on the command line reaches Python as a lone surrogate.
    assert mlxi("import", str(tiny_llama), "tiny").exit_code == 0
    result = mlxi("run", "tiny", "caf\udce9", "--max-tokens", "2")
    assert result.exit_code == 2
    assert "lone surrogate '\\udce9' at character 3" in result.stderr
    assert "--help" not in result.stderr


def test_run_with_tools_prints_forced_calls_as_json_lines(env, tiny_llama, tmp_path):
    assert mlxi("import", str(tiny_llama), "tiny").exit_code == 0
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
    }
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"name": "get_weather", "parameters": schema}]))
    result = mlxi(
        "run",
        "tiny",
        "Weather in Paris?",
        "--tools",
        str(tools),
        "--tool-choice",
        "required",
        "--max-tokens",
        "60",
        "--temperature",
        "0",
    )
    assert result.exit_code == 0, result.stderr
    call = json.loads(result.stdout.strip().splitlines()[-1])
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    import jsonschema

    jsonschema.validate(call["arguments"], schema)
    # A choice naming no bound tool is refused before the model loads.
    bad = mlxi("run", "tiny", "hi", "--tools", str(tools), "--tool-choice", "nope")
    assert bad.exit_code == 2 and "not bound" in bad.stderr
    assert mlxi("run", "tiny", "hi", "--tool-choice", "required").exit_code == 2
