"""An adapter folder as ``mlx_lm.lora`` writes it: read, checked, applied to a model.

A folder holds ``adapter_config.json`` (the fine-tune type, the layers it covers and
the LoRA rank and scale) and ``adapters.safetensors`` (the trained weights). The checks
here run before any model loads, so a wrong path is refused where it is given; whether
the weights fit a model is mlx-lm's check, at load (:func:`apply_adapter`).
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlx_integrations.models.errors import JSONFileError
from mlx_integrations.models.folders import read_json

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapters.safetensors"
FINE_TUNE_TYPES = ("lora", "dora", "full")
"""What ``mlx_lm.lora --fine-tune-type`` trains, and ``mlx_lm.load`` applies."""


@dataclass(frozen=True)
class AdapterInfo:
    """A checked adapter folder.

    Attributes:
        path: The folder, absolute.
        fine_tune_type: ``"lora"``, ``"dora"`` or ``"full"`` (the last layers' weights).
        num_layers: How many of the model's last layers it changes.
        rank: The LoRA rank (None for ``"full"``).
        scale: The LoRA scale (None for ``"full"``).
        base_model: The model it was trained on, as ``mlx_lm.lora`` recorded it
            (``"model"`` in its config), or None.
        size_bytes: The size of ``adapters.safetensors``.
    """

    path: Path
    fine_tune_type: str
    num_layers: int
    rank: int | None
    scale: float | None
    base_model: str | None
    size_bytes: int

    @property
    def weights(self) -> Path:
        """The adapter's weight file."""
        return self.path / ADAPTER_WEIGHTS

    @property
    def config_file(self) -> Path:
        """The adapter's config file."""
        return self.path / ADAPTER_CONFIG


def read_adapter(adapter_path: Any) -> AdapterInfo:
    """Check an adapter folder (as ``mlx_lm.lora --adapter-path`` wrote it) and read it.

    Args:
        adapter_path: The folder (str or Path; ``~`` is expanded).

    Returns:
        What the folder holds, with its absolute path.

    Raises:
        TypeError: Not a path. ValueError: the folder is missing, lacks one of its two
            files, or its config is unreadable or not one ``mlx_lm.load`` can apply.

    Examples:
        >>> read_adapter("adapters").rank  # doctest: +SKIP
        8
    """
    if isinstance(adapter_path, bool) or not isinstance(adapter_path, (str, os.PathLike)):
        raise TypeError(
            f"adapter_path must be a folder path (str or Path), got {adapter_path!r}; "
            "pass the folder mlx_lm.lora wrote (its --adapter-path), or None for no adapter"
        )
    if not str(adapter_path).strip():
        raise ValueError("adapter_path is empty; pass the folder mlx_lm.lora wrote")
    folder = Path(os.path.abspath(Path(adapter_path).expanduser()))
    given = str(adapter_path)
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise ValueError(
            f"adapter_path={given!r} {what}; pass the folder that mlx_lm.lora wrote "
            f"(its --adapter-path), which holds {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}"
        )
    missing = [name for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS) if not (folder / name).is_file()]
    if missing:
        raise ValueError(
            f"adapter_path={given!r} has no {' and no '.join(missing)}; an adapter folder "
            f"holds {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}, as mlx_lm.lora writes them "
            "(a checkpoint such as 0000100_adapters.safetensors: copy it to "
            f"{ADAPTER_WEIGHTS} beside the config)"
        )
    try:
        config = read_json(folder / ADAPTER_CONFIG)
    except (OSError, JSONFileError) as exc:
        raise ValueError(f"adapter_path={given!r}: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{folder / ADAPTER_CONFIG} holds no JSON object; it is no adapter config")
    return _read_config(folder, config)


