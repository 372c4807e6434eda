"""``mlxi show``: the chat template (``--template``), the generation defaults, and the
source of a GGUF import as the user named it (real imports of tiny models)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from mlx_integrations.cli.main import app
from typer.testing import CliRunner

from mlx_integrations.models import resolve_model, show_model
from mlx_integrations.models.manifest import MANIFEST_FILE


def mlxi(*args: str):
    return CliRunner().invoke(app, list(args))


def shown_lines(result) -> dict[str, str]:
    """The ``key   value`` lines of ``mlxi show`` as a dict."""
    assert result.exit_code == 0, result.stderr
    out = {}
    for line in result.stdout.splitlines():
        if line == "files":
            break
        key, _, value = line.partition("  ")
        out[key.strip()] = value.strip()
    return out


@pytest.fixture
def model_copy(tmp_path: Path, tiny_llama: Path) -> Path:
    """A copy of the tiny Llama to change files in."""
    return Path(shutil.copytree(tiny_llama, tmp_path / "model"))


def test_template_prints_the_tokenizer_configs_chat_template(home, tiny_llama):
    stored = json.loads((tiny_llama / "tokenizer_config.json").read_text())["chat_template"]
    result = mlxi("show", "tiny", "--template")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == stored.removesuffix("\n") + "\n"
    as_json = json.loads(mlxi("show", "tiny", "--template", "--json").stdout)
    assert as_json == {
        "name": "tiny",
        "chat_template": stored,
        "chat_template_file": "tokenizer_config.json",
    }
    lines = shown_lines(mlxi("show", "tiny"))
    assert lines["chat template"].startswith("tokenizer_config.json (")
    assert "mlxi show tiny --template prints it" in lines["chat template"]


def test_a_chat_template_jinja_file_wins_as_in_transformers(model_copy):
    (model_copy / "chat_template.jinja").write_text("{{ messages[0]['content'] }}\n")
    result = mlxi("show", str(model_copy), "--template")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "{{ messages[0]['content'] }}\n"
    info = show_model(model_copy)
    assert info.chat_template_file == "chat_template.jinja"
    assert info.template_takes_tools is False  # the file's template, not the config's


def test_a_model_without_a_template_says_so(model_copy):
    config = json.loads((model_copy / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (model_copy / "tokenizer_config.json").write_text(json.dumps(config))
    result = mlxi("show", str(model_copy), "--template")
    assert result.exit_code == 1 and result.stdout == ""
    assert "has no chat template (no chat_template.jinja" in result.stderr
    assert "'role: content' lines" in result.stderr
    assert (
        json.loads(mlxi("show", str(model_copy), "--template", "--json").stdout)["chat_template"]
        is None
    )
    lines = shown_lines(mlxi("show", str(model_copy)))
    assert lines["chat template"].startswith("none")


def test_generation_defaults_in_text_and_json(model_copy):
    (model_copy / "generation_config.json").write_text(
        json.dumps(
            {
                "temperature": 0.6,
                "top_p": 0.95,
                "top_k": 20,
                "repetition_penalty": 1.05,
                "max_new_tokens": 512,
                "eos_token_id": [2, 7],
                "do_sample": True,
                "transformers_version": "4.51.0",
            }
        )
    )
    lines = shown_lines(mlxi("show", str(model_copy)))
    assert lines["generation"] == (
        "temperature 0.6, top_p 0.95, top_k 20, repetition_penalty 1.05, "
        "max_new_tokens 512, eos ids 2, 7"
    )
    result = mlxi("show", str(model_copy), "--json")
    assert json.loads(result.stdout)["generation"] == {
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "min_p": None,
        "repetition_penalty": 1.05,
        "max_new_tokens": 512,
        "do_sample": True,
        "eos_token_ids": [2, 7],
    }


def test_no_generation_config_is_said(home):
    assert shown_lines(mlxi("show", "tiny"))["generation"] == "none (no generation_config.json)"
    assert json.loads(mlxi("show", "tiny", "--json").stdout)["generation"] is None


@pytest.fixture
def linked_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A GGUF file named through a link into a cache of hash-named blobs (as the Hugging
    Face cache keeps them), in a fresh store; the working directory is ``tmp_path``."""
    from tests.models.test_gguf_import import write_tiny_gguf
    from tests.support.tiny_models import train_tokenizer

    blob = tmp_path / "cache" / "blobs" / "6f0c1d2e"
    blob.parent.mkdir(parents=True)
    write_tiny_gguf(tmp_path / "written.gguf", train_tokenizer())
    (tmp_path / "written.gguf").rename(blob)
    link = tmp_path / "models" / "tiny.gguf"
    link.parent.mkdir()
    link.symlink_to(Path("..") / "cache" / "blobs" / blob.name)
    monkeypatch.setenv("MLXI_HOME", str(tmp_path / "mlxi"))
    monkeypatch.chdir(tmp_path)
    return link


def test_an_imported_gguf_names_the_file_given_and_its_sha256(linked_gguf):
    digest = hashlib.sha256(linked_gguf.read_bytes()).hexdigest()
    result = mlxi("import", "models/tiny.gguf", "tiny")  # relative, as typed
    assert result.exit_code == 0, result.stderr
    source = json.loads(mlxi("show", "tiny", "--json").stdout)["source"]
    assert source["kind"] == "gguf" and source["path"] == str(linked_gguf)
    assert source["sha256"] == digest
    lines = shown_lines(mlxi("show", "tiny"))
    assert lines["source"] == f"gguf: {linked_gguf}"
    assert lines["source sha256"] == digest


def test_a_gguf_path_given_to_an_engine_is_recorded_as_given(linked_gguf):
    # ChatMLX(model="models/tiny.gguf") resolves the name this way, importing once.
    folder = resolve_model("models/tiny.gguf")
    assert folder.name.startswith("gguf-tiny-")
    stamp = (folder / MANIFEST_FILE).stat().st_mtime_ns
    assert resolve_model(str(linked_gguf)) == folder  # the same file: no second import
    assert (folder / MANIFEST_FILE).stat().st_mtime_ns == stamp
    source = json.loads(mlxi("show", folder.name, "--json").stdout)["source"]
    assert source["path"] == str(linked_gguf)
    assert source["sha256"] == hashlib.sha256(linked_gguf.read_bytes()).hexdigest()


def test_a_gguf_quantized_on_import_names_the_file_given(linked_gguf):
    result = mlxi("import", "models/tiny.gguf", "tiny-q4", "--q-bits", "4")
    assert result.exit_code == 0, result.stderr
    source = json.loads(mlxi("show", "tiny-q4", "--json").stdout)["source"]
    assert source["kind"] == "quantize"
    assert source["base"] == source["path"] == str(linked_gguf)
    assert source["sha256"] == hashlib.sha256(linked_gguf.read_bytes()).hexdigest()


def test_a_manifest_written_before_the_sha256_was_recorded_still_shows(linked_gguf):
    assert mlxi("import", "models/tiny.gguf", "tiny").exit_code == 0
    manifest = Path("mlxi") / "models" / "tiny" / MANIFEST_FILE
    data = json.loads(manifest.read_text())
    del data["source"]["sha256"]
    manifest.write_text(json.dumps(data))
    lines = shown_lines(mlxi("show", "tiny"))
    assert lines["source"] == f"gguf: {linked_gguf}" and "source sha256" not in lines
    assert mlxi("verify", "tiny").exit_code == 0
