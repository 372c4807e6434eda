"""MLXLLM on the real SmolLM2-135M-Instruct: conformance, agents, RAG, extraction."""

from __future__ import annotations

import pytest
from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.agent.workflow import FunctionAgent, ReActAgent
from llama_index.core.llms import ChatMessage
from llama_index.core.tools import FunctionTool
from pydantic import BaseModel, Field

from mlx_integrations.llama_index import MLXLLM, MLXEmbedding
from tests.llama_index.conformance import LLMConformanceTests
from tests.support.minilm import ensure_minilm

pytestmark = pytest.mark.smollm


def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return f"It is 21 degrees and sunny in {city}."


@pytest.fixture(scope="module")
def llm(smollm2_path) -> MLXLLM:
    return MLXLLM(model=str(smollm2_path), temperature=0, max_tokens=48, repetition_penalty=1.2)


@pytest.fixture(scope="module")
def tool() -> FunctionTool:
    return FunctionTool.from_defaults(get_weather)


class TestMLXLLMConformanceSmolLM2(LLMConformanceTests):
    """The whole conformance suite on a real instruct model."""


def test_answers_a_plain_question(llm):
    response = llm.chat([ChatMessage(role="user", content="What is the capital of France?")])
    assert "Paris" in response.message.content


async def test_function_agent_loop(llm, tool):
    # A 135M model does not start calls by itself: the first step requires one.
    agent = FunctionAgent(tools=[tool], llm=llm, initial_tool_choice="required")
    handler = agent.run(user_msg="What is the weather in Paris?")
    calls = []
    async for event in handler.stream_events():
        if type(event).__name__ == "ToolCallResult":
            calls.append(event)
    result = await handler
    assert calls and calls[0].tool_name == "get_weather"
    assert "paris" in calls[0].tool_kwargs["city"].lower()
    assert "21 degrees" in calls[0].tool_output.content
    answer = str(result.response.content)
    assert "21" in answer or "sunny" in answer.lower()


def test_vector_store_index_query_engine(llm):
    docs = [
        Document(text="The Zorblax festival takes place every April in the town of Quillby."),
        Document(text="Quillby's bakery is famous for its blue cheese scones."),
        Document(text="The Tarrow lighthouse was built in 1874 on the cliffs of Brenmoor."),
        Document(text="Marta Velloso won the 2031 chess olympiad in Lisbon."),
    ]
    embed = MLXEmbedding(model_name=str(ensure_minilm()))
    index = VectorStoreIndex.from_documents(docs, embed_model=embed)
    engine = index.as_query_engine(llm=llm, similarity_top_k=2)
    response = engine.query("In which town does the Zorblax festival take place?")
    assert "Zorblax" in response.source_nodes[0].node.get_content()
    assert "Quillby" in str(response)


class Person(BaseModel):
    """A person mentioned in the text."""

    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=130)


def test_structured_extraction(llm):
    from llama_index.core.prompts import PromptTemplate

    prompt = PromptTemplate("Extract the person from this text: {text}")
    person = llm.structured_predict(Person, prompt, text="Alice Martin is 34 years old.")
    assert isinstance(person, Person)
    assert "Alice" in person.name and person.age == 34


def test_settings_llm_drop_in(llm):
    Settings.llm = llm
    try:
        assert Settings.llm.metadata.is_function_calling_model
    finally:
        Settings.llm = None


async def test_react_agent_loop(smollm2_path, tool):
    from mlx_integrations.llama_index import react_response_format

    # ReAct is a text format: the grammar keeps a 135M model to it. The first step must
    # act and, after one observation, the step must answer.
    react_llm = MLXLLM(
        model=str(smollm2_path),
        temperature=0,
        max_tokens=96,
        repetition_penalty=1.2,
        response_format=react_response_format([tool], require_action_first=True, max_actions=1),
    )
    agent = ReActAgent(tools=[tool], llm=react_llm)
    handler = agent.run(user_msg="What is the weather in Paris?", max_iterations=4)
    results = []
    async for event in handler.stream_events():
        if type(event).__name__ == "ToolCallResult":
            results.append(event)
    answer = str(await handler)
    assert len(results) == 1 and results[0].tool_name == "get_weather"
    assert results[0].tool_kwargs == {"city": "Paris"}
    assert "21 degrees" in results[0].tool_output.content
    assert "21" in answer or "sunny" in answer.lower()
