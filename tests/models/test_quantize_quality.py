"""What quantization cost: the quantized model read the built-in text beside its source."""

from __future__ import annotations

import json
import math
from pathlib import Path

import mlx.core as mx
import pytest

from mlx_integrations.engine.decoding import cuda_default_device
from mlx_integrations.models import (
    Manifest,
    ModelStore,
    QuantizationInfo,
    QuantizationQuality,
    import_model,
    measure_quality,
    quantize_model,
    show_model,
)
from mlx_integrations.models.manifest import MANIFEST_FILE
from mlx_integrations.models.quality.measure import sample_text

# The tiny models are 64 wide, where MLX 0.32.4's CUDA quantized matrix product with
# float32 activations and group size 64 gives wrong results for more than one row
# (measured on an H100): on CUDA these figures are the kernels' (a copy judged
# close in one test was judged damaged in another, on one machine).
pytestmark = pytest.mark.xfail(
    cuda_default_device(),
    reason="MLX 0.32.4's CUDA quantized matmul is wrong at K=64, group 64, float32",
    strict=False,
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, tiny_llama: Path) -> ModelStore:
    """A store holding the tiny Llama as ``tiny``, quantized at 8, 3 and 2 bits."""
    store = ModelStore(tmp_path_factory.mktemp("quality") / "mlxi")
    import_model(tiny_llama, "tiny", store=store)
    for bits in (8, 3, 2):
        quantize_model("tiny", f"tiny-q{bits}", bits=bits, store=store)
    return store


def quality(store: ModelStore, name: str) -> QuantizationQuality:
    q = store.get(name).manifest.quality
    assert q is not None, f"{name} has no quality figures"
    return q


def test_figures_are_finite_and_grow_with_the_damage(store):
    q8, q3, q2 = (quality(store, f"tiny-q{b}") for b in (8, 3, 2))
    for q in (q8, q3, q2):
        values = (q.ppl_source, q.ppl_quantized, q.ppl_ratio, q.mean_kl, q.top1_agreement)
        assert all(math.isfinite(v) for v in values)
        assert q.tokens > 100 and q.seconds > 0
        assert q.ppl_source == q8.ppl_source  # one source, one text
        assert q.ppl_ratio == pytest.approx(q.ppl_quantized / q.ppl_source, rel=1e-5)
    assert q8.ppl_ratio == pytest.approx(1.0, abs=0.01)
    assert q8.mean_kl < 0.002 and q8.top1_agreement > 0.97
    # 3 and 2 bits move the predictions an order of magnitude (and more) further.
    assert q3.mean_kl > 10 * q8.mean_kl and q2.mean_kl > 2 * q3.mean_kl
    assert q2.ppl_ratio > q3.ppl_ratio > q8.ppl_ratio
    assert q2.top1_agreement < q8.top1_agreement


def test_the_warning_names_remedies_for_a_damaging_setting_only(store):
    q8, q2 = quality(store, "tiny-q8"), quality(store, "tiny-q2")
    assert q8.verdict == "close" and q8.warning() is None
    assert q2.verdict == "damaged"
    warning = q2.warning(store.get("tiny-q2").manifest.quantization)
    assert warning is not None
    assert "garbled" in warning.message and f"x{q2.ppl_ratio:.2f}" in warning.message
    assert "--bits 8" in warning.hint and "--group-size 32" in warning.hint
    assert "--recipe mixed_2_6" in warning.hint


def test_manifest_and_show_keep_the_figures(store):
    model = store.get("tiny-q3")
    on_disk = json.loads((model.path / MANIFEST_FILE).read_text())
    assert on_disk["quality"]["mean_kl"] == model.manifest.quality.mean_kl
    assert Manifest.read(model.path) == model.manifest
    assert Manifest.from_json(model.manifest.to_json()).quality == model.manifest.quality
    info = show_model("tiny-q3", store=store)
    assert info.quality == model.manifest.quality
    shown = info.to_dict()["quality"]
    assert shown["verdict"] == model.manifest.quality.verdict
    assert shown["ppl_ratio"] == model.manifest.quality.ppl_ratio
    assert show_model("tiny", store=store).quality is None


def test_a_manifest_written_before_the_figures_still_reads(store, tmp_path):
    data = store.get("tiny-q8").manifest.to_dict()
    del data["quality"]
    old = Manifest.from_dict(json.loads(json.dumps(data)))
    assert old.quality is None and old.quantization == QuantizationInfo(8, 64)


def test_no_evaluation_leaves_the_figures_out(store):
    model = quantize_model("tiny", "tiny-q4-fast", bits=4, store=store, evaluate=False)
    assert model.manifest.quality is None
    assert json.loads((model.path / MANIFEST_FILE).read_text())["quality"] is None
    assert show_model("tiny-q4-fast", store=store).to_dict()["quality"] is None


def test_dequantized_weights_predict_as_the_quantized_kernels_do(store):
    """The CPU runs the quantized model on its dequantized weights (far faster there):
    the figures match those of MLX's quantized matrix products."""
    source, quantized = store.get("tiny").path, store.get("tiny-q3").path
    fast = measure_quality(source, quantized, dequantize=True)
    kernels = measure_quality(source, quantized, dequantize=False)
    assert fast.ppl_quantized == pytest.approx(kernels.ppl_quantized, rel=1e-4)
    assert fast.mean_kl == pytest.approx(kernels.mean_kl, rel=1e-3, abs=1e-6)
    assert fast.top1_agreement == pytest.approx(kernels.top1_agreement, abs=0.01)


