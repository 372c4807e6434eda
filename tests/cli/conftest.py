"""Fixtures of the CLI tests: a store and a loopback Hub wired in through the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_integrations.models import ModelStore, import_model


@pytest.fixture
def env(tmp_path: Path, hub, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """``mlxi`` pointed at a fresh store and at the module's ``hub`` fixture."""
    values = {
        "MLXI_HOME": str(tmp_path / "mlxi"),
        "HF_ENDPOINT": hub.url,
        "HF_HUB_CACHE": str(tmp_path / "hf"),
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    for key in ("HF_HUB_OFFLINE", "MLXI_DEBUG", "HF_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    return values


def store_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: Path, name: str) -> Path:
    """A store holding ``model`` as ``name``, which ``mlxi`` uses (``MLXI_HOME``)."""
    home = tmp_path / "mlxi"
    import_model(model, name, store=ModelStore(home))
    monkeypatch.setenv("MLXI_HOME", str(home))
    return home


@pytest.fixture
def home(tmp_path: Path, tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store holding the tiny Llama as ``tiny``."""
    return store_with(tmp_path, monkeypatch, tiny_llama, "tiny")
