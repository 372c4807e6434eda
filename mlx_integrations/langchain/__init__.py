"""LangChain integration: ``ChatMLX`` (chat model), ``MLXEmbeddings``, ``MLXRerank``
(document compressor that reranks), and
``RequireToolCall`` (agent middleware for ``create_agent``; needs ``langchain>=1.0``).

Names are imported lazily so ``import mlx_integrations.langchain`` stays cheap.
"""

from mlx_integrations.lazy_imports import lazy_attributes

__all__ = ["ChatMLX", "MLXEmbeddings", "MLXRerank", "RequireToolCall"]

__getattr__ = lazy_attributes(
    __name__,
    {
        "ChatMLX": "mlx_integrations.langchain.chat_models",
        "MLXEmbeddings": "mlx_integrations.langchain.embeddings",
        "MLXRerank": "mlx_integrations.langchain.rerank",
        "RequireToolCall": "mlx_integrations.langchain.middleware",
    },
)
