"""A RAG chain in LCEL: MLX embeddings, an in-memory vector store and ChatMLX, offline.

The models are the ones `scripts/dev demo` (or `python cookbook/example_model.py`) puts in
the model store: all-MiniLM-L6-v2 for embeddings, SmolLM2-135M-Instruct for the answer.

Run: python cookbook/rag_chain.py
"""

from __future__ import annotations

from example_model import example_embedder, example_model
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore

from mlx_integrations.langchain import ChatMLX, MLXEmbeddings

NOTES = [
    "The Zorblax festival takes place every April in the town of Quillby.",
    "Quillby's bakery is famous for its blue cheese scones.",
    "The river Mern flows through the valley north of Quillby.",
    "The Tarrow lighthouse was built in 1874 on the cliffs of Brenmoor.",
]


def main() -> None:
    # all-MiniLM-L6-v2 from the model store (any sentence-transformers folder or name works).
    store = InMemoryVectorStore(MLXEmbeddings(model_name=example_embedder()))
    store.add_documents([Document(page_content=n) for n in NOTES])
    retriever = store.as_retriever(search_kwargs={"k": 2})
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer using only this context:\n{context}"), ("human", "{question}")]
    )
    llm = ChatMLX(model=example_model(), temperature=0, max_tokens=48, repetition_penalty=1.2)
    chain = (
        {
            "context": retriever | (lambda docs: "\n".join(d.page_content for d in docs)),
            "question": RunnablePassthrough(),
        }
        | prompt
        | llm
        | StrOutputParser()
    )
    print(chain.invoke("In which town does the Zorblax festival take place?"))


if __name__ == "__main__":
    main()
