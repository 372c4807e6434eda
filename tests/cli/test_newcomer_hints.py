"""What a newcomer reads when a command goes wrong, or asks how things stand: a mistyped
model name gets the name it was close to, a hint names the flag one types (not the
Python keyword), and ``mlxi doctor`` prints words, each version once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mlx_integrations.cli.main import app
from typer.testing import CliRunner

from mlx_integrations.models import ModelNotFoundError, ModelStore, resolve_model
from tests.cli.conftest import store_with


def mlxi(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def home(tmp_path: Path, tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return store_with(tmp_path, monkeypatch, tiny_llama, "smollm2-135m-instruct")


@pytest.mark.parametrize(
    "typed", ["smollm2-135m-instuct", "smolm2-135m-instruct", "SmolLM2-135M-Instruct"]
)
def test_a_mistyped_name_gets_the_name_it_was_close_to(home, typed):
    result = mlxi("show", typed)
    assert result.exit_code == 1, result.output
    assert "Hint: Did you mean 'smollm2-135m-instruct'?" in result.stderr, result.stderr


def test_an_alias_is_offered_too_and_a_far_name_gets_the_list(home):
    ModelStore(home).tag("smollm2-135m-instruct", "tiny-chat")
    with pytest.raises(ModelNotFoundError) as caught:
        resolve_model("tiny-caht", store=ModelStore(home))
    assert caught.value.hint is not None and "Did you mean 'tiny-chat'?" in caught.value.hint
    with pytest.raises(ModelNotFoundError) as caught:
        resolve_model("llama-9000", store=ModelStore(home))
    assert caught.value.hint == "See what is there: mlxi list"


def test_the_adapters_name_the_close_model_too(home):
    from mlx_integrations.models.resolve import resolve_model_path

    with pytest.raises(FileNotFoundError, match="Did you mean 'smollm2-135m-instruct'"):
        resolve_model_path("smollm2-135m-instructt")


def test_a_name_taken_gets_the_flag_that_replaces_it(home, tiny_llama):
    result = mlxi("import", str(tiny_llama), "smollm2-135m-instruct")
    assert result.exit_code == 1, result.output
    assert "Hint: Pass --force to replace it" in result.stderr, result.stderr
    assert "overwrite=True" not in result.stderr


def test_doctor_prints_words_and_each_version_once(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXI_HOME", str(tmp_path / "mlxi"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = mlxi("doctor")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert not re.search(r"\bNone\b", text), text
    assert "_version" not in text, text
    for name in ("mlx", "mlx-lm", "transformers"):
        rows = [line for line in text.splitlines() if line.split()[:1] == [name]]
        assert len(rows) == 1, (name, text)
    # The JSON keeps every field, None where it does not apply.
    data = mlxi("doctor", "--json")
    assert '"mlx_version"' in data.stdout and '"gpu_name"' in data.stdout
