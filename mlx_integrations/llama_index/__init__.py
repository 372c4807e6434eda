"""LlamaIndex integration: ``MLXLLM`` (function-calling LLM), ``MLXEmbedding`` and
``MLXRerank`` (node postprocessor that reranks).

Names are imported lazily so ``import mlx_integrations.llama_index`` stays cheap.
"""

from mlx_integrations.lazy_imports import lazy_attributes

__all__ = ["MLXLLM", "MLXEmbedding", "MLXRerank", "react_grammar", "react_response_format"]

__getattr__ = lazy_attributes(
    __name__,
    {
        "MLXLLM": "mlx_integrations.llama_index.llm",
        "MLXEmbedding": "mlx_integrations.llama_index.embedding",
        "MLXRerank": "mlx_integrations.llama_index.rerank",
        "react_grammar": "mlx_integrations.llama_index.react",
        "react_response_format": "mlx_integrations.llama_index.react",
    },
)
