"""RAG over a folder of documents with LlamaIndex: MLX embeddings and MLXLLM, offline.

The models are the ones `scripts/dev demo` (or `python cookbook/example_model.py`) puts in
the model store: all-MiniLM-L6-v2 for embeddings, SmolLM2-135M-Instruct for the answer.

Run: python cookbook/llamaindex_rag.py [folder]
"""

from __future__ import annotations

import sys
from pathlib import Path

from example_model import example_embedder, example_model
from llama_index.core import Settings, SimpleDirectoryReader, VectorStoreIndex

from mlx_integrations.llama_index import MLXLLM, MLXEmbedding


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "data" / "notes"
    Settings.llm = MLXLLM(
        model=example_model(), temperature=0, max_tokens=48, repetition_penalty=1.2
    )
    # all-MiniLM-L6-v2 from the model store (any sentence-transformers folder or name works).
    Settings.embed_model = MLXEmbedding(model_name=example_embedder())
    # The reader's default metadata (the file's full path, dates) goes into the prompt:
    # the file's name alone keeps the answer the same wherever the folder lies.
    documents = SimpleDirectoryReader(
        str(folder), file_metadata=lambda path: {"file_name": Path(path).name}
    ).load_data()
    index = VectorStoreIndex.from_documents(documents)
    # One passage: a 135M model is easily led astray by a second, loosely related one;
    # with a larger model, similarity_top_k=3 or more gives it more to go on.
    engine = index.as_query_engine(similarity_top_k=1)
    response = engine.query("In which town does the Zorblax festival take place?")
    print(response)
    # Long-running query services: bound the engine's memory between batches of queries.
    print(Settings.llm.clear_runtime_caches())


if __name__ == "__main__":
    main()
