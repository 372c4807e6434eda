"""Import a GGUF file (llama.cpp's format) as an MLX model folder.

The result is an ordinary Hugging Face style folder (``config.json``, safetensors
weights, ``tokenizer.json``, ``tokenizer_config.json`` with the chat template,
``generation_config.json``) that ``mlx_lm.load`` opens.

Supported today: the ``llama`` architecture with a GPT-2 style byte-level BPE
tokenizer (SmolLM2, Llama 3.0, and the many fine-tunes that share their layout), and
the tensor types that ``mx.load`` decodes (F32, F16, Q4_0, Q4_1, Q8_0). Quantized
tensors are dequantized; quantize the result again with ``mlx_lm.convert`` if wanted.

Examples:
    >>> from mlx_integrations.models.gguf.convert import import_gguf
    >>> path = import_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2")  # doctest: +SKIP
    >>> from mlx_lm import load
    >>> model, tokenizer = load(str(path))  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlx_integrations.models.folders import (
    building_folder,
    discard,
    rename_into_place,
    write_json,
)
from mlx_integrations.models.gguf.reader import (
    TENSOR_TYPES,
    GGUFHeader,
    GGUFTensorInfo,
    read_gguf_header,
)
from mlx_integrations.models.gguf.tokenizer import (
    build_tokenizer,
    check_tokenizer,
    verify_tokenizer,
)

if TYPE_CHECKING:
    import mlx.core as mx

__all__ = [
    "GGUFHeader",
    "GGUFTensorInfo",
    "convert_gguf",
    "import_gguf",
    "read_gguf_header",
    "read_supported_gguf",
]

logger = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("llama",)
SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")
# mx.load unpacks Q4_0, Q4_1 and Q8_0 blocks into MLX's affine layout, 32 values a group.
_GGUF_GROUP_SIZE = 32

# GGUF tensor names of a llama block -> the Hugging Face / mlx-lm module names.
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSOR_RE = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def import_gguf(
    gguf_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    dtype: str = "float32",
    overwrite: bool = False,
) -> Path:
    """Convert a GGUF file into an MLX model folder that ``mlx_lm.load`` opens.

    Weights are renamed to the Hugging Face names, llama.cpp's Q/K row permutation is
    undone, and quantized tensors are dequantized to ``dtype``. The tokenizer is rebuilt
    from the GGUF vocabulary, merges and token types; the chat template is kept verbatim.

    The folder is built next to ``out_dir`` under a hidden temporary name, verified
    (every weight is loaded strictly into the mlx-lm model), then renamed into place,
    so an import that fails or is interrupted leaves no folder at ``out_dir``.
    (:func:`mlx_integrations.models.import_model` converts into the store instead.)

    Args:
        gguf_path: The ``.gguf`` file.
        out_dir: Folder to create. It must not exist (or be empty) unless ``overwrite``.
        dtype: Weight dtype of the result: ``float32``, ``float16`` or ``bfloat16``.
        overwrite: Replace an existing ``out_dir``.

    Returns:
        The model folder (``out_dir``).

    Raises:
        FileNotFoundError: ``gguf_path`` does not exist.
        FileExistsError: ``out_dir`` holds files and ``overwrite`` is False.
        ValueError: The file is not a complete GGUF file, or uses an architecture,
            tokenizer or tensor type that the import does not support.

    Examples:
        >>> path = import_gguf("model.Q8_0.gguf", "models/my-model")  # doctest: +SKIP
        >>> model, tokenizer = mlx_lm.load(str(path))  # doctest: +SKIP
    """
    _check_dtype(dtype)
    out_dir = Path(out_dir).expanduser()
    if out_dir.exists() and not overwrite and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FileExistsError(
            f"{out_dir} already exists; choose another folder or pass overwrite=True."
        )
    header = read_supported_gguf(gguf_path)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with building_folder(
        out_dir.parent / f".{out_dir.name}.importing-{uuid.uuid4().hex[:8]}"
    ) as tmp:
        convert_gguf(header, tmp, dtype=dtype)
        try:
            replaced = rename_into_place(tmp, out_dir, replace=overwrite)
        except OSError as exc:
            raise FileExistsError(
                f"{out_dir} appeared while importing; choose another folder or pass overwrite=True."
            ) from exc
    discard(replaced)
    logger.info("Imported %s into %s", header.path, out_dir)
    return out_dir


def read_supported_gguf(gguf_path: str | os.PathLike[str]) -> GGUFHeader:
    """Read a GGUF header and reject what the import cannot convert, before any tensor is read.

    Raises:
        FileNotFoundError: The file does not exist.
        ValueError: Not a complete GGUF file, or an unsupported architecture, tokenizer
            or tensor type.
    """
    header = read_gguf_header(gguf_path)
    _check_supported(header)
    return header


def convert_gguf(header: GGUFHeader, folder: Path, *, dtype: str = "float32") -> None:
    """Write the model files of a GGUF file (see :func:`read_supported_gguf`) into ``folder``.

    ``folder`` is a build folder (:func:`building_folder`, :meth:`ModelStore.building`):
    it is left half-written when this raises.
    """
    _check_dtype(dtype)
    config = _build_config(header)
    tokenizer, tokenizer_config = build_tokenizer(header)
    _write_weights(header, config, folder, dtype)
    tokenizer.save(str(folder / "tokenizer.json"))
    write_json(folder / "tokenizer_config.json", tokenizer_config)
    generation_config: dict[str, Any] = {
        k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config
    }
    write_json(folder / "generation_config.json", generation_config)
    verify_tokenizer(folder, header.path)


def _check_dtype(dtype: str) -> None:
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(SUPPORTED_DTYPES)}; got {dtype!r}.")


def _check_supported(header: GGUFHeader) -> None:
    """Reject what the import cannot convert faithfully, before any tensor is read."""
    path = header.path
    arch = header.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{path}: architecture {arch!r} is not supported by the GGUF import (supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}). Convert the original Hugging Face "
            "checkpoint with mlx_lm.convert instead."
        )
    check_tokenizer(header)
    bad_types = sorted(
        {t.type_name for t in header.tensors.values() if t.type_id not in TENSOR_TYPES}
    )
    if bad_types:
        raise ValueError(
            f"{path} uses tensor types {', '.join(bad_types)}, which mx.load cannot decode. "
            "Use an F16, Q8_0, Q4_0 or Q4_1 GGUF of the model (llama.cpp's llama-quantize "
            "can write one)."
        )
    if "rope_freqs.weight" in header.tensors:
        raise ValueError(
            f"{path} carries per-frequency RoPE factors (rope_freqs.weight, Llama 3.1 style), "
            "which the GGUF import does not support yet. Convert the original Hugging Face "
            "checkpoint with mlx_lm.convert instead."
        )
    unknown = [name for name in header.tensors if _hf_name(name) is None]
    if unknown:
        raise ValueError(
            f"{path} has tensors that a llama model does not use: {', '.join(unknown[:5])}"
            f"{' ...' if len(unknown) > 5 else ''}. It is probably another architecture "
            "stored under the name 'llama'; convert the original checkpoint instead."
        )


def _hf_name(gguf_name: str) -> str | None:
    """The mlx-lm weight name of a GGUF tensor, or None if a llama model has no such tensor."""
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    match = _LAYER_TENSOR_RE.fullmatch(gguf_name)
    if match and match.group(2) in _LAYER_TENSORS:
        return f"model.layers.{match.group(1)}.{_LAYER_TENSORS[match.group(2)]}.weight"
    return None


def _build_config(header: GGUFHeader) -> dict[str, Any]:
    """The mlx-lm / Hugging Face config.json of a llama GGUF."""
    path, meta = header.path, header.metadata
    arch = header.architecture

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"{path} lacks the metadata key {arch}.{key}; the file is incomplete.")
        if isinstance(value, list):
            raise ValueError(
                f"{path}: {arch}.{key} varies per layer, which the GGUF import does not support."
            )
        return value

    hidden = get("embedding_length")
    heads = get("attention.head_count")
    head_dim = get("attention.key_length", hidden // heads)
    if get("rope.dimension_count", head_dim) != head_dim:
        raise ValueError(
            f"{path}: RoPE covers {get('rope.dimension_count')} of {head_dim} dimensions per "
            "head; partial rotary embeddings are not supported by the GGUF import."
        )
    if "token_embd.weight" not in header.tensors:
        raise ValueError(f"{path} has no token_embd.weight tensor; the file is incomplete.")
    vocab_size = header.tensors["token_embd.weight"].shape[0]
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": get("context_length", 2048),
        "vocab_size": vocab_size,
        # llama.cpp writes no output.weight when the head shares the embedding.
        "tie_word_embeddings": "output.weight" not in header.tensors,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
    }
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": get("rope.scaling.factor")}
    elif scaling != "none":
        raise ValueError(
            f"{path}: RoPE scaling {scaling!r} is not supported by the GGUF import (only linear)."
        )
    for key, gguf_key in (("bos_token_id", "bos_token_id"), ("pad_token_id", "padding_token_id")):
        token_id = meta.get(f"tokenizer.ggml.{gguf_key}")
        if token_id is not None:
            config[key] = token_id
    # Generation ends at end-of-sequence and, for chat models, end-of-turn/message.
    eos_ids: list[int] = []
    for key in ("eos", "eot", "eom"):
        token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None and token_id not in eos_ids:
            eos_ids.append(token_id)
    if eos_ids:
        config["eos_token_id"] = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    return config


def _write_weights(header: GGUFHeader, config: dict[str, Any], out: Path, dtype: str) -> None:
    """Load, rename, dequantize and un-permute the tensors, then save them as safetensors."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama
    from mlx_lm.utils import save_config, save_model

    try:
        raw = mx.load(str(header.path))
    except RuntimeError as exc:
        raise ValueError(f"mx.load could not read the tensors of {header.path}: {exc}") from exc
    assert isinstance(raw, dict)
    target = getattr(mx, dtype)
    weights: dict[str, mx.array] = {}
    for name in header.tensors:
        hf_name = _hf_name(name)
        assert hf_name is not None  # _check_supported rejected unknown names
        weight = _dequantize(raw, name.removesuffix(".weight"))
        if name.endswith(("attn_q.weight", "attn_k.weight")):
            heads_key = "num_attention_heads" if "attn_q" in name else "num_key_value_heads"
            weight = _unpermute_rows(weight, config[heads_key], header.path, name)
        weights[hf_name] = weight.astype(target)
    del raw

    model = llama.Model(llama.ModelArgs.from_dict(config))
    try:
        # Strict: every parameter present with the right shape, nothing extra.
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise ValueError(
            f"The tensors of {header.path} do not fit a llama model with its metadata: {exc}"
        ) from exc
    del weights
    mx.eval(dict(tree_flatten(model.parameters())))
    save_model(out, model, donate_model=True)
    save_config({**config, "torch_dtype": dtype}, out / "config.json")


