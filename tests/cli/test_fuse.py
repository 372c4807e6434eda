"""``mlxi run --adapter`` and ``mlxi fuse``: a LoRA adapter of mlx_lm.lora, applied at run
time or folded into a new store model (real engines on a tiny model)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from mlx_integrations.cli.main import app
from typer.testing import CliRunner

from tests.cli.conftest import store_with
from tests.support.tiny_adapter import build_lora_adapter

ASK = ["What is the capital of France?", "--max-tokens", "16", "--temperature", "0", "--json"]


def mlxi(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def home(tmp_path: Path, tiny_own_head: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store holding the tiny model (own output head: varied replies) as ``tiny``."""
    return store_with(tmp_path, monkeypatch, tiny_own_head, "tiny")


@pytest.fixture(scope="module")
def adapter(tiny_own_head: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_lora_adapter(tiny_own_head, tmp_path_factory.mktemp("adapter") / "lora")


def answer(*args: str) -> str:
    result = mlxi("run", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)["text"]


def test_run_with_an_adapter_and_the_fused_model_give_one_answer(home, adapter):
    plain = answer("tiny", *ASK)
    tuned = answer("tiny", *ASK, "--adapter", str(adapter))
    assert tuned != plain
    fused = mlxi("fuse", "tiny", str(adapter), "tiny-tuned", "--json")
    assert fused.exit_code == 0, fused.stderr
    data = json.loads(fused.stdout)  # the whole of stdout: mlx-lm's prints go elsewhere
    sha = hashlib.sha256((adapter / "adapters.safetensors").read_bytes()).hexdigest()
    assert (data["name"], data["source"], data["base"]) == ("tiny-tuned", "fuse", "tiny")
    assert (data["adapter"], data["adapter_sha256"]) == (str(adapter), sha)
    assert answer("tiny-tuned", *ASK) == tuned


def test_fuse_prints_a_line_and_show_names_the_adapter(home, adapter):
    fused = mlxi("fuse", "tiny", str(adapter), "tiny-tuned")
    assert fused.exit_code == 0, fused.stderr
    assert fused.stdout.startswith(f"fused {adapter} into tiny -> tiny-tuned (")
    shown = mlxi("show", "tiny-tuned")
    assert shown.exit_code == 0, shown.stderr
    sha = hashlib.sha256((adapter / "adapters.safetensors").read_bytes()).hexdigest()
    assert "source             fuse: tiny\n" in shown.stdout
    assert f"adapter            {adapter} (sha256 {sha})\n" in shown.stdout
    listed = json.loads(mlxi("list", "--json").stdout)
    assert {m["name"]: m["source"] for m in listed} == {"tiny": "local", "tiny-tuned": "fuse"}


def test_a_bad_adapter_is_a_usage_error_naming_the_option(home, tmp_path):
    result = mlxi("run", "tiny", "Hi", "--adapter", str(tmp_path / "missing"))
    assert result.exit_code == 2
    assert "--adapter" in result.stderr and "does not exist" in result.stderr
    fused = mlxi("fuse", "tiny", str(tmp_path), "x")
    assert fused.exit_code == 2
    assert fused.stderr.startswith("Error: adapter_path=")
    assert "has no adapter_config.json and no adapters.safetensors" in fused.stderr
    assert mlxi("list", "--quiet").stdout == "tiny\n"
