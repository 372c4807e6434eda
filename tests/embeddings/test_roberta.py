"""RoBERTa-family encoders (XLM-R: multilingual-e5, bge-m3) against transformers' output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import mlx_integrations  # noqa: F401  (BLAS preload before mlx.core)
from tests.support.tiny_roberta import CONFIG, INPUT_IDS, REFERENCE, write_tiny_xlmr


@pytest.mark.parametrize("prefix", ["", "roberta."])
def test_xlm_roberta_matches_transformers(tmp_path: Path, prefix: str) -> None:
    import mlx.core as mx

    from mlx_integrations.embeddings.bert import load_bert

    model = load_bert(write_tiny_xlmr(tmp_path / "xlmr", prefix=prefix))
    ids = mx.array(INPUT_IDS)
    mask = (ids != CONFIG["pad_token_id"]).astype(mx.int32)
    ours = np.array(model(ids, attention_mask=mask))
    expected = np.array(json.loads(REFERENCE.read_text())["last_hidden_state"], dtype=np.float32)
    real = np.array(mask, dtype=bool)
    # Padded slots are ignored by pooling; every real token must match.
    np.testing.assert_allclose(ours[real], expected[real], atol=2e-5, rtol=1e-4)


def test_positions_start_after_the_padding_id(tmp_path: Path) -> None:
    """Numbering positions from 0, as BERT does, gives different vectors."""
    import mlx.core as mx

    from mlx_integrations.embeddings.bert import BertConfig, load_bert

    folder = write_tiny_xlmr(tmp_path / "xlmr")
    model = load_bert(folder)
    assert BertConfig.from_folder(folder).positions_after_padding_id
    as_bert = json.loads((folder / "config.json").read_text()) | {"model_type": "bert"}
    (folder / "config.json").write_text(json.dumps(as_bert))
    bert = load_bert(folder)
    ids = mx.array(INPUT_IDS[1:])
    mask = mx.ones_like(ids)
    assert not np.allclose(np.array(model(ids, mask)), np.array(bert(ids, mask)), atol=1e-3)
