"""GGUF files through the store: import and resolve by path (real SmolLM2-135M GGUF)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_integrations.models import ModelStore, import_model, resolve_model, show_model

pytestmark = pytest.mark.smollm


@pytest.fixture(scope="module")
def gguf_file() -> Path:
    from tests.support.smollm import ensure_smollm2_gguf

    return ensure_smollm2_gguf()


def test_import_gguf_then_generate(tmp_path, gguf_file):
    from mlx_lm import generate, load

    store = ModelStore(tmp_path / "mlxi")
    model = import_model(gguf_file, "smollm2", store=store)
    assert model.manifest.source.kind == "gguf"
    assert model.manifest.source.path == str(gguf_file.resolve())
    assert store.verify("smollm2").ok
    info = show_model("smollm2", store=store)
    assert info.architecture == "llama" and info.parameters and info.parameters > 100e6
    loaded, tokenizer = load(str(model.path))
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "Paris" in generate(loaded, tokenizer, prompt, max_tokens=20)


def test_resolving_a_gguf_path_imports_once(tmp_path, gguf_file):
    store = ModelStore(tmp_path / "mlxi")
    first = resolve_model(str(gguf_file), store=store)
    stamp = (first / "mlxi-manifest.json").stat().st_mtime_ns
    assert resolve_model(str(gguf_file), store=store) == first
    assert (first / "mlxi-manifest.json").stat().st_mtime_ns == stamp
    assert [m.manifest.source.kind for m in store.list()] == ["gguf"]
