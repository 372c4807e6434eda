"""A model that quantization damaged says so: its verdict stays in the manifest, every
way of loading it warns once per process, and ``strict`` keeps none.

The damaged model is the tiny Llama at 2 bits (perplexity about x1.24, KL 0.40 against
its source: "damaged"); at 8 bits it is "close".
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import pytest

from mlx_integrations.engine.decoding import cuda_default_device
from mlx_integrations.models import (
    DamagedModelWarning,
    DamagedQuantizationError,
    Manifest,
    ModelStore,
    import_model,
    list_models,
    quantize_model,
)
from mlx_integrations.models.manifest import MANIFEST_FILE
from mlx_integrations.models.quality.load_warning import warn_if_damaged
from mlx_integrations.models.quality.measure import sample_text
from mlx_integrations.models.resolve import check_model_dir

# The tiny models are 64 wide, where MLX 0.32.4's CUDA quantized matrix product with
# float32 activations and group size 64 is wrong: there the 8-bit copy is damaged too.
pytestmark = pytest.mark.xfail(
    cuda_default_device(),
    reason="MLX 0.32.4's CUDA quantized matmul is wrong at K=64, group 64, float32",
    strict=False,
)


@pytest.fixture
def store(tmp_path: Path, tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> ModelStore:
    """A fresh store (``$MLXI_HOME``) with ``tiny``, ``tiny-q2`` (damaged) and ``tiny-q8``.

    Fresh for each test: a model warns once per process, and each test's copy is
    another model (another folder).
    """
    store = ModelStore(tmp_path / "mlxi")
    import_model(tiny_llama, "tiny", store=store)
    quantize_model("tiny", "tiny-q2", bits=2, store=store)
    quantize_model("tiny", "tiny-q8", bits=8, store=store)
    monkeypatch.setenv("MLXI_HOME", str(store.home))
    return store


def damaged_warnings(caught: list[warnings.WarningMessage]) -> list[DamagedModelWarning]:
    return [w.message for w in caught if isinstance(w.message, DamagedModelWarning)]


def test_the_manifest_file_keeps_the_verdict_and_what_was_measured(store):
    on_disk = json.loads((store.get("tiny-q2").path / MANIFEST_FILE).read_text())
    quality = on_disk["quality"]
    assert quality["verdict"] == "damaged" and quality["ppl_ratio"] > 1.2
    assert quality["mean_kl"] > 0.25
    assert quality["reference"] == "tiny" and quality["text"] == "built-in"
    assert quality["text_sha256"] == hashlib.sha256(sample_text().encode()).hexdigest()
    assert quality["device"] in ("cpu", "gpu")
    assert Manifest.read(store.get("tiny-q2").path).verdict == "damaged"
    assert store.get("tiny-q8").manifest.verdict == "close"
    assert store.get("tiny").manifest.verdict is None
    # The listing's summaries carry the figures and the verdict (mlxi list --json).
    summaries = {m.name: m.summary() for m in list_models()}
    assert summaries["tiny-q2"]["quality"]["verdict"] == "damaged"
    assert summaries["tiny"]["quality"] is None


def test_a_stored_verdict_is_worked_out_again_from_the_figures(store):
    """The figures are what was measured; the verdict follows this version's thresholds,
    whatever the file says."""
    data = store.get("tiny-q8").manifest.to_dict()
    data["quality"]["verdict"] = "damaged"
    assert Manifest.from_dict(data).verdict == "close"
    # Figures recorded before the text and device were kept still read.
    for key in ("reference", "text", "text_sha256", "device", "verdict"):
        del data["quality"][key]
    older = Manifest.from_dict(data)
    assert older.quality is not None and older.quality.text is None
    assert older.verdict == "close"


def test_an_engine_warns_once_per_model_in_a_process(store):
    from mlx_integrations.engine import SimpleEngine

    path = store.get("tiny-q2").path
    with pytest.warns(DamagedModelWarning, match=r"Model 'tiny-q2' was found damaged") as got:
        SimpleEngine(path)
    warning = damaged_warnings(got.list)[0]
    assert warning.name == "tiny-q2" and warning.path == path.resolve()
    assert warning.quality.verdict == "damaged"
    assert "expect garbled answers" in warning.summary
    assert warning.hint.startswith("Quantize again with --bits 8")
    assert warning.hint in str(warning)  # Python shows the advice too
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        SimpleEngine(path)
        SimpleEngine("tiny-q2")  # by name: the same model
    assert damaged_warnings(again) == []


def test_close_models_and_folders_outside_the_store_load_without_a_word(store, tiny_llama):
    from mlx_integrations.engine import SimpleEngine

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        SimpleEngine("tiny-q8")
        SimpleEngine("tiny")
        SimpleEngine(tiny_llama)
        assert warn_if_damaged(store.home / "no-such-model") is None
    assert damaged_warnings(caught) == []


def test_chatmlx_and_mlxllm_warn_as_they_make_their_engine(store, tmp_path, tiny_llama):
    from mlx_integrations.langchain import ChatMLX
    from mlx_integrations.llama_index import MLXLLM

    with pytest.warns(DamagedModelWarning, match="'tiny-q2'"):
        ChatMLX(model="tiny-q2", max_tokens=2)
    # Another damaged model (its own folder) for the other adapter.
    quantize_model("tiny", "other-q2", bits=2, store=store)
    with pytest.warns(DamagedModelWarning, match="'other-q2'"):
        MLXLLM(model="other-q2", max_tokens=2)


def test_mlxi_serve_warns_when_it_loads_the_model(store):
    from mlx_integrations.serve.config import ModelConfig, ServeConfig
    from mlx_integrations.serve.server import BackgroundServer

    config = ServeConfig(models=[ModelConfig("broken", source="tiny-q2", preload=True)])
    server = BackgroundServer(config)
    with pytest.warns(DamagedModelWarning, match="'tiny-q2'"):
        server.start()
    server.stop()


def test_the_warning_obeys_the_warnings_filters(store):
    path = store.get("tiny-q2").path
    # Made an error, it stops the load, and is not taken as said: the next load
    # raises again rather than pass silently.
    with warnings.catch_warnings():
        warnings.simplefilter("error", DamagedModelWarning)
        for _ in range(2):
            with pytest.raises(DamagedModelWarning):
                check_model_dir(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=DamagedModelWarning)
        check_model_dir(path)
    assert caught == []


def test_strict_keeps_no_damaged_model_and_leaves_the_store_as_it_was(store):
    before = store.get("tiny-q8").manifest
    with pytest.raises(DamagedQuantizationError) as raised:
        quantize_model("tiny", "tiny-q8", bits=2, store=store, overwrite=True, strict=True)
    error = raised.value
    assert "'tiny-q8' was not kept" in str(error) and "garbled" in str(error)
    assert error.quality is not None and error.quality.verdict == "damaged"
    assert error.hint is not None and error.hint.startswith("Quantize again with --bits 8 (or 6);")
    assert "--force" not in error.hint.split(";")[0]  # nothing was stored under the name
    assert store.get("tiny-q8").manifest == before  # the model the name held stays
    with pytest.raises(DamagedQuantizationError):
        quantize_model("tiny", "tiny-2", bits=2, store=store, strict=True)
    assert not store.contains("tiny-2")
    assert not [p for p in store.models_dir.iterdir() if p.name.startswith(".")]
    # A close result is kept as usual.
    assert quantize_model("tiny", "tiny-8", bits=8, store=store, strict=True).manifest.verdict == (
        "close"
    )


def test_strict_without_the_measurement_is_refused_before_any_work(store):
    with pytest.raises(ValueError, match="strict=True judges the measured result"):
        quantize_model("tiny", "tiny-x", bits=2, store=store, strict=True, evaluate=False)
    assert not store.contains("tiny-x")
