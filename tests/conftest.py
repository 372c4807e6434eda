"""Shared fixtures: tiny random models (built in seconds) and the real SmolLM2-135M."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

import mlx_integrations  # noqa: F401  (preloads the CPU BLAS before mlx.core is imported)
from tests.support.tiny_models import PLAIN_TEMPLATE, build_tiny_model
from tests.support.tiny_vlm import build_tiny_vlm, make_test_image


def _llama_index_tiktoken_cache() -> str | None:
    spec = importlib.util.find_spec("llama_index.core")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "_static" / "tiktoken_cache"
    return str(folder) if folder.is_dir() else None


# llama_index counts tokens with tiktoken's cl100k_base, whose file it ships; tiktoken
# downloads it instead where TIKTOKEN_CACHE_DIR names another folder (as on some GPU
# images). Tests (and the cookbook examples they start) read the shipped copy.
if (_tiktoken_cache := _llama_index_tiktoken_cache()) is not None:
    os.environ["TIKTOKEN_CACHE_DIR"] = _tiktoken_cache


@pytest.fixture
def lookup_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request decoding alone verifies drafts wherever its context has a match.

    Otherwise its ``LookupPace`` picks rounds or plain steps by timing, and which steps
    draft (the counts that tests check) would depend on the machine's speed; the pace
    itself is tested in tests/engine/test_lookup_pace.py.
    """
    from mlx_integrations.engine.speculative.pace import LookupPace

    monkeypatch.setattr(LookupPace, "worth", lambda self, n: True)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Llama-shaped model (hidden 64) with a tool-aware ChatML template."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), arch="llama")


@pytest.fixture(scope="session")
def tiny_own_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Llama-shaped model with its own output head (not tied to the embedding):
    greedy replies vary and repeat n-grams that prompt lookup finds."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-own-head"), tie_word_embeddings=False)


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Qwen2-shaped model (hidden 64) with a tool-aware ChatML template."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), arch="qwen2")


@pytest.fixture(scope="session")
def tiny_plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Llama-shaped model whose template knows nothing of tools."""
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny-plain"), arch="llama", chat_template=PLAIN_TEMPLATE
    )


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Qwen2.5-VL (text hidden 64, vision hidden 32) with its processor files."""
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))


@pytest.fixture(scope="session")
def test_images(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two visibly different 112x112 PNGs (red/blue stripes, green/white checks)."""
    folder = tmp_path_factory.mktemp("images")
    return (
        make_test_image(folder / "stripes.png", "stripes"),
        make_test_image(folder / "checker.png", "checker"),
    )


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct converted from its GGUF by the project's own importer.

    Converted once and cached outside the repository (``MLXI_TEST_CACHE``, default
    ``~/.cache/mlx-integrations-tests``).
    """
    from tests.support.smollm import ensure_smollm2

    return ensure_smollm2()
