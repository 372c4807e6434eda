"""Import a GGUF file (llama.cpp's format) as an MLX model folder.

The result is an ordinary Hugging Face style folder (``config.json``, safetensors
weights, ``tokenizer.json``, ``tokenizer_config.json`` with the chat template,
``generation_config.json``) that ``mlx_lm.load`` opens.

Supported today: the ``llama`` architecture with a GPT-2 style byte-level BPE
tokenizer (SmolLM2, Llama 3.0, and the many fine-tunes that share their layout), and
the tensor types that ``mx.load`` decodes (F32, F16, Q4_0, Q4_1, Q8_0). Quantized
tensors are dequantized; quantize the result again with ``mlx_lm.convert`` if wanted.

Example:
    >>> from mlx_integrations.models.gguf import import_gguf
    >>> path = import_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2")  # doctest: +SKIP
    >>> from mlx_lm import load
    >>> model, tokenizer = load(str(path))  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import re
import shutil
import struct
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import mlx.core as mx
    from tokenizers import Tokenizer

__all__ = ["GGUFHeader", "GGUFTensorInfo", "import_gguf", "read_gguf_header"]

logger = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
SUPPORTED_ARCHITECTURES = ("llama",)
SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")

# ggml tensor types that mx.load decodes: id -> (name, values per block, bytes per block).
_TENSOR_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    8: ("Q8_0", 32, 34),
}
# Names of the other ggml types, only to say which one a file uses.
# fmt: off
_OTHER_TENSOR_TYPES = {
    6: "Q5_0", 7: "Q5_1", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K",
    14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S",
    20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32",
    27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16",
}
# fmt: on
# mx.load unpacks Q4_0, Q4_1 and Q8_0 blocks into MLX's affine layout, 32 values a group.
_GGUF_GROUP_SIZE = 32

# GGUF metadata value types -> struct format (scalars) or a tag.
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_SCALAR_FORMATS.update({10: "<Q", 11: "<q", 12: "<d"})
_STRING, _ARRAY = 8, 9
_NUMPY_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4"}
_NUMPY_DTYPES.update({7: "?", 10: "<u8", 11: "<i8", 12: "<f8"})

# llama.cpp token types (tokenizer.ggml.token_type).
_TOKEN_UNKNOWN, _TOKEN_CONTROL, _TOKEN_USER_DEFINED = 2, 3, 4

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

# Pre-tokenizer regexes, by the name llama.cpp stores in tokenizer.ggml.pre.
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2_PRE = ("default", "gpt-2", "gpt2")
_DIGITS_THEN_GPT2_PRE = ("smollm", "starcoder", "refact")
_LLAMA3_PRE = ("llama-bpe", "llama3")


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor entry of a GGUF header.

    Attributes:
        name: GGUF tensor name, e.g. ``blk.0.attn_q.weight``.
        shape: Shape in MLX (row-major) order; GGUF stores it reversed.
        type_id: ggml type id (0 F32, 1 F16, 2 Q4_0, 3 Q4_1, 8 Q8_0, ...).
        offset: Byte offset of the data, relative to the start of the data section.
    """

    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int

    @property
    def type_name(self) -> str:
        """The ggml type name, e.g. ``Q4_1``."""
        if self.type_id in _TENSOR_TYPES:
            return _TENSOR_TYPES[self.type_id][0]
        return _OTHER_TENSOR_TYPES.get(self.type_id, f"type {self.type_id}")


@dataclass(frozen=True)
class GGUFHeader:
    """Metadata and tensor table of a GGUF file, read without touching tensor data.

    Attributes:
        path: The file.
        version: GGUF format version (2 or 3).
        metadata: Key/value metadata with plain Python values (str, int, float, bool, list).
        tensors: Tensor entries by name, in file order.
        data_offset: Absolute byte offset of the tensor data section.
        file_size: Size of the file in bytes.
    """

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensorInfo] = field(repr=False)
    data_offset: int
    file_size: int

    @property
    def architecture(self) -> str | None:
        """``general.architecture``, e.g. ``llama``."""
        value = self.metadata.get("general.architecture")
        return value if isinstance(value, str) else None


