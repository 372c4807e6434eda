"""LlamaIndex integration: ``MLXLLM`` (function-calling LLM) and ``MLXEmbedding``.

Names are imported lazily so ``import mlx_integrations.llama_index`` stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MLXLLM", "MLXEmbedding", "react_grammar", "react_response_format"]

_LAZY = {
    "MLXLLM": "mlx_integrations.llama_index.llm",
    "MLXEmbedding": "mlx_integrations.llama_index.embedding",
    "react_grammar": "mlx_integrations.llama_index.react",
    "react_response_format": "mlx_integrations.llama_index.react",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
