"""Cross-encoders for the rerank tests, the same on every machine, and their reference scores.

- :func:`write_minilm_cross_encoder`: all-MiniLM-L6-v2's real encoder and tokenizer
  (``tests/support/minilm.py``) under a seeded random BERT head (pooler + classifier),
  saved as a ``BertForSequenceClassification`` with a 128-token window: the size and
  layout of ms-marco-MiniLM-L-6-v2, with real tokenization of pairs and truncation.
- :func:`write_tiny_xlmr_cross_encoder`: the tiny random XLM-RoBERTa of
  ``tests/support/tiny_roberta.py`` under a seeded RoBERTa head (bge-reranker's layout).

The weights come from seeded numpy generators, so the suite rebuilds them without torch.
``tests/embeddings/data/rerank_reference.json`` holds what sentence-transformers'
``CrossEncoder.predict`` (MiniLM) and transformers' ``XLMRobertaForSequenceClassification``
(tiny XLM-R) compute with the same weights; it was made by running this file with a
Python that has torch and sentence-transformers (``python -m tests.support.cross_encoders``,
see ``bench/bench_embeddings.py`` for such an environment).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.tiny_roberta import CONFIG as XLMR_CONFIG
from tests.support.tiny_roberta import INPUT_IDS as XLMR_INPUT_IDS
from tests.support.tiny_roberta import tiny_weights as tiny_xlmr_weights

REFERENCE = Path(__file__).resolve().parents[1] / "embeddings" / "data" / "rerank_reference.json"
WINDOW = 128
"""The MiniLM cross-encoder's token window (its tokenizer's ``model_max_length``)."""

_LONG = " ".join(
    f"Section {i} of the manual explains how the pump, the valve and the filter are cleaned."
    for i in range(20)
)
QUERY = "How do I clean the filter of the pump?"
DOCUMENTS = [
    "Remove the filter, rinse it under warm water and let it dry before refitting it.",
    "The Eiffel Tower was completed in 1889.",
    "Pumps move fluids by mechanical action.",
    _LONG,  # longer than the window: truncated
    "",
    "Clean the FILTER every month; a clogged filter makes the pump overheat.",
    "Quel temps fait-il à Paris aujourd'hui ?",
]
LONG_QUERY = " ".join(["Which part of the pump should be cleaned, and how often?"] * 12)


def minilm_head_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded BERT head: the pooler and a one-label classifier."""
    rng = np.random.default_rng(seed)
    return {
        "bert.pooler.dense.weight": rng.normal(0, 0.05, (384, 384)).astype(np.float32),
        "bert.pooler.dense.bias": rng.normal(0, 0.05, (384,)).astype(np.float32),
        "classifier.weight": rng.normal(0, 0.2, (1, 384)).astype(np.float32),
        "classifier.bias": np.array([0.1], dtype=np.float32),
    }


def write_minilm_cross_encoder(minilm: Path, folder: Path) -> Path:
    """Write the MiniLM cross-encoder into ``folder`` from the all-MiniLM-L6-v2 folder."""
    import mlx.core as mx

    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads((minilm / "config.json").read_text())
    config.update(architectures=["BertForSequenceClassification"], id2label={"0": "LABEL_0"})
    config["label2id"] = {"LABEL_0": 0}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("tokenizer.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copyfile(minilm / name, folder / name)
    tok_config = json.loads((minilm / "tokenizer_config.json").read_text())
    tok_config["model_max_length"] = WINDOW
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    encoder = mx.load(str(minilm / "model.safetensors"))
    assert isinstance(encoder, dict)
    weights = {f"bert.{k}": v for k, v in encoder.items()}
    weights |= {k: mx.array(v) for k, v in minilm_head_weights().items()}
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    return folder


def xlmr_head_weights(seed: int = 1) -> dict[str, np.ndarray]:
    """Seeded RoBERTa head for the tiny XLM-R: ``classifier.dense`` and ``out_proj``."""
    rng = np.random.default_rng(seed)
    h = XLMR_CONFIG["hidden_size"]
    return {
        "classifier.dense.weight": rng.normal(0, 0.3, (h, h)).astype(np.float32),
        "classifier.dense.bias": rng.normal(0, 0.1, (h,)).astype(np.float32),
        "classifier.out_proj.weight": rng.normal(0, 0.5, (1, h)).astype(np.float32),
        "classifier.out_proj.bias": np.array([-0.2], dtype=np.float32),
    }


def xlmr_cross_encoder_config() -> dict[str, Any]:
    """The tiny XLM-R's config.json as a one-label sequence classifier."""
    return XLMR_CONFIG | {
        "architectures": ["XLMRobertaForSequenceClassification"],
        "id2label": {"0": "LABEL_0"},
        "label2id": {"LABEL_0": 0},
    }


def write_tiny_xlmr_cross_encoder(folder: Path) -> Path:
    """Write ``config.json`` and ``model.safetensors`` of the tiny XLM-R cross-encoder."""
    import mlx.core as mx

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(xlmr_cross_encoder_config()))
    weights = {f"roberta.{k}": mx.array(v) for k, v in tiny_xlmr_weights().items()}
    weights |= {k: mx.array(v) for k, v in xlmr_head_weights().items()}
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    return folder


def _make_reference() -> None:  # pragma: no cover - run by hand with torch installed
    import tempfile

    import sentence_transformers
    import torch
    import transformers
    from sentence_transformers import CrossEncoder
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    from tests.support.minilm import ensure_minilm

    with tempfile.TemporaryDirectory() as tmp:
        folder = write_minilm_cross_encoder(ensure_minilm(), Path(tmp) / "ce")
        model = CrossEncoder(str(folder), device="cpu")
        assert model.max_seq_length == WINDOW, model.max_seq_length
        pairs = [(QUERY, d) for d in DOCUMENTS] + [(LONG_QUERY, d) for d in DOCUMENTS[:2]]
        minilm_scores = model.predict(pairs, batch_size=4).tolist()
    xlmr = XLMRobertaForSequenceClassification(XLMRobertaConfig(**xlmr_cross_encoder_config()))
    state = {f"roberta.{k}": torch.from_numpy(v) for k, v in tiny_xlmr_weights().items()}
    state |= {k: torch.from_numpy(v) for k, v in xlmr_head_weights().items()}
    missing, unexpected = xlmr.load_state_dict(state, strict=False)
    assert not unexpected and all("position_ids" in m for m in missing), (missing, unexpected)
    ids = torch.tensor(XLMR_INPUT_IDS)
    mask = (ids != XLMR_CONFIG["pad_token_id"]).long()
    with torch.no_grad():
        logits = xlmr.eval()(input_ids=ids, attention_mask=mask).logits[:, 0]
    REFERENCE.write_text(
        json.dumps(
            {
                "versions": {
                    "sentence_transformers": sentence_transformers.__version__,
                    "transformers": transformers.__version__,
                    "torch": torch.__version__,
                },
                "minilm": {"pairs": pairs, "scores": minilm_scores},
                "xlmr": {"input_ids": XLMR_INPUT_IDS, "logits": logits.tolist()},
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":  # pragma: no cover
    _make_reference()
