"""RAG with a reranker: retrieve 20 notes, rerank them to the best 4, answer. Offline.

Embeddings retrieve what is near the question; a reranker reads the question and each
candidate together and keeps the ones that answer it. The models are the ones
`scripts/dev demo` puts in the model store: all-MiniLM-L6-v2 retrieves, SmolLM2-135M-Instruct
answers and, for want of a cross-encoder on PyPI, also reranks as an LLM reranker
(its "yes"/"no" odds, the Qwen3-Reranker recipe). With a real reranker in the store
(`mlxi pull cross-encoder/ms-marco-MiniLM-L6-v2`, or Qwen/Qwen3-Reranker-0.6B), name it:
MLXI_EXAMPLE_RERANKER=cross-encoder/ms-marco-MiniLM-L6-v2 python cookbook/rag_rerank.py

Run: python cookbook/rag_rerank.py
"""

from __future__ import annotations

import itertools
import os

from example_model import example_embedder, example_model
from langchain_classic.retrievers import ContextualCompressionRetriever
from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.vectorstores import InMemoryVectorStore

from mlx_integrations.langchain import ChatMLX, MLXEmbeddings, MLXRerank

TOWNS = ["Quillby", "Brenmoor", "Ostrel", "Daventry", "Kelmouth"]
NOTES = [
    "The Zorblax festival takes place every April in the town of Quillby.",
    *(f"{town}'s market opens on {day}." for town in TOWNS for day in ("Mondays", "Fridays")),
    *(f"The road from {a} to {b} crosses two bridges." for a, b in itertools.pairwise(TOWNS)),
    "The Tarrow lighthouse was built in 1874 on the cliffs of Brenmoor.",
    "Quillby's bakery is famous for its blue cheese scones.",
    "Festivals in the valley are held in spring and autumn.",
    "The river Mern flows through the valley north of Quillby.",
]


def main() -> None:
    question = "In which town does the Zorblax festival take place?"
    store = InMemoryVectorStore(MLXEmbeddings(model_name=example_embedder()))
    store.add_documents([Document(page_content=n) for n in NOTES])
    chosen = os.environ.get("MLXI_EXAMPLE_RERANKER")
    # A cross-encoder or LLM reranker by name; else the demo's chat model as an LLM reranker.
    reranker = (
        MLXRerank(model=chosen, top_n=4)
        if chosen
        else MLXRerank(model=example_model(), kind="llm", top_n=4)
    )
    retriever = ContextualCompressionRetriever(
        base_compressor=reranker, base_retriever=store.as_retriever(search_kwargs={"k": 20})
    )
    best = retriever.invoke(question)
    for doc in best:
        print(f"[{doc.metadata['relevance_score']:.3f}] {doc.page_content}")
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer using only this context:\n{context}"), ("human", "{question}")]
    )
    llm = ChatMLX(model=example_model(), temperature=0, max_tokens=48, repetition_penalty=1.2)
    context = "\n".join(d.page_content for d in best)
    print((prompt | llm).invoke({"context": context, "question": question}).content)


if __name__ == "__main__":
    main()
