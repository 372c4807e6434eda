"""A BERT encoder in MLX: the forward pass of BERT-family sentence-embedding models.

Covers the checkpoints that retrieval uses most: plain ``BertModel`` weights
(all-MiniLM, bge, e5, gte, ...) and RoBERTa / XLM-RoBERTa ones (multilingual-e5,
bge-m3, paraphrase-multilingual-mpnet's kin), which differ only in where position ids
start. The module names mirror Hugging Face's ``BertModel`` so a ``model.safetensors``
loads without renaming beyond dropping a ``bert.``/``roberta.`` prefix.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

# RoBERTa's family numbers positions from ``pad_token_id + 1``, skipping padding.
_PADDING_OFFSET_TYPES = ("roberta", "xlm-roberta", "camembert")
SUPPORTED_MODEL_TYPES = ("bert", *_PADDING_OFFSET_TYPES)

# erf(z) = z * P(z^2) / Q(z^2) on |z| <= 4 (erf(4) = 1 - 1.5e-8): a rational fit made for
# this module (Sanathanan-Koerner least squares on [0, 4]), max error 7e-8 in float64.
_ERF_P = (
    1.128378855623456,
    0.20942497439161872,
    0.051826359624375755,
    0.004097199427273658,
    0.0001505851636259864,
    -1.96817864391019e-06,
    1.9272061668740292e-08,
)
_ERF_Q = (1.0, 0.5189273001857813, 0.11892209945942783, 0.015159011288501861, 0.001049658068885478)


def _polynomial(coefficients: tuple[float, ...], t: mx.array) -> mx.array:
    # Horner's rule; Python floats keep the array's dtype.
    out = t * coefficients[-1] + coefficients[-2]
    for c in reversed(coefficients[:-2]):
        out = out * t + c
    return out


@mx.compile
def gelu_erf(x: mx.array) -> mx.array:
    """Exact (erf) GELU, with erf from a rational approximation good to 4e-7 in float32.

    Numerically the same as ``nn.gelu`` at float32 precision and several times faster
    on the CPU: it needs no ``exp`` or ``erf``, which MLX's CPU backend evaluates
    element by element, only products and one division, compiled into one kernel.
    """
    # In float32 whatever the model's type: half precision cannot hold the polynomials.
    z = mx.clip(x.astype(mx.float32) * (1 / math.sqrt(2)), -4.0, 4.0)
    t = z * z
    erf = z * _polynomial(_ERF_P, t) / _polynomial(_ERF_Q, t)
    return (0.5 * x * (1 + erf)).astype(x.dtype)


# Activations named by Hugging Face configs, as MLX functions.
_ACTIVATIONS = {
    "gelu": gelu_erf,
    "gelu_python": gelu_erf,
    "gelu_new": nn.gelu_approx,
    "gelu_pytorch_tanh": nn.gelu_approx,
    "gelu_fast": nn.gelu_fast_approx,
    "relu": nn.relu,
    "silu": nn.silu,
    "swish": nn.silu,
}


@dataclass(frozen=True)
class BertConfig:
    """The fields of a Hugging Face BERT ``config.json`` that the forward pass uses."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    model_type: str = "bert"
    pad_token_id: int = 0

    @property
    def positions_after_padding_id(self) -> bool:
        """Positions count from ``pad_token_id + 1`` over non-padding tokens (RoBERTa)."""
        return self.model_type in _PADDING_OFFSET_TYPES

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> BertConfig:
        """Build from a parsed ``config.json``, checking the model type and shapes.

        Raises:
            ValueError: For a model type or activation this encoder does not implement.
        """
        model_type = raw.get("model_type", "")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"Model type {model_type!r} is not supported by the MLX embedding engine; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)} (BERT and RoBERTa-family "
                "sentence-transformers models such as all-MiniLM-L6-v2, bge, e5, "
                "multilingual-e5, bge-m3)."
            )
        act = raw.get("hidden_act", "gelu")
        if act not in _ACTIVATIONS:
            raise ValueError(
                f"Activation {act!r} in config.json is not supported; "
                f"supported: {', '.join(sorted(_ACTIVATIONS))}."
            )
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(
                "Only absolute position embeddings are supported, not "
                f"{raw['position_embedding_type']!r}."
            )
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in raw.items() if k in names})

    @classmethod
    def from_folder(cls, folder: Path) -> BertConfig:
        """Read ``config.json`` from a model folder."""
        with open(folder / "config.json", encoding="utf-8") as f:
            return cls.from_dict(json.load(f))


