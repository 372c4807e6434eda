"""Sentence embeddings and reranking on MLX: a layer of its own, beside the generative engines.

- :mod:`.engine`: ``EmbeddingEngine``, its owner thread, and one shared engine per model;
- :mod:`.rerank_engine`: ``RerankEngine``, the same for cross-encoders;
- :mod:`.encoder_engine`: what both engines share (owner thread, residency, pool);
- :mod:`.bert`: the BERT-family encoder (BERT, RoBERTa, XLM-R, MPNet...);
- :mod:`.cross_encoder`: its sequence-classification heads (ms-marco-MiniLM, bge-reranker);
- :mod:`.llm_rerank`: LLM rerankers scored by "yes"/"no" logits (Qwen3-Reranker);
- :mod:`.rerank`: ``rerank``/``arerank`` over either kind, and ``load_reranker``;
- :mod:`.sentence_head`: the sentence-transformers head (pooling, normalisation).

The adapters (``MLXEmbeddings``, ``MLXEmbedding``, ``MLXRerank``) use it. Importing it
imports no MLX.
"""

from mlx_integrations.lazy_imports import lazy_attributes

__all__ = [
    "EmbeddingEngine",
    "LLMReranker",
    "RerankEngine",
    "RerankResult",
    "arerank",
    "get_embedding_engine",
    "get_rerank_engine",
    "load_reranker",
    "rerank",
]

__getattr__ = lazy_attributes(
    __name__,
    {
        "EmbeddingEngine": "mlx_integrations.embeddings.engine",
        "get_embedding_engine": "mlx_integrations.embeddings.engine",
        "RerankEngine": "mlx_integrations.embeddings.rerank_engine",
        "get_rerank_engine": "mlx_integrations.embeddings.rerank_engine",
        "LLMReranker": "mlx_integrations.embeddings.llm_rerank",
        "RerankResult": "mlx_integrations.embeddings.rerank",
        "arerank": "mlx_integrations.embeddings.rerank",
        "load_reranker": "mlx_integrations.embeddings.rerank",
        "rerank": "mlx_integrations.embeddings.rerank",
    },
)
