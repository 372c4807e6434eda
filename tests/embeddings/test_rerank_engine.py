"""The cross-encoder engine against sentence-transformers' CrossEncoder on the same weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mlx_integrations  # noqa: F401  (BLAS preload before mlx.core)
from tests.support.cross_encoders import (
    DOCUMENTS,
    QUERY,
    REFERENCE,
    WINDOW,
    write_minilm_cross_encoder,
    write_tiny_xlmr_cross_encoder,
)

# Float32 forward passes in two libraries: scores (probabilities) agree to about 1e-7.
SCORE_ATOL = 2e-6


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return json.loads(REFERENCE.read_text())


@pytest.fixture(scope="module")
def cross_encoder(minilm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_minilm_cross_encoder(minilm_path, tmp_path_factory.mktemp("ce") / "minilm-ce")


@pytest.fixture(scope="module")
def engine(cross_encoder: Path) -> Any:
    from mlx_integrations.embeddings.rerank_engine import RerankEngine

    engine = RerankEngine(cross_encoder)
    yield engine
    engine.close()


def test_scores_equal_sentence_transformers(engine: Any, reference: dict[str, Any]) -> None:
    pairs, expected = reference["minilm"]["pairs"], reference["minilm"]["scores"]
    # One call per query, documents batched together (several lengths in one batch).
    for query in dict.fromkeys(q for q, _ in pairs):
        docs = [d for q, d in pairs if q == query]
        want = [s for (q, _), s in zip(pairs, expected, strict=True) if q == query]
        got = engine.score(query, docs, batch_size=3).scores
        np.testing.assert_allclose(got, want, atol=SCORE_ATOL)


def test_pairs_are_truncated_to_the_window(engine: Any) -> None:
    assert engine.info.max_length == WINDOW
    long_doc = DOCUMENTS[3]
    result = engine.score(QUERY, [long_doc, long_doc + " More text past the window."])
    # Both are cut at the window: what lies past it changes nothing.
    assert result.scores[0] == pytest.approx(result.scores[1], abs=1e-6)
    assert result.tokens == 2 * WINDOW
    shorter = engine.score(QUERY, [long_doc], max_length=32)
    assert shorter.tokens == 32 and abs(shorter.scores[0] - result.scores[0]) > 1e-4


def test_batching_and_order_change_no_score(engine: Any) -> None:
    one_by_one = [engine.score(QUERY, [d]).scores[0] for d in DOCUMENTS]
    batched = engine.score(QUERY, DOCUMENTS, batch_size=4).scores
    backwards = engine.score(QUERY, DOCUMENTS[::-1], batch_size=2).scores[::-1]
    np.testing.assert_allclose(batched, one_by_one, atol=1e-6)
    np.testing.assert_allclose(backwards, one_by_one, atol=1e-6)


async def test_async_scores_match_sync(engine: Any) -> None:
    result = await engine.ascore(QUERY, DOCUMENTS[:3])
    np.testing.assert_allclose(result.scores, engine.score(QUERY, DOCUMENTS[:3]).scores)


def test_bad_input_is_refused_with_the_value(engine: Any) -> None:
    with pytest.raises(TypeError, match="wrap a single document in a list"):
        engine.score(QUERY, "one document")
    with pytest.raises(TypeError, match=r"documents\[1\] is a int"):
        engine.score(QUERY, ["a", 3])
    with pytest.raises(ValueError, match=f"max_length 999 exceeds the window .* {WINDOW}"):
        engine.score(QUERY, ["a"], max_length=999)
    with pytest.raises(ValueError, match="batch_size must be a positive integer, not 0"):
        engine.score(QUERY, ["a"], batch_size=0)
    assert engine.score(QUERY, []).scores == []


def test_xlm_roberta_head_matches_transformers(tmp_path: Path, reference: dict[str, Any]) -> None:
    """bge-reranker's layout: RoBERTa positions and the classifier.dense/out_proj head."""
    import mlx.core as mx

    from mlx_integrations.embeddings.cross_encoder import load_cross_encoder

    model = load_cross_encoder(write_tiny_xlmr_cross_encoder(tmp_path / "xlmr"))
    ids = mx.array(reference["xlmr"]["input_ids"])
    mask = (ids != 1).astype(mx.int32)
    scores = np.array(model.scores(ids, mask))
    expected = 1 / (1 + np.exp(-np.array(reference["xlmr"]["logits"])))
    np.testing.assert_allclose(scores, expected, atol=SCORE_ATOL)


def test_a_classifier_of_several_labels_is_refused(cross_encoder: Path, tmp_path: Path) -> None:
    from mlx_integrations.embeddings.cross_encoder import CrossEncoderConfig

    config = json.loads((cross_encoder / "config.json").read_text())
    config["id2label"] = {"0": "no", "1": "yes"}
    with pytest.raises(ValueError, match="with 2 labels; a reranker gives one score"):
        CrossEncoderConfig.from_dict(config, tmp_path)
    config = {**config, "id2label": {"0": "x"}, "sentence_transformers": {"activation_fn": "a.B"}}
    with pytest.raises(ValueError, match=r"activation 'a\.B'"):
        CrossEncoderConfig.from_dict(config, tmp_path)


def test_an_embedding_model_is_no_cross_encoder(minilm_path: Path) -> None:
    from mlx_integrations.embeddings.rerank_engine import RerankEngine

    with pytest.raises(ValueError, match="is not a cross-encoder"):
        RerankEngine(minilm_path)


def test_the_engine_is_a_resident_and_reloads(cross_encoder: Path) -> None:
    from mlx_integrations.embeddings.rerank_engine import RerankEngine
    from mlx_integrations.runtime.residency import resident_models

    engine = RerankEngine(cross_encoder, keep_alive=-1)
    try:
        kinds = {m["path"]: m["kind"] for m in resident_models()}
        assert kinds[str(cross_encoder.resolve())] == "reranker"
        before = engine.score(QUERY, DOCUMENTS[:2]).scores
        assert engine.unload_if_idle() and not engine.is_loaded
        assert engine.score(QUERY, DOCUMENTS[:2]).scores == pytest.approx(before, abs=1e-6)
        assert engine.is_loaded
    finally:
        engine.close()