class _Reader:
    """Little-endian cursor over a memory-mapped file that reports truncation clearly."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf = buf
        self.path = path
        self.pos = 0

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise _truncated(self.path, len(self.buf), "in its header")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def raw(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.buf):
            raise _truncated(self.path, len(self.buf), "in its header")
        data = self.buf[self.pos : self.pos + size]
        self.pos += size
        return data

    def string(self) -> str:
        data = self.raw(self.unpack("<Q"))
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{self.path} has a metadata string that is not UTF-8 at byte {self.pos}; "
                "the file is corrupt. Download or export it again."
            ) from exc

    def value(self, type_id: int) -> Any:
        if type_id in _SCALAR_FORMATS:
            value = self.unpack(_SCALAR_FORMATS[type_id])
            # A float32 read into a Python float shows noise digits (1e-5 -> 9.99e-06);
            # the shortest float32 repr gives back the value that was written.
            return _float32_to_float(value) if type_id == 6 else value
        if type_id == _STRING:
            return self.string()
        if type_id == _ARRAY:
            item_type = self.unpack("<I")
            count = self.unpack("<Q")
            if item_type in _NUMPY_DTYPES:
                import numpy as np

                dtype = np.dtype(_NUMPY_DTYPES[item_type])
                data = self.raw(count * dtype.itemsize)
                values = np.frombuffer(data, dtype=dtype).tolist()
                return [_float32_to_float(v) for v in values] if item_type == 6 else values
            if count > len(self.buf) - self.pos:
                raise _truncated(self.path, len(self.buf), "in its header")
            return [self.value(item_type) for _ in range(count)]
        raise ValueError(
            f"{self.path} has a metadata value of unknown type {type_id} at byte {self.pos}; "
            "the file is corrupt or from a newer GGUF version."
        )


def _float32_to_float(value: float) -> float:
    import numpy as np

    return float(str(np.float32(value)))


def _truncated(path: Path, size: int, where: str) -> ValueError:
    return ValueError(
        f"{path} is truncated ({size:,} bytes, ends {where}); the download or copy was "
        "probably interrupted. Fetch the GGUF file again."
    )


def read_gguf_header(gguf_path: str | os.PathLike[str]) -> GGUFHeader:
    """Read the metadata and tensor table of a GGUF file, and check it is complete.

    Only the header is parsed; the tensor data is not read, so this is fast even for
    large files. The file size is checked against the end of the last tensor.

    Args:
        gguf_path: Path of the ``.gguf`` file.

    Returns:
        The parsed header.

    Raises:
        FileNotFoundError: The file does not exist.
        ValueError: The path is a folder, not a GGUF file, an unsupported GGUF version,
            or truncated.
    """
    path = Path(gguf_path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"GGUF file not found: {path}. Check the path and try again.")
    if path.is_dir():
        raise ValueError(f"{path} is a folder; pass the path of the .gguf file inside it.")
    size = path.stat().st_size
    with path.open("rb") as f:
        magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise ValueError(
                f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r}). "
                "Pass a .gguf file written by llama.cpp or a compatible tool."
            )
        if size < 24:
            raise _truncated(path, size, "in its header")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse_header(_Reader(buf, path), size)


def _parse_header(reader: _Reader, size: int) -> GGUFHeader:
    path = reader.path
    reader.pos = 4
    version = reader.unpack("<I")
    if version not in (2, 3):
        raise ValueError(
            f"{path} is GGUF version {version}; only versions 2 and 3 (little-endian) are "
            "supported. Convert it again with a recent llama.cpp."
        )
    n_tensors = reader.unpack("<Q")
    n_metadata = reader.unpack("<Q")
    # Each entry takes at least 8 bytes, so larger counts mean a damaged header.
    if max(n_tensors, n_metadata) > size // 8:
        raise _truncated(path, size, "in its header")
    metadata: dict[str, Any] = {}
    for _ in range(n_metadata):
        key = reader.string()
        metadata[key] = reader.value(reader.unpack("<I"))
    tensors: dict[str, GGUFTensorInfo] = {}
    for _ in range(n_tensors):
        name = reader.string()
        n_dims = reader.unpack("<I")
        if n_dims > 8:
            raise _truncated(path, size, "in its tensor table")
        dims = [reader.unpack("<Q") for _ in range(n_dims)]
        type_id = reader.unpack("<I")
        offset = reader.unpack("<Q")
        tensors[name] = GGUFTensorInfo(name, tuple(reversed(dims)), type_id, offset)
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0:
        raise ValueError(f"{path} has an invalid general.alignment {alignment!r}.")
    data_offset = -(-reader.pos // alignment) * alignment
    for info in tensors.values():
        if info.type_id not in _TENSOR_TYPES:
            continue  # size unknown here; import_gguf rejects the type by name
        _, block, block_bytes = _TENSOR_TYPES[info.type_id]
        count = 1
        for dim in info.shape:
            count *= dim
        end = data_offset + info.offset + -(-count // block) * block_bytes
        if end > size:
            raise _truncated(path, size, f"inside tensor {info.name!r}, which needs {end:,}")
    return GGUFHeader(path, version, metadata, tensors, data_offset, size)


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

    Example:
        >>> path = import_gguf("model.Q8_0.gguf", "models/my-model")  # doctest: +SKIP
        >>> model, tokenizer = mlx_lm.load(str(path))  # doctest: +SKIP
    """
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(SUPPORTED_DTYPES)}; got {dtype!r}.")
    out_dir = Path(out_dir).expanduser()
    if out_dir.exists() and not overwrite and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FileExistsError(
            f"{out_dir} already exists; choose another folder or pass overwrite=True."
        )
    header = read_gguf_header(gguf_path)
    _check_supported(header)
    config = _build_config(header)
    tokenizer, tokenizer_config = _build_tokenizer(header)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = out_dir.parent / f".{out_dir.name}.importing-{uuid.uuid4().hex[:8]}"
    tmp_dir.mkdir()
    try:
        _write_weights(header, config, tmp_dir, dtype)
        tokenizer.save(str(tmp_dir / "tokenizer.json"))
        _write_json(tmp_dir / "tokenizer_config.json", tokenizer_config)
        generation_config: dict[str, Any] = {
            k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config
        }
        _write_json(tmp_dir / "generation_config.json", generation_config)
        _verify_tokenizer(tmp_dir, header.path)
        _move_into_place(tmp_dir, out_dir, overwrite)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    logger.info("Imported %s into %s", header.path, out_dir)
    return out_dir


