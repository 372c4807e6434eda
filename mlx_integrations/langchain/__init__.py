"""LangChain integration: ``ChatMLX`` (chat model) and ``MLXEmbeddings``.

Names are imported lazily so ``import mlx_integrations.langchain`` stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ChatMLX", "MLXEmbeddings"]

_LAZY = {
    "ChatMLX": "mlx_integrations.langchain.chat_models",
    "MLXEmbeddings": "mlx_integrations.langchain.embeddings",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
