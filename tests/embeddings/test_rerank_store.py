"""The store knows a reranker: mlxi show's type, and a chat adapter pointed at one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import mlx_integrations  # noqa: F401  (BLAS preload before mlx.core)
from tests.support.cross_encoders import write_minilm_cross_encoder


def test_model_kind_and_show(minilm_path: Path, tmp_path: Path) -> None:
    from mlx_integrations.models import ModelStore, import_model
    from mlx_integrations.models.info import show_model
    from mlx_integrations.models.resolve import model_kind

    ce = write_minilm_cross_encoder(minilm_path, tmp_path / "ce")
    store = ModelStore(tmp_path / "store")
    stored = import_model(ce, "minilm-ce", store=store)
    assert model_kind(stored.path) == "reranker"
    assert show_model("minilm-ce", store=store).kind == "reranker"
    assert show_model("minilm-ce", store=store).to_dict()["kind"] == "reranker"
    assert model_kind(minilm_path) == "embedding"
    llm = tmp_path / "Qwen3-Reranker-0.6B"
    llm.mkdir()
    (llm / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    assert model_kind(llm) == "reranker"
    (tmp_path / "chat").mkdir()
    (tmp_path / "chat" / "config.json").write_text(llm.joinpath("config.json").read_text())
    assert model_kind(tmp_path / "chat") == "chat"


def test_a_chat_adapter_given_a_cross_encoder_says_to_rerank(
    minilm_path: Path, tmp_path: Path
) -> None:
    from mlx_integrations.langchain import ChatMLX

    ce = write_minilm_cross_encoder(minilm_path, tmp_path / "ce")
    with pytest.raises(ValueError, match=r"holds a reranker .*MLXRerank\(model="):
        ChatMLX(model=str(ce))


def test_mlxi_import_and_show_say_reranker(
    minilm_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlx_integrations.cli.main import app
    from typer.testing import CliRunner

    monkeypatch.setenv("MLXI_HOME", str(tmp_path / "store"))
    ce = write_minilm_cross_encoder(minilm_path, tmp_path / "ce")
    done = CliRunner().invoke(app, ["import", str(ce), "minilm-ce"])
    assert done.exit_code == 0, done.output
    assert "imported minilm-ce (" in done.stdout and "; reranker (MLXRerank)" in done.stdout
    shown = CliRunner().invoke(app, ["show", "minilm-ce"])
    assert shown.exit_code == 0, shown.output
    assert "type               reranker (MLXRerank)" in shown.stdout
    data = CliRunner().invoke(app, ["show", "minilm-ce", "--json"])
    assert json.loads(data.stdout)["kind"] == "reranker"
