"""``fuse_model``: an adapter folded into its base model, stored with its manifest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from mlx_integrations.models import Manifest, ModelStore, fuse_model, import_model
from mlx_integrations.models.errors import ModelExistsError
from tests.support.tiny_adapter import build_lora_adapter
from tests.support.tiny_models import build_tiny_model

PROMPTS = [
    "What is the capital of France?",
    "Hello! How can I help you today?",
    "The quick brown fox jumps over the lazy dog.",
]
N = 16


@pytest.fixture(scope="module")
def adapter(tiny_own_head: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_lora_adapter(tiny_own_head, tmp_path_factory.mktemp("adapter") / "lora")


def greedy(model: Path, adapter_path: Path | None = None) -> list[list[int]]:
    """mlx-lm's greedy tokens for the prompts (with the adapter loaded by mlx-lm)."""
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    loaded = mlx_lm.load(
        str(model), adapter_path=None if adapter_path is None else str(adapter_path)
    )
    net, tokenizer = loaded[0], loaded[1]
    out = []
    for prompt in PROMPTS:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True
        )
        steps = generate_step(mx.array(ids), net, max_tokens=N, sampler=make_sampler(0.0))
        out.append([int(t) for t, _ in steps])
    return out


def last_logits(model: Path, adapter_path: Path | None = None) -> object:
    import mlx.core as mx
    import mlx_lm

    loaded = mlx_lm.load(
        str(model), adapter_path=None if adapter_path is None else str(adapter_path)
    )
    net, tokenizer = loaded[0], loaded[1]
    ids = tokenizer.encode(" ".join(PROMPTS))
    return net(mx.array([ids]))[0]


def test_the_fused_model_answers_as_the_model_with_its_adapter(tiny_own_head, adapter, tmp_path):
    import mlx.core as mx

    store = ModelStore(tmp_path / "store")
    fused = fuse_model(tiny_own_head, adapter, "tiny-tuned", store=store)
    assert fused.path == store.model_dir("tiny-tuned")
    want = greedy(tiny_own_head, adapter)
    assert want != greedy(tiny_own_head)  # the adapter changes the replies
    assert greedy(fused.path) == want
    # Folded weights round differently: the logits agree closely, not bit for bit.
    a, b = last_logits(fused.path), last_logits(tiny_own_head, adapter)
    assert mx.allclose(a, b, atol=1e-4, rtol=1e-4).item()  # type: ignore[attr-defined]
    assert not (fused.path / "adapters.safetensors").exists()  # nothing to apply at run time


def test_the_manifest_names_the_base_and_the_adapters_sha256(tiny_own_head, adapter, tmp_path):
    store = ModelStore(tmp_path / "store")
    import_model(tiny_own_head, "tiny", store=store)
    fused = fuse_model("tiny", str(adapter), "tiny-tuned", store=store)
    src = fused.manifest.source
    weights = (adapter / "adapters.safetensors").read_bytes()
    assert (src.kind, src.base, src.path) == ("fuse", "tiny", str(adapter))
    assert src.adapter_sha256 == hashlib.sha256(weights).hexdigest()
    assert fused.manifest.dtype == "float32" and fused.manifest.quantization is None
    assert store.verify("tiny-tuned").ok
    assert Manifest.read(fused.path) == fused.manifest
    # Nothing half-built is left beside it.
    assert sorted(p.name for p in store.models_dir.iterdir()) == ["tiny", "tiny-tuned"]


def test_manifests_without_an_adapter_keep_their_layout(tiny_own_head, tmp_path):
    """Other models' manifests have no adapter_sha256 key: earlier versions read them."""
    model = import_model(tiny_own_head, "tiny", store=ModelStore(tmp_path / "store"))
    data = json.loads((model.path / "mlxi-manifest.json").read_text())
    assert "adapter_sha256" not in data["source"]
    assert Manifest.from_dict(data).source.adapter_sha256 is None


def test_a_quantized_base_stays_quantized_unless_dequantized(tiny_own_head, adapter, tmp_path):
    from mlx_integrations.models import quantize_model

    store = ModelStore(tmp_path / "store")
    import_model(tiny_own_head, "tiny", store=store)
    quantize_model("tiny", "tiny-q8", bits=8, group_size=32, store=store, evaluate=False)
    kept = fuse_model("tiny-q8", adapter, "tuned-q8", store=store)
    assert kept.manifest.quantization is not None and kept.manifest.quantization.bits == 8
    plain = fuse_model("tiny-q8", adapter, "tuned-f", store=store, dequantize=True)
    assert plain.manifest.quantization is None
    assert "quantization" not in json.loads((plain.path / "config.json").read_text())


def test_failures_leave_the_store_unchanged(tiny_own_head, adapter, tmp_path):
    store = ModelStore(tmp_path / "store")
    with pytest.raises(ValueError, match=r"has no adapter_config.json and no adapters"):
        fuse_model(tiny_own_head, tmp_path, "x", store=store)
    other = build_tiny_model(tmp_path / "wide", hidden_size=128)
    with pytest.raises(ValueError, match=r"does not fit .* \(it was trained on "):
        fuse_model(other, adapter, "x", store=store)
    assert not [p for p in store.models_dir.iterdir()]  # no temporary folder stays
    fuse_model(tiny_own_head, adapter, "x", store=store)
    with pytest.raises(ModelExistsError, match=r"'x' is already in the store"):
        fuse_model(tiny_own_head, adapter, "x", store=store)
    fuse_model(tiny_own_head, adapter, "x", store=store, overwrite=True)


def test_a_vision_model_takes_no_adapter(tiny_vlm, adapter, tmp_path):
    with pytest.raises(ValueError, match=r"is a vision-language model"):
        fuse_model(tiny_vlm, adapter, "x", store=ModelStore(tmp_path / "store"))