def test_kernels_that_compute_wrong_products_are_told_apart_from_the_quantization(
    store, monkeypatch
):
    """A backend whose quantized matrix product is wrong (as MLX 0.32.4's CUDA one is for
    float32 activations 64 wide, group size 64): the model is damaged on that device, and
    the warning blames the kernels, not the settings."""
    source, q8, q2 = (store.get(n).path for n in ("tiny", "tiny-q8", "tiny-q2"))
    # On working kernels: a close copy is not checked; a damaging setting is checked
    # and the kernels agree with the weights, so the usual remedies stand.
    assert measure_quality(source, q8, dequantize=False).kernels_agree is None
    damaged = measure_quality(source, q2, dequantize=False)
    assert damaged.verdict == "damaged" and damaged.kernels_agree is True
    assert "Quantize again with --bits 8" in damaged.warning().hint

    right = mx.quantized_matmul

    def wrong(x, w, scales, biases=None, *args, **kwargs):  # the product, scrambled
        out = right(x, w, scales, biases, *args, **kwargs)
        return mx.flip(out, axis=-1) * 3.0

    monkeypatch.setattr(mx, "quantized_matmul", wrong)
    broken = measure_quality(source, q8, dequantize=False)
    assert broken.verdict == "damaged" and broken.kernels_agree is False
    warning = broken.warning()
    assert "MLX's quantized kernels computed wrong products" in warning.message
    assert "The quantization is not at fault" in warning.hint
    # Run on the dequantized weights, the same model is a close copy (the kernels unused).
    assert measure_quality(source, q8, dequantize=True).verdict == "close"
    # The finding survives the manifest's JSON; older manifests have no such field.
    assert QuantizationQuality.from_dict(json.loads(json.dumps(broken.to_dict()))) == broken
    older = {k: v for k, v in damaged.to_dict().items() if k != "kernels_agree"}
    assert QuantizationQuality.from_dict(older).kernels_agree is None
    with pytest.raises(ValueError, match="kernels_agree must be true, false or null, got 'no'"):
        QuantizationQuality.from_dict({**older, "kernels_agree": "no"})


def test_kernels_a_little_off_on_a_damaged_model_leave_the_fault_with_the_quantization(
    store, monkeypatch
):
    """Products 10% off move the 2-bit copy's predictions past ``KERNEL_KL`` from its
    weights dequantized, as rounding alone moves a damaged model's (bfloat16 weights
    dequantized round apart from float32 kernels): those weights are damaged too, so
    the kernels cannot be told apart and the usual remedies stand."""
    right = mx.quantized_matmul
    monkeypatch.setattr(mx, "quantized_matmul", lambda *a, **k: right(*a, **k) * 1.1)
    source, q2 = store.get("tiny").path, store.get("tiny-q2").path
    damaged = measure_quality(source, q2, dequantize=False)
    assert damaged.verdict == "damaged" and damaged.kernels_agree is None
    assert "Quantize again with --bits 8" in damaged.warning().hint


def test_a_gguf_source_is_compared_with_its_own_weights(tmp_path):
    from tests.models.test_gguf_import import write_tiny_gguf
    from tests.support.tiny_models import train_tokenizer

    store = ModelStore(tmp_path / "mlxi")
    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf, train_tokenizer())
    model = quantize_model(gguf, "tiny-q4", bits=4, store=store)
    got = model.manifest.quality
    assert got is not None
    # The same figures as against the GGUF's float32 conversion, made separately.
    converted = import_model(gguf, "tiny-f32", store=store, dtype="float32")
    want = measure_quality(converted.path, model.path)
    assert got.ppl_source == pytest.approx(want.ppl_source, rel=1e-5)
    assert got.mean_kl == pytest.approx(want.mean_kl, rel=1e-4, abs=1e-7)
    assert got.ppl_source != pytest.approx(got.ppl_quantized, rel=1e-6)  # not itself


def test_bad_texts_are_refused(store):
    source, quantized = store.get("tiny").path, store.get("tiny-q8").path
    with pytest.raises(ValueError, match="at least 2 tokens"):
        measure_quality(source, quantized, text="")
    with pytest.raises(ValueError, match="max_tokens=1"):
        measure_quality(source, quantized, max_tokens=1)
    assert len(sample_text().split()) > 300


@pytest.mark.parametrize(
    ("ratio", "kl", "verdict"),
    [
        (1.006, 0.001, "close"),  # SmolLM2, 8 bits
        (1.047, 0.093, "close"),  # SmolLM2, 5 bits
        (1.15, 0.05, "degraded"),
        (1.05, 0.15, "degraded"),
        (1.24, 0.29, "damaged"),  # SmolLM2, 4 bits group 32
        (1.32, 0.37, "damaged"),  # SmolLM2, 4 bits group 64
        (math.inf, 30.0, "damaged"),
        (math.nan, math.nan, "damaged"),
    ],
)
def test_verdicts(ratio, kl, verdict):
    q = QuantizationQuality(20.0, 20.0 * ratio, ratio, kl, 0.9, 500, 1.0)
    assert q.verdict == verdict
    assert (q.warning() is None) == (verdict == "close")


@pytest.mark.smollm
def test_the_demo_model_at_4_bits_gets_the_warning(smollm2_path, tmp_path):
    """SmolLM2-135M-Instruct at 4 bits answers garbled text; the figures say so."""
    store = ModelStore(tmp_path / "mlxi")
    model = quantize_model(smollm2_path, "smollm2-q4", bits=4, store=store)
    q = model.manifest.quality
    assert q is not None and q.verdict == "damaged"
    warning = q.warning(model.manifest.quantization)
    assert warning is not None and "--bits 8" in warning.hint
