"""LangChain integration: ``ChatMLX`` (chat model), ``MLXEmbeddings``, and
``RequireToolCall`` (agent middleware for ``create_agent``; needs ``langchain>=1.0``).

Names are imported lazily so ``import mlx_integrations.langchain`` stays cheap.
"""

from mlx_integrations.lazy_imports import lazy_attributes

__all__ = ["ChatMLX", "MLXEmbeddings", "RequireToolCall"]

__getattr__ = lazy_attributes(
    __name__,
    {
        "ChatMLX": "mlx_integrations.langchain.chat_models",
        "MLXEmbeddings": "mlx_integrations.langchain.embeddings",
        "RequireToolCall": "mlx_integrations.langchain.middleware",
    },
)