class BertEmbeddings(nn.Module):
    """Word, position and token-type embeddings, summed and normalised."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self._pad = config.pad_token_id if config.positions_after_padding_id else None
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def __call__(self, input_ids: mx.array, token_type_ids: mx.array) -> mx.array:
        if self._pad is None:
            positions = mx.arange(input_ids.shape[1])[None]
        else:
            # pad + 1, pad + 2, ... over real tokens; padding keeps position ``pad``.
            real = (input_ids != self._pad).astype(mx.int32)
            positions = mx.cumsum(real, axis=1) * real + self._pad
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(positions)
            + self.token_type_embeddings(token_type_ids)
        )
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    """The query, key and value projections of one layer."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)


class BertDenseNorm(nn.Module):
    """A projection followed by the residual add and LayerNorm (BERT's "output" blocks)."""

    def __init__(self, dims_in: int, dims_out: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(dims_in, dims_out)
        self.LayerNorm = nn.LayerNorm(dims_out, eps=eps)

    def __call__(self, x: mx.array, residual: mx.array) -> mx.array:
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):
    """Multi-head self-attention with its output block."""

    def __init__(self, config: BertConfig):
        super().__init__()
        if config.hidden_size % config.num_attention_heads:
            raise ValueError(
                f"hidden_size {config.hidden_size} is not a multiple of "
                f"num_attention_heads {config.num_attention_heads}."
            )
        self.num_heads = config.num_attention_heads
        self.scale = 1.0 / math.sqrt(config.hidden_size // config.num_attention_heads)
        self.self = BertSelfAttention(config)
        self.output = BertDenseNorm(config.hidden_size, config.hidden_size, config.layer_norm_eps)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        batch, length, dims = x.shape

        def heads(t: mx.array) -> mx.array:
            return t.reshape(batch, length, self.num_heads, -1).transpose(0, 2, 1, 3)

        q = heads(self.self.query(x))
        k = heads(self.self.key(x))
        v = heads(self.self.value(x))
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        out = out.transpose(0, 2, 1, 3).reshape(batch, length, dims)
        return self.output(out, x)


class BertIntermediate(nn.Module):
    """The feed-forward expansion and its activation."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = _ACTIVATIONS[config.hidden_act]

    def __call__(self, x: mx.array) -> mx.array:
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    """One transformer encoder layer (post-LayerNorm, as in BERT)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertDenseNorm(
            config.intermediate_size, config.hidden_size, config.layer_norm_eps
        )

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        attended = self.attention(x, mask)
        return self.output(self.intermediate(attended), attended)


class BertEncoderStack(nn.Module):
    """The stack of encoder layers (``encoder.layer.N`` in checkpoints)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = [BertLayer(config) for _ in range(config.num_hidden_layers)]


class BertModel(nn.Module):
    """BERT without its pooler head: token ids in, last hidden states out.

    Examples:
        >>> import mlx_integrations  # noqa: F401  (before mlx.core, for the CPU BLAS)
        >>> import mlx.core as mx
        >>> cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
        ...                  num_attention_heads=4, intermediate_size=64)
        >>> model = BertModel(cfg)
        >>> ids = mx.array([[1, 5, 7, 2], [1, 9, 2, 0]])
        >>> model(ids, attention_mask=mx.array([[1, 1, 1, 1], [1, 1, 1, 0]])).shape
        (2, 4, 32)
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoderStack(config)

    def __call__(
        self,
        input_ids: mx.array,
        attention_mask: mx.array,
        token_type_ids: mx.array | None = None,
    ) -> mx.array:
        """Run the encoder.

        Args:
            input_ids: Token ids, shape ``(batch, length)``.
            attention_mask: 1 for real tokens and 0 for padding, shape ``(batch, length)``.
            token_type_ids: Segment ids; zeros when omitted.

        Returns:
            The last hidden states, shape ``(batch, length, hidden_size)``.
        """
        if token_type_ids is None:
            token_type_ids = mx.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)
        # Boolean key mask (True = attend), broadcast over heads and query positions.
        mask = attention_mask.astype(mx.bool_)[:, None, None, :]
        for layer in self.encoder.layer:
            x = layer(x, mask)
        return x


