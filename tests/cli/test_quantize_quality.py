"""``mlxi quantize`` says what quantization cost; ``mlxi show`` keeps saying it."""

from __future__ import annotations

import json

import pytest
from mlx_integrations.cli.main import app
from typer.testing import CliRunner

from mlx_integrations.engine.decoding import cuda_default_device


def mlxi(*args: str):
    return CliRunner().invoke(app, list(args))


def test_a_damaging_setting_is_reported_with_a_warning_and_remedies(home):
    result = mlxi("quantize", "tiny", "--bits", "2")
    assert result.exit_code == 0, result.stderr
    assert "quantized tiny -> tiny-q2" in result.stdout
    assert "quality: perplexity" in result.stdout and ": damaged" in result.stdout
    warning, hint = [line for line in result.stderr.splitlines() if line.startswith(("W", "H"))]
    assert warning.startswith("Warning: the quantized model lost too much (perplexity x")
    assert hint.startswith("Hint: Quantize again with --bits 8")
    assert "Warning:" not in result.stdout  # results only on stdout

    shown = mlxi("show", "tiny-q2")
    assert shown.exit_code == 0, shown.stderr
    assert any(line.startswith("quality ") for line in shown.stdout.splitlines())
    assert "Warning: the quantized model lost too much" in shown.stderr
    data = json.loads(mlxi("show", "tiny-q2", "--json").stdout)
    assert data["quality"]["verdict"] == "damaged"
    assert set(data["quality"]) >= {"ppl_source", "ppl_quantized", "ppl_ratio", "mean_kl"}


@pytest.mark.xfail(
    cuda_default_device(),
    reason="MLX 0.32.4's CUDA quantized matmul with float32 activations gives wrong "
    "products at K=64 with group size 64 and more than one row (bench/gpu/qmm_probe.py, "
    "H100): the tiny model's 8-bit copy is damaged there, and the check says so",
    strict=False,
)
def test_a_benign_setting_prints_the_figures_without_a_warning(home):
    result = mlxi("quantize", "tiny", "--bits", "8", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["name"] == "tiny-q8"
    assert data["quality"]["verdict"] == "close" and data["quality"]["ppl_ratio"] < 1.01
    assert data["quality"]["tokens"] > 100
    assert "Warning" not in result.stderr
    shown = json.loads(mlxi("show", "tiny-q8", "--json").stdout)
    assert shown["quality"] == data["quality"]


def test_no_eval_skips_the_comparison(home):
    result = mlxi("quantize", "tiny", "--bits", "2", "--no-eval", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["quality"] is None
    assert "Warning" not in result.stderr
    shown = mlxi("show", "tiny-q2")
    assert "quality" not in shown.stdout and "Warning" not in shown.stderr
    assert json.loads(mlxi("show", "tiny-q2", "--json").stdout)["quality"] is None


def test_quantizing_on_import_warns_too(home, tiny_llama):
    result = mlxi("import", str(tiny_llama), "tiny-q2", "--q-bits", "2")
    assert result.exit_code == 0, result.stderr
    assert "imported tiny-q2" in result.stdout
    assert "Warning: the quantized model lost too much" in result.stderr