def _check_supported(header: GGUFHeader) -> None:
    """Reject what the import cannot convert faithfully, before any tensor is read."""
    path, meta = header.path, header.metadata
    arch = header.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{path}: architecture {arch!r} is not supported by the GGUF import (supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}). Convert the original Hugging Face "
            "checkpoint with mlx_lm.convert instead."
        )
    tokenizer_model = meta.get("tokenizer.ggml.model")
    if tokenizer_model != "gpt2":
        raise ValueError(
            f"{path}: tokenizer model {tokenizer_model!r} is not supported by the GGUF import "
            "(only 'gpt2', byte-level BPE). Convert the original Hugging Face checkpoint "
            "with mlx_lm.convert instead."
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _GPT2_PRE + _DIGITS_THEN_GPT2_PRE + _LLAMA3_PRE:
        raise ValueError(
            f"{path}: pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported by the GGUF "
            "import, so its tokenization could not be reproduced. Convert the original "
            "Hugging Face checkpoint with mlx_lm.convert instead."
        )
    bad_types = sorted(
        {t.type_name for t in header.tensors.values() if t.type_id not in _TENSOR_TYPES}
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


def _build_tokenizer(header: GGUFHeader) -> tuple[Tokenizer, dict[str, Any]]:
    """A ``tokenizers`` BPE tokenizer and its tokenizer_config.json, from GGUF metadata."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )

    path, meta = header.path, header.metadata
    tokens = meta.get("tokenizer.ggml.tokens")
    merges = meta.get("tokenizer.ggml.merges")
    if not tokens or not merges:
        raise ValueError(
            f"{path} lacks tokenizer.ggml.tokens or tokenizer.ggml.merges; a GPT-2 style "
            "tokenizer cannot be rebuilt without both."
        )
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise ValueError(
            f"{path} lists {len(tokens)} tokens but {len(types)} token types; "
            "its tokenizer metadata is corrupt."
        )
    rows = header.tensors["token_embd.weight"].shape[0]
    if len(tokens) > rows:
        raise ValueError(
            f"{path} lists {len(tokens)} tokens but its embedding has only {rows} rows; "
            "its tokenizer metadata does not belong to these weights."
        )
    vocab: dict[str, int] = {}
    for token_id, token in enumerate(tokens):
        vocab.setdefault(token, token_id)  # a repeated string keeps its first id
    pairs: list[tuple[str, str]] = []
    for merge in merges:
        parts = merge.split(" ")
        if len(parts) != 2:
            raise ValueError(f"{path} has a malformed merge {merge!r} in tokenizer.ggml.merges.")
        pairs.append((parts[0], parts[1]))

    pre = meta.get("tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre not in _LLAMA3_PRE)
    pre_tokenizer: pre_tokenizers.PreTokenizer
    if pre in _DIGITS_THEN_GPT2_PRE:
        # llama.cpp splits every digit first, then applies the GPT-2 regex.
        pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    elif pre in _LLAMA3_PRE:
        split = pre_tokenizers.Split(Regex(_LLAMA3_PATTERN), behavior="isolated", invert=False)
        pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    else:
        pre_tokenizer = byte_level

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre in _LLAMA3_PRE))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    special = {i: tokens[i] for i, t in enumerate(types) if t in (_TOKEN_CONTROL, _TOKEN_UNKNOWN)}
    user_defined = [tokens[i] for i, t in enumerate(types) if t == _TOKEN_USER_DEFINED]
    # Matched whole in the raw text, before pre-tokenization, as llama.cpp does.
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in special.values()]
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in user_defined])

    def token_of(key: str) -> tuple[str, int] | None:
        token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is None or not 0 <= token_id < len(tokens):
            return None
        return tokens[token_id], token_id

    bos, eos = token_of("bos"), token_of("eos")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    byte_level_post = processors.ByteLevel(trim_offsets=False)
    if add_bos or add_eos:
        ends = [end for end, on in ((bos, add_bos), (eos, add_eos)) if on and end]

        def wrap(sequence: str, type_id: int) -> str:
            items = [f"{bos[0]}:{type_id}"] if add_bos and bos else []
            items.append(f"${sequence}:{type_id}")
            items += [f"{eos[0]}:{type_id}"] if add_eos and eos else []
            return " ".join(items)

        template = processors.TemplateProcessing(
            single=wrap("A", 0), pair=f"{wrap('A', 0)} {wrap('B', 1)}", special_tokens=ends
        )
        tokenizer.post_processor = processors.Sequence([byte_level_post, template])
    else:
        tokenizer.post_processor = byte_level_post

    def name_of(key: str) -> str | None:
        found = token_of(key)
        return found[0] if found else None

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": name_of("bos"),
        "eos_token": name_of("eos"),
        "pad_token": name_of("padding"),
        "unk_token": name_of("unknown"),
        "model_max_length": meta.get(f"{header.architecture}.context_length", 2048),
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(token_id): {
                "content": token,
                "special": True,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
            }
            for token_id, token in special.items()
        },
    }
    chat_template = meta.get("tokenizer.chat_template")
    if isinstance(chat_template, str):
        config["chat_template"] = chat_template
    return tokenizer, config


def _verify_tokenizer(folder: Path, source: Path) -> None:
    """Reload the written tokenizer and check that every special token maps to one id."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    for token_id, entry in config["added_tokens_decoder"].items():
        ids = tokenizer.encode(entry["content"], add_special_tokens=False).ids
        if ids != [int(token_id)]:
            raise ValueError(
                f"{source}: the rebuilt tokenizer encodes {entry['content']!r} as {ids}, "
                f"not [{token_id}]; its vocabulary metadata is inconsistent."
            )


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _move_into_place(tmp_dir: Path, out_dir: Path, overwrite: bool) -> None:
    """Rename the finished folder to ``out_dir``; a replaced one is removed afterwards."""
    old: Path | None = None
    try:
        if out_dir.exists() and overwrite:
            old = out_dir.parent / f".{out_dir.name}.replaced-{uuid.uuid4().hex[:8]}"
            out_dir.rename(old)
        elif out_dir.is_dir():
            out_dir.rmdir()  # empty, as checked at the start; fails if it filled up since
        tmp_dir.rename(out_dir)
    except OSError as exc:
        if old is not None and not out_dir.exists():
            old.rename(out_dir)
        raise FileExistsError(
            f"{out_dir} appeared while importing; choose another folder or pass overwrite=True."
        ) from exc
    if old is not None:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()