def _dequantize(raw: dict[str, mx.array], prefix: str) -> mx.array:
    """The float32 values of one tensor, whether mx.load returned it plain or packed."""
    import mlx.core as mx

    weight = raw[f"{prefix}.weight"]
    if f"{prefix}.scales" not in raw:
        return weight.astype(mx.float32)
    scales = raw[f"{prefix}.scales"].astype(mx.float32)
    biases = raw[f"{prefix}.biases"].astype(mx.float32)
    bits = weight.shape[-1] * 32 // (scales.shape[-1] * _GGUF_GROUP_SIZE)
    # Scales and offsets in float32, as llama.cpp dequantizes, not in their stored float16.
    return mx.dequantize(weight, scales, biases, group_size=_GGUF_GROUP_SIZE, bits=bits)


def _unpermute_rows(weight: mx.array, n_heads: int, path: Path, name: str) -> mx.array:
    """Undo llama.cpp's Q/K row order.

    llama.cpp's converter interleaves the two halves of each head's rows so that its
    RoPE can rotate adjacent pairs; mlx-lm (like Hugging Face) rotates the two halves.
    """
    rows = weight.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"{path}: {name} has {rows} rows, not a multiple of 2 x {n_heads} heads.")
    grouped = weight.reshape(n_heads, rows // n_heads // 2, 2, *weight.shape[1:])
    return grouped.swapaxes(1, 2).reshape(weight.shape)
