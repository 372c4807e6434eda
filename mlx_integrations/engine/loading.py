"""Finding and checking a model folder before MLX touches it."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from mlx_integrations.models.resolve import resolve_model
from mlx_integrations.models.store import lease_model_folder


def resolve_model_path(model: str | Path) -> Path:
    """Turn a model name into a local folder.

    Accepts a folder path, and (when the model store is installed) a store alias or
    a Hugging Face repo id already pulled with ``mlxi pull``.

    Raises:
        FileNotFoundError: Nothing by that name exists locally.
    """
    if not isinstance(model, (str, Path)) or not str(model).strip():
        raise TypeError(f"model must be a folder path or a model name, got {model!r}")
    path = Path(model).expanduser()
    if path.exists() and path.is_dir():
        return path.resolve()
    text = str(model)
    path_like = path.is_absolute() or text.startswith((".", "~")) or text.count("/") > 1
    if path_like and not path.is_file():
        raise FileNotFoundError(
            f"{text!r} is not a folder; pass the folder of an MLX model (with config.json "
            "and *.safetensors), a .gguf file, or a model name from `mlxi list`"
        )
    try:
        return Path(resolve_model(text))
    except LookupError as exc:
        hint = getattr(exc, "hint", None)
        raise FileNotFoundError(f"{exc} {hint}" if hint else str(exc)) from exc


def lease_model(path: Path) -> Any:
    """Mark a store model as in use by this process (so ``mlxi rm`` keeps it).

    Returns:
        A lease with ``release()``, or None for a folder outside the model store.
    """
    return lease_model_folder(path)


def check_safetensors(path: Path) -> None:
    """Raise ValueError if a safetensors file is truncated or not safetensors at all."""
    size = path.stat().st_size
    fix = "re-download or re-convert the model"
    if size < 8:
        raise ValueError(f"{path} is truncated ({size} bytes); {fix}")
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > size - 8 or header_len > 100 * 1024 * 1024:
            raise ValueError(f"{path} is not a valid safetensors file (bad header); {fix}")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path} has a corrupt safetensors header; {fix}") from exc
    end = max(
        (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
        default=0,
    )
    if 8 + header_len + end > size:
        raise ValueError(
            f"{path} is truncated: it holds {size} bytes but its header needs "
            f"{8 + header_len + end}; {fix}"
        )


def check_model_dir(path: Path) -> dict[str, Any]:
    """Check that ``path`` looks like a loadable MLX/HF model; return its config.

    Raises:
        FileNotFoundError: The folder, config.json or the weights are missing.
        ValueError: config.json or a weights file is corrupt.
    """
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a folder; pass the folder of an MLX model")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(
            f"{path} is not a model folder: it has no config.json; pass a folder made by "
            "mlx_lm.convert, `mlxi pull` or `mlxi import`"
        )
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{config_file} is not valid JSON: {exc}") from exc
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(
            f"{path} has no *.safetensors weights; convert the model with `mlxi import` "
            "or mlx_lm.convert"
        )
    for file in weights:
        check_safetensors(file)
    return config


def context_length(config: dict[str, Any]) -> int | None:
    """The model's context window from its config, when it says."""
    for key in ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length"):
        value = config.get(key) or (config.get("text_config") or {}).get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def vocab_size(config: dict[str, Any]) -> int | None:
    """Width of the model's logits from its config (may exceed the tokenizer's vocabulary)."""
    for section in (config, config.get("text_config") or {}):
        value = section.get("vocab_size")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
