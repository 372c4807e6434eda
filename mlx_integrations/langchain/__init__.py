"""LangChain integration: ``ChatMLX`` (chat model) and ``MLXEmbeddings``.

Names are imported lazily so ``import mlx_integrations.langchain`` stays cheap.
"""

from mlx_integrations.lazy_imports import lazy_attributes

__all__ = ["ChatMLX", "MLXEmbeddings"]

__getattr__ = lazy_attributes(
    __name__,
    {
        "ChatMLX": "mlx_integrations.langchain.chat_models",
        "MLXEmbeddings": "mlx_integrations.langchain.embeddings",
    },
)