def sanitize_weights(
    weights: dict[str, mx.array], keep: tuple[str, ...] = ()
) -> dict[str, mx.array]:
    """Map a Hugging Face BERT checkpoint onto :class:`BertModel`'s parameter names.

    Drops the ``bert.``/``roberta.`` prefix of models saved with a head, the pooler, buffers such as
    ``position_ids``, heads (``cls.*``) and renames old ``gamma``/``beta`` LayerNorm names.

    Args:
        weights: The checkpoint's tensors.
        keep: Other name prefixes to keep (a head that a subclass of ``BertModel`` has).
    """
    out: dict[str, mx.array] = {}
    for key, value in weights.items():
        name = key.removeprefix("bert.").removeprefix("roberta.").removeprefix("model.")
        if not name.startswith(("embeddings.", "encoder.", *keep)) or name.endswith("position_ids"):
            continue
        if name.endswith(".gamma"):
            name = name[: -len("gamma")] + "weight"
        elif name.endswith(".beta"):
            name = name[: -len("beta")] + "bias"
        out[name] = value
    return out


def read_weights(folder: Path) -> dict[str, mx.array]:
    """Every tensor of the ``*.safetensors`` files of a model folder, by name.

    Raises:
        FileNotFoundError: When the folder holds no safetensors weights.
    """
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        found = ", ".join(sorted(p.name for p in folder.iterdir() if p.is_file()))
        raise FileNotFoundError(
            f"No *.safetensors weights in {folder} (found: {found}). Convert a "
            "pytorch_model.bin with transformers: "
            "AutoModel.from_pretrained(path).save_pretrained(path, safe_serialization=True)."
        )
    weights: dict[str, mx.array] = {}
    for file in files:
        loaded = mx.load(str(file))
        assert isinstance(loaded, dict)
        weights.update(loaded)
    return weights


def fill_weights(
    model: nn.Module, weights: dict[str, mx.array], folder: Path, dtype: mx.Dtype
) -> None:
    """Load ``weights`` (all of the model's, no other) into ``model`` in ``dtype``; evaluate them.

    Raises:
        ValueError: When the weights do not fit the model made from ``config.json``.
    """
    try:
        model.load_weights([(k, v.astype(dtype)) for k, v in weights.items()], strict=True)
    except ValueError as exc:
        raise ValueError(f"The weights in {folder} do not match its config.json: {exc}") from exc
    model.eval()
    mx.eval(model.parameters())


def load_bert(folder: Path, dtype: mx.Dtype = mx.float32) -> BertModel:
    """Load a BERT checkpoint (``*.safetensors``) from a model folder.

    Args:
        folder: A Hugging Face model folder with ``config.json`` and safetensors weights.
        dtype: The floating point type to compute in.

    Returns:
        The model with its weights loaded and evaluated.

    Raises:
        FileNotFoundError: When the folder holds no safetensors weights.
        ValueError: For an unsupported config, or weights that do not fit it.
    """
    model = BertModel(BertConfig.from_folder(folder))
    fill_weights(model, sanitize_weights(read_weights(folder)), folder, dtype)
    return model
