"""A complete agent loop and an LCEL RAG chain on the real SmolLM2-135M-Instruct."""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_core.tools import tool
from langchain_core.vectorstores import InMemoryVectorStore

from mlx_integrations.langchain import ChatMLX, MLXEmbeddings
from tests.support.minilm import ensure_minilm

pytestmark = pytest.mark.smollm


@tool
def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return f"It is 21 degrees and sunny in {city}."


@pytest.fixture(scope="module")
def llm(smollm2_path) -> ChatMLX:
    return ChatMLX(model=str(smollm2_path), temperature=0, max_tokens=48, repetition_penalty=1.2)


def test_agent_calls_tool_reads_result_and_answers(llm):
    from langchain.agents import create_agent

    from mlx_integrations.langchain import RequireToolCall

    # A 135M model never starts a call on its own: the middleware requires one while the
    # question is unanswered, then withdraws the tools so it answers from the result.
    agent = create_agent(llm, tools=[get_weather], middleware=[RequireToolCall()])
    result = agent.invoke({"messages": [("human", "What is the weather in Paris?")]})
    messages = result["messages"]
    call_msg, tool_msg, answer = messages[1], messages[2], messages[-1]
    assert isinstance(call_msg, AIMessage) and call_msg.tool_calls
    call = call_msg.tool_calls[0]
    assert call["name"] == "get_weather" and "paris" in call["args"]["city"].lower()
    assert isinstance(tool_msg, ToolMessage) and tool_msg.tool_call_id == call["id"]
    assert "21 degrees" in tool_msg.content
    assert isinstance(answer, AIMessage) and not answer.tool_calls
    assert "21" in answer.content or "sunny" in answer.content.lower()


DOCS = [
    "The Zorblax festival takes place every April in the town of Quillby.",
    "Quillby's bakery is famous for its blue cheese scones.",
    "The river Mern flows through the valley north of Quillby.",
    "Marta Velloso won the 2031 chess olympiad in Lisbon.",
    "The Tarrow lighthouse was built in 1874 on the cliffs of Brenmoor.",
]


def test_lcel_rag_chain_answers_from_retrieved_context(llm):
    embeddings = MLXEmbeddings(model_name=str(ensure_minilm()))
    store = InMemoryVectorStore(embeddings)
    store.add_documents([Document(page_content=d) for d in DOCS])
    retriever = store.as_retriever(search_kwargs={"k": 2})

    def format_docs(docs: list[Document]) -> str:
        return "\n".join(d.page_content for d in docs)

    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "Answer the question using only this context:\n{context}"),
            ("human", "{question}"),
        ]
    )
    chain = (
        {"context": retriever | format_docs, "question": RunnablePassthrough()}
        | prompt
        | llm
        | StrOutputParser()
    )
    question = "In which town does the Zorblax festival take place?"
    top = retriever.invoke(question)
    assert "Zorblax" in top[0].page_content
    answer = chain.invoke(question)
    assert "Quillby" in answer
