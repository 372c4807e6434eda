"""LoRA adapters for the tiny test models, saved as ``mlx_lm.lora`` saves its own.

The LoRA layers are mlx-lm's (``linear_to_lora_layers``); their ``lora_b`` matrices,
zero when a training run starts, get random values, so the adapter changes the replies.
"""

from __future__ import annotations

import json
from pathlib import Path


def build_lora_adapter(
    model_dir: Path,
    out_dir: Path,
    *,
    num_layers: int = 2,
    rank: int = 4,
    scale: float = 10.0,
    seed: int = 1,
    std: float = 0.02,
) -> Path:
    """Write ``adapters.safetensors`` and ``adapter_config.json`` for ``model_dir``.

    Args:
        model_dir: The tiny model the adapter is for.
        out_dir: The adapter folder to write.
        num_layers: The model's last layers that get LoRA layers.
        rank: LoRA rank.
        scale: LoRA scale.
        seed: Random seed of the LoRA weights.
        std: Standard deviation of the ``lora_b`` values.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(model_dir))
    lora = {"rank": rank, "scale": scale, "dropout": 0.0}
    mx.random.seed(seed)
    linear_to_lora_layers(model, num_layers, lora)
    weights = {}
    for name, value in tree_flatten(model.parameters()):
        if name.endswith("lora_b"):
            value = std * mx.random.normal(value.shape, dtype=value.dtype)
        if name.endswith(("lora_a", "lora_b")):
            weights[name] = value
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / "adapters.safetensors"), weights)
    # What mlx_lm.lora records (its arguments); mlx_lm.load reads these keys.
    config = {
        "model": str(model_dir),
        "fine_tune_type": "lora",
        "num_layers": num_layers,
        "lora_parameters": lora,
    }
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out_dir
