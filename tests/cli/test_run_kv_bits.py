"""``mlxi run --kv-bits``: a quantized KV cache from the command line, bad values refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlx_integrations.cli.main import app
from typer.testing import CliRunner

from mlx_integrations.runtime import quantized_attention_error
from tests.cli.conftest import store_with
from tests.support.tiny_models import build_tiny_model

ARGS = ["run", "heads64", "What is the weather in Paris?", "-t", "0", "-m", "12"]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # Attention heads of 64 values, which the default kv_group_size divides.
    model = build_tiny_model(
        tmp_path / "model", hidden_size=128, num_attention_heads=2, tie_word_embeddings=False
    )
    return store_with(tmp_path, monkeypatch, model, "heads64")


@pytest.mark.skipif(
    quantized_attention_error("float32", 64, 8, 64) is not None,
    reason="MLX's CUDA backend has no kernel for attention over a quantized KV cache",
)
@pytest.mark.parametrize("more", [[], ["--draft-model", "heads64"]])
def test_kv_bits_run_answers(home, more):
    result = CliRunner().invoke(app, [*ARGS, "--kv-bits", "8", *more])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--kv-bits", "5"], "kv_bits must be one of 2, 3, 4, 6, 8"),
    ],
)
def test_bad_kv_bits_are_usage_errors(home, option, message):
    result = CliRunner().invoke(app, [*ARGS, *option])
    assert result.exit_code == 2
    assert message in result.stderr
    assert "--kv-bits" in result.stderr
