"""What the LangChain and LlamaIndex adapters share: their fields, checks and engines.

- :mod:`.chat`: ``ChatSettings``, the sampling and engine fields of ``ChatMLX`` and
  ``MLXLLM``, and the pooled engine they run on;
- :mod:`.embeddings`: ``EmbeddingSettings``, the same for ``MLXEmbeddings`` and
  ``MLXEmbedding``;
- :mod:`.fields`: the checks both use (sampling ranges, unknown constructor arguments).

Importing it imports neither framework; pydantic is the one dependency.
"""
