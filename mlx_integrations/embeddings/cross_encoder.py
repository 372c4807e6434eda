"""Cross-encoders in MLX: a BERT-family encoder with its sequence-classification head.

A cross-encoder reads a query and a document together and gives one relevance score,
which is what sentence-transformers' ``CrossEncoder`` loads from a Hugging Face
``*ForSequenceClassification`` checkpoint (ms-marco-MiniLM, bge-reranker, mxbai-rerank
v1...). Two heads are covered, on the first token's state:

- BERT: the pooler (dense + tanh), then ``classifier``;
- RoBERTa / XLM-RoBERTa (bge-reranker-base/large/v2-m3): ``classifier.dense`` + tanh,
  then ``classifier.out_proj``.

The score of a one-label model goes through the activation its config names
(sentence-transformers' default: a sigmoid), as ``CrossEncoder.predict`` does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn

from mlx_integrations.embeddings.bert import (
    SUPPORTED_MODEL_TYPES,
    BertConfig,
    BertModel,
    fill_weights,
    read_weights,
    sanitize_weights,
)

HeadFamily = Literal["bert", "roberta"]
Activation = Literal["sigmoid", "identity"]

# The activations sentence-transformers saves in config.json, by their torch path.
_ACTIVATIONS: dict[str, Activation] = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.Identity": "identity",
}


def is_cross_encoder_config(config: dict[str, Any]) -> bool:
    """Whether a parsed ``config.json`` is a BERT-family sequence classifier."""
    architectures = config.get("architectures") or []
    return config.get("model_type") in SUPPORTED_MODEL_TYPES and any(
        str(a).endswith("ForSequenceClassification") for a in architectures
    )


@dataclass(frozen=True)
class CrossEncoderConfig:
    """What the head of a cross-encoder is, read from its ``config.json``."""

    family: HeadFamily
    """``bert`` (pooler + classifier) or ``roberta`` (classifier.dense + out_proj)."""
    activation: Activation
    """What turns the logit into the score."""

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: Path) -> CrossEncoderConfig:
        """Read the head from a parsed ``config.json`` (``where`` names it in errors).

        Raises:
            ValueError: Not a one-label BERT-family classifier, or an activation that
                is neither a sigmoid nor the identity.
        """
        if not is_cross_encoder_config(raw):
            raise ValueError(
                f"{where} is not a cross-encoder: its config.json should name a BERT-family "
                f"*ForSequenceClassification architecture (model_type {raw.get('model_type')!r}, "
                f"architectures {raw.get('architectures')!r}). Rerank with a cross-encoder "
                "(ms-marco-MiniLM, bge-reranker) or an LLM reranker (Qwen3-Reranker)."
            )
        labels = raw.get("num_labels") or len(raw.get("id2label") or {}) or 2
        if labels != 1:
            raise ValueError(
                f"{where} is a classifier with {labels} labels; a reranker gives one score "
                "per pair (num_labels 1 in config.json), as ms-marco-MiniLM and bge-reranker do."
            )
        st = raw.get("sentence_transformers") or {}
        path = st.get("activation_fn") or raw.get("sbert_ce_default_activation_function")
        if path is None:
            activation: Activation = "sigmoid"  # sentence-transformers' default for one label
        elif path in _ACTIVATIONS:
            activation = _ACTIVATIONS[path]
        else:
            raise ValueError(
                f"{where} asks for the activation {path!r}; the MLX reranker supports "
                f"{', '.join(sorted(_ACTIVATIONS))}."
            )
        family: HeadFamily = "bert" if raw["model_type"] == "bert" else "roberta"
        return cls(family=family, activation=activation)


class _Dense(nn.Module):
    """A ``dense`` projection (BERT's pooler)."""

    def __init__(self, dims: int):
        super().__init__()
        self.dense = nn.Linear(dims, dims)


class _RobertaHead(nn.Module):
    """RoBERTa's classification head: ``dense`` + tanh, then ``out_proj``."""

    def __init__(self, dims: int):
        super().__init__()
        self.dense = nn.Linear(dims, dims)
        self.out_proj = nn.Linear(dims, 1)


class CrossEncoderModel(BertModel):
    """A BERT-family encoder with a one-label classification head.

    Examples:
        >>> import mlx_integrations  # noqa: F401  (before mlx.core, for the CPU BLAS)
        >>> import mlx.core as mx
        >>> cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
        ...                  num_attention_heads=4, intermediate_size=64)
        >>> model = CrossEncoderModel(cfg, CrossEncoderConfig("bert", "sigmoid"))
        >>> ids = mx.array([[1, 5, 2, 7, 2], [1, 9, 2, 4, 0]])
        >>> mask = mx.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
        >>> model.scores(ids, mask).shape
        (2,)
    """

    def __init__(self, config: BertConfig, head: CrossEncoderConfig):
        super().__init__(config)
        self.head = head
        dims = config.hidden_size
        if head.family == "bert":
            self.pooler = _Dense(dims)
            self.classifier: nn.Module = nn.Linear(dims, 1)
        else:
            self.classifier = _RobertaHead(dims)

    def scores(
        self, input_ids: mx.array, attention_mask: mx.array, token_type_ids: mx.array | None = None
    ) -> mx.array:
        """One score per row, in float32, after the head's activation.

        Args:
            input_ids: Token ids of (query, document) pairs, shape ``(batch, length)``.
            attention_mask: 1 for real tokens and 0 for padding.
            token_type_ids: Segment ids (0 for the query, 1 for the document in BERT).

        Returns:
            Shape ``(batch,)``.
        """
        first = self(input_ids, attention_mask, token_type_ids)[:, 0]
        if self.head.family == "bert":
            logits = self.classifier(mx.tanh(self.pooler.dense(first)))
        else:
            head = self.classifier
            logits = head.out_proj(mx.tanh(head.dense(first)))
        logits = logits[:, 0].astype(mx.float32)
        return mx.sigmoid(logits) if self.head.activation == "sigmoid" else logits


def load_cross_encoder(folder: Path, dtype: mx.Dtype = mx.float32) -> CrossEncoderModel:
    """Load a cross-encoder checkpoint (``*.safetensors``) from a model folder.

    Raises:
        FileNotFoundError: When the folder holds no safetensors weights.
        ValueError: Not a one-label BERT-family classifier, or weights that do not fit.
    """
    with open(folder / "config.json", encoding="utf-8") as f:
        raw = json.load(f)
    head = CrossEncoderConfig.from_dict(raw, folder)
    model = CrossEncoderModel(BertConfig.from_dict(raw), head)
    weights = sanitize_weights(read_weights(folder), keep=("pooler.", "classifier."))
    fill_weights(model, weights, folder, dtype)
    return model