def _read_config(folder: Path, config: dict[str, Any]) -> AdapterInfo:
    where = folder / ADAPTER_CONFIG
    kind = config.get("fine_tune_type", "lora")
    if kind not in FINE_TUNE_TYPES:
        raise ValueError(
            f"{where}: fine_tune_type {kind!r} is none that mlx-lm applies "
            f"({', '.join(FINE_TUNE_TYPES)})"
        )
    layers = config.get("num_layers")
    if isinstance(layers, bool) or not isinstance(layers, int):
        raise ValueError(
            f"{where}: num_layers must be an integer (the layers the adapter covers), "
            f"got {layers!r}"
        )
    rank = scale = None
    if kind != "full":
        lora = config.get("lora_parameters")
        if not isinstance(lora, dict):
            raise ValueError(f"{where}: lora_parameters (rank, scale, dropout) are missing")
        rank, scale = lora.get("rank"), lora.get("scale")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"{where}: lora_parameters.rank must be an integer >= 1, got {rank!r}")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            hint = " (mlx-lm takes 'scale', not 'alpha')" if "alpha" in lora else ""
            raise ValueError(f"{where}: lora_parameters.scale must be a number{hint}")
        if not math.isfinite(scale):
            raise ValueError(f"{where}: lora_parameters.scale must be finite, got {scale!r}")
        if not isinstance(lora.get("dropout", 0.0), (int, float)):
            raise ValueError(f"{where}: lora_parameters.dropout must be a number")
    base = config.get("model")
    return AdapterInfo(
        path=folder,
        fine_tune_type=str(kind),
        num_layers=layers,
        rank=rank,
        scale=float(scale) if scale is not None else None,
        base_model=str(base) if isinstance(base, str) and base else None,
        size_bytes=(folder / ADAPTER_WEIGHTS).stat().st_size,
    )


def check_text_model(config: dict[str, Any], model_name: str, adapter_path: Any) -> None:
    """Refuse an adapter for a vision-language model (config.json with a ``vision_config``).

    mlx-lm's adapters are for the text models mlx-lm loads; mlx-vlm trains and loads
    its own, in another layout.

    Raises:
        ValueError: ``adapter_path`` is set and the model is a vision-language model.
    """
    if adapter_path is not None and isinstance(config.get("vision_config"), dict):
        raise ValueError(
            f"{model_name!r} is a vision-language model; adapter_path={str(adapter_path)!r} "
            "takes an adapter of mlx_lm.lora, for text models only: drop adapter_path"
        )


def adapter_identity(adapter_path: str | Path) -> str:
    """A cheap identity of an adapter: it changes when its config or weights do.

    The config's bytes, and the size and modification time of the weights (not read),
    as :func:`~mlx_integrations.models.manifest.model_identity` does for a model.
    """
    folder = Path(adapter_path)
    h = hashlib.sha256(b"mlxi-adapter-identity/1\n")
    h.update((folder / ADAPTER_CONFIG).read_bytes())
    st = (folder / ADAPTER_WEIGHTS).stat()
    h.update(f"{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def adapter_bytes(adapter_path: str | Path | None) -> int:
    """The size of an adapter's weights on disk (what loading it adds); 0 for None or a
    folder that cannot be read (its load says what is wrong)."""
    if adapter_path is None:
        return 0
    try:
        return (Path(adapter_path) / ADAPTER_WEIGHTS).stat().st_size
    except OSError:
        return 0


def apply_adapter(model: Any, adapter_path: str | Path, model_name: str) -> Any:
    """Apply an adapter to a loaded mlx-lm model, as ``mlx_lm.load(adapter_path=...)`` does.

    mlx-lm's ``load_adapters`` turns the covered layers into LoRA (or DoRA) layers and
    loads the adapter's weights into them; the model is then put in eval mode (no
    dropout) and its new weights are read.

    Returns:
        The model with the adapter applied.

    Raises:
        ValueError: The adapter's weights do not fit this model (trained on another
            one), with mlx-lm's list of the tensors that differ.
    """
    import mlx.core as mx
    from mlx_lm.utils import load_adapters

    try:
        model = load_adapters(model, str(adapter_path))
    except (ValueError, KeyError) as exc:
        base = _trained_on(Path(adapter_path))
        raise ValueError(
            f"The adapter at {adapter_path} does not fit {model_name!r}"
            + (f" (it was trained on {base!r})" if base else "")
            + f": {exc}; pass the model it was trained on"
        ) from exc
    model.eval()
    mx.eval(model.parameters())
    return model


def _trained_on(folder: Path) -> str | None:
    try:
        config = read_json(folder / ADAPTER_CONFIG)
    except (OSError, JSONFileError):
        return None
    base = config.get("model") if isinstance(config, dict) else None
    return base if isinstance(base, str) and base else None
