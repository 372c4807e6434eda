"""The sentence-transformers head of an embedding model: pooling and normalisation.

Reads what a sentence-transformers folder says about turning token states into one
vector (``modules.json``, ``1_Pooling/config.json``, ``sentence_bert_config.json``,
``config_sentence_transformers.json``) and implements those steps in MLX.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

if TYPE_CHECKING:
    import mlx.core as mx

PoolingMode = Literal["cls", "mean", "max", "mean_sqrt_len"]
POOLING_MODES: tuple[str, ...] = get_args(PoolingMode)

# sentence-transformers' Pooling config flags, in the order it reads them.
_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_POOLING_ALIASES = {"cls_token": "cls", "mean_tokens": "mean", "max_tokens": "max"}


@dataclass(frozen=True)
class SentenceEmbeddingConfig:
    """How a sentence-transformers model turns token states into one vector.

    Read from the model folder by :meth:`from_folder`; a folder without ``modules.json``
    (a plain Hugging Face encoder) gets sentence-transformers' defaults: mean pooling,
    no normalisation.
    """

    transformer_dir: Path
    """The folder holding ``config.json``, the weights and the tokenizer."""
    pooling: PoolingMode = "mean"
    """How token states are pooled into one vector."""
    normalize: bool = False
    """Whether vectors are scaled to unit length (a ``Normalize`` module is present)."""
    max_seq_length: int | None = None
    """The limit from ``sentence_bert_config.json``, in tokens, or None when unset."""
    do_lower_case: bool = False
    """Whether sentence-transformers lowercases text before tokenizing."""
    prompts: dict[str, str] = field(default_factory=dict)
    """Named prompts from ``config_sentence_transformers.json`` (e.g. ``query``)."""
    default_prompt_name: str | None = None
    """The prompt applied when none is given, if the model names one."""

    @classmethod
    def from_folder(cls, folder: Path) -> SentenceEmbeddingConfig:
        """Read the sentence-transformers configuration of a model folder.

        Raises:
            ValueError: For a module or pooling mode this engine does not implement.
        """
        modules_file = folder / "modules.json"
        if not modules_file.is_file():
            return cls(transformer_dir=folder, **_read_st_extras(folder, folder))
        modules = _read_json(modules_file)
        transformer_dir = folder
        pooling: PoolingMode | None = None
        normalize = False
        for module in modules:
            kind = str(module.get("type", "")).rsplit(".", 1)[-1]
            path = folder / module.get("path", "")
            # "BERT" is what sentence-transformers 0.x called the Transformer module.
            if kind in ("Transformer", "BERT"):
                transformer_dir = path
            elif kind == "Pooling":
                pooling = _read_pooling(path / "config.json")
            elif kind == "Normalize":
                normalize = True
            else:
                raise ValueError(
                    f"{modules_file} lists a {module.get('type')!r} module, which the MLX "
                    "embedding engine does not implement (it supports Transformer, Pooling "
                    "and Normalize)."
                )
        return cls(
            transformer_dir=transformer_dir,
            pooling=pooling or "mean",
            normalize=normalize,
            **_read_st_extras(folder, transformer_dir),
        )


def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _read_pooling(config_file: Path) -> PoolingMode:
    if not config_file.is_file():
        raise ValueError(
            f"modules.json lists a Pooling module but {config_file} is missing, so the "
            "pooling mode is unknown; copy the whole sentence-transformers model folder, "
            f"including its {config_file.parent.name}/ subfolder."
        )
    raw = _read_json(config_file)
    if "pooling_mode" in raw:
        modes = [_POOLING_ALIASES.get(raw["pooling_mode"], raw["pooling_mode"])]
    else:
        modes = [mode for flag, mode in _POOLING_FLAGS.items() if raw.get(flag)]
    if raw.get("include_prompt") is False:
        raise ValueError(
            f"{config_file} excludes prompt tokens from pooling (include_prompt=false); "
            "the MLX embedding engine pools over every token."
        )
    if not modes:
        return "mean"
    if len(modes) > 1 or modes[0] not in POOLING_MODES:
        raise ValueError(
            f"Pooling {modes} in {config_file} is not supported; the MLX embedding engine "
            f"supports one of {', '.join(POOLING_MODES)}."
        )
    return modes[0]


def _read_st_extras(folder: Path, transformer_dir: Path) -> dict[str, Any]:
    extras: dict[str, Any] = {}
    bert_config = transformer_dir / "sentence_bert_config.json"
    if bert_config.is_file():
        raw = _read_json(bert_config)
        extras["max_seq_length"] = raw.get("max_seq_length")
        extras["do_lower_case"] = bool(raw.get("do_lower_case", False))
    st_config = folder / "config_sentence_transformers.json"
    if st_config.is_file():
        raw = _read_json(st_config)
        extras["prompts"] = dict(raw.get("prompts") or {})
        extras["default_prompt_name"] = raw.get("default_prompt_name")
    return extras


def pool_hidden_states(hidden: mx.array, mask: mx.array, mode: PoolingMode) -> mx.array:
    """Pool token states into one vector per row, ignoring padding.

    Args:
        hidden: Token states, shape ``(batch, length, dims)``.
        mask: 1 for real tokens and 0 for padding, shape ``(batch, length)``.
        mode: ``cls`` (first token), ``mean``, ``max`` or ``mean_sqrt_len`` (the sum
            divided by the square root of the token count), as sentence-transformers.

    Returns:
        Shape ``(batch, dims)``.
    """
    import mlx.core as mx

    if mode == "cls":
        return hidden[:, 0]
    weights = mask.astype(hidden.dtype)[..., None]
    if mode == "max":
        # sentence-transformers fills padding with -1e9 before the max.
        return mx.where(weights > 0, hidden, mx.array(-1e9, dtype=hidden.dtype)).max(axis=1)
    summed = (hidden * weights).sum(axis=1)
    counts = mx.maximum(weights.sum(axis=1), 1e-9)
    if mode == "mean":
        return summed / counts
    if mode == "mean_sqrt_len":
        return summed / mx.sqrt(counts)
    raise ValueError(f"Unknown pooling mode {mode!r}; use one of {', '.join(POOLING_MODES)}.")


def normalize_vectors(vectors: mx.array, eps: float = 1e-12) -> mx.array:
    """Scale rows to unit L2 length (rows of zeros stay zero), like torch's normalize."""
    import mlx.core as mx

    norms = mx.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / mx.maximum(norms, eps)
