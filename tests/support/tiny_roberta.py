"""A tiny random XLM-RoBERTa encoder, the same on every machine, and its reference output.

The weights come from a seeded numpy generator, so the test suite rebuilds them without
torch. ``tests/embeddings/data/tiny_xlmr_reference.json`` holds the last hidden states
that Hugging Face transformers' ``XLMRobertaModel`` computes with these weights on
:data:`INPUT_IDS`; it was made by running this file with a Python that has torch and
transformers (``python -m tests.support.tiny_roberta``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

CONFIG: dict[str, Any] = {
    "model_type": "xlm-roberta",
    "architectures": ["XLMRobertaModel"],
    "vocab_size": 64,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 40,
    "type_vocab_size": 1,
    "layer_norm_eps": 1e-5,
    "hidden_act": "gelu",
    "pad_token_id": 1,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "position_embedding_type": "absolute",
}
# Two rows, the first right-padded with the pad id (1), as the embedding engine pads.
INPUT_IDS = [[0, 5, 9, 23, 40, 2, 1, 1, 1], [0, 7, 8, 11, 30, 41, 17, 60, 2]]
REFERENCE = Path(__file__).resolve().parents[1] / "embeddings" / "data" / "tiny_xlmr_reference.json"


def weight_shapes(config: dict[str, Any] = CONFIG) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of ``XLMRobertaModel`` (without the pooler)."""
    h, i = config["hidden_size"], config["intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (config["vocab_size"], h),
        "embeddings.position_embeddings.weight": (config["max_position_embeddings"], h),
        "embeddings.token_type_embeddings.weight": (config["type_vocab_size"], h),
        "embeddings.LayerNorm.weight": (h,),
        "embeddings.LayerNorm.bias": (h,),
    }
    for n in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{n}."
        for name in ("query", "key", "value"):
            shapes[f"{p}attention.self.{name}.weight"] = (h, h)
            shapes[f"{p}attention.self.{name}.bias"] = (h,)
        shapes[f"{p}attention.output.dense.weight"] = (h, h)
        shapes[f"{p}attention.output.dense.bias"] = (h,)
        shapes[f"{p}attention.output.LayerNorm.weight"] = (h,)
        shapes[f"{p}attention.output.LayerNorm.bias"] = (h,)
        shapes[f"{p}intermediate.dense.weight"] = (i, h)
        shapes[f"{p}intermediate.dense.bias"] = (i,)
        shapes[f"{p}output.dense.weight"] = (h, i)
        shapes[f"{p}output.dense.bias"] = (h,)
        shapes[f"{p}output.LayerNorm.weight"] = (h,)
        shapes[f"{p}output.LayerNorm.bias"] = (h,)
    return shapes


def tiny_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded float32 weights; LayerNorm weights near 1 so every layer matters."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in weight_shapes().items():
        value = rng.normal(0.0, 0.2, size=shape).astype(np.float32)
        if "LayerNorm.weight" in name:
            value += 1.0
        out[name] = value
    return out


def write_tiny_xlmr(folder: Path, prefix: str = "") -> Path:
    """Write ``config.json`` and ``model.safetensors`` (names under ``prefix``)."""
    import mlx.core as mx

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    weights = {prefix + k: mx.array(v) for k, v in tiny_weights().items()}
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    return folder


def _make_reference() -> None:  # pragma: no cover - run by hand with torch installed
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    model = XLMRobertaModel(XLMRobertaConfig(**CONFIG), add_pooling_layer=False).eval()
    state = {k: torch.from_numpy(v) for k, v in tiny_weights().items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("position_ids" in m for m in missing), (missing, unexpected)
    ids = torch.tensor(INPUT_IDS)
    mask = (ids != CONFIG["pad_token_id"]).long()
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    REFERENCE.write_text(
        json.dumps({"input_ids": INPUT_IDS, "last_hidden_state": hidden.tolist()}) + "\n"
    )


if __name__ == "__main__":  # pragma: no cover
    _make_reference()
