"""Sentence embeddings on MLX: a layer of its own, beside the generative engines.

- :mod:`.engine`: ``EmbeddingEngine``, its owner thread, and one shared engine per model;
- :mod:`.bert`: the BERT-family encoder (BERT, RoBERTa, XLM-R, MPNet...);
- :mod:`.sentence_head`: the sentence-transformers head (pooling, normalisation).

The adapters (``MLXEmbeddings``, ``MLXEmbedding``) use it through
:mod:`mlx_integrations.settings.embeddings`. Importing it imports no MLX.
"""

from mlx_integrations.lazy_imports import lazy_attributes

__all__ = ["EmbeddingEngine", "get_embedding_engine"]

__getattr__ = lazy_attributes(
    __name__,
    {
        "EmbeddingEngine": "mlx_integrations.embeddings.engine",
        "get_embedding_engine": "mlx_integrations.embeddings.engine",
    },
)
