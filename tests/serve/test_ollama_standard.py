"""LangChain's standard integration suite for ChatOllama pointed at ``mlxi serve``
(SmolLM2-135M-Instruct): Ollama's wire format as langchain-ollama reads it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langchain_ollama import ChatOllama
from langchain_tests.integration_tests import ChatModelIntegrationTests
from pydantic import BaseModel, Field

from mlx_integrations.serve.config import ModelConfig, ServeConfig
from mlx_integrations.serve.server import BackgroundServer
from tests.support.smollm import ensure_smollm2
from tests.support.tiny_models import cached_tiny_model

pytestmark = pytest.mark.smollm

_SERVER: dict[str, BackgroundServer] = {}


@pytest.fixture(scope="module", autouse=True)
def server() -> Iterator[BackgroundServer]:
    # No KV reuse across tests, as in the in-process suite: every test sees the same numbers.
    config = ServeConfig(
        models=[
            ModelConfig(
                "smollm", source=str(ensure_smollm2()), options={"cache_memory_mb": 0}, preload=True
            ),
            ModelConfig("tiny", source=str(cached_tiny_model())),
        ],
        only_listed=True,
    )
    background = BackgroundServer(config)
    background.start()
    _SERVER["running"] = background
    yield background
    background.stop()
    _SERVER.clear()


def _url() -> str:
    return _SERVER["running"].url if "running" in _SERVER else "http://127.0.0.1:9"


NEVER_CALLS_ON_ITS_OWN = (
    "SmolLM2-135M never starts a tool call on its own (it answers in text), and Ollama's "
    "API has no tool_choice to force one (ChatOllama drops it): "
    "see test_limit_smollm2_never_calls_tools_on_its_own, where the same tools with a "
    "format schema yield a valid call"
)
LEAVES_OUT_KEYS = (
    "SmolLM2-135M, asked for JSON with 'setup' and 'punchline' keys under format 'json' "
    "(valid JSON, no schema), writes the setup and leaves out the punchline: "
    "see test_limit_smollm2_leaves_out_keys_under_json_mode, where the reply is valid JSON "
    "and the schema's format holds both keys"
)

# langchain-tests allows an overridden standard test only as an expected failure, so the
# tests below are not overridden: tests/serve/conftest.py skips, by name, the ones whose
# failure is a limit of SmolLM2, proven by the test_limit_* tests at the end.
SKIPPED_HERE = {
    "test_tool_calling": NEVER_CALLS_ON_ITS_OWN,
    "test_tool_calling_async": NEVER_CALLS_ON_ITS_OWN,
    "test_bind_runnables_as_tools": NEVER_CALLS_ON_ITS_OWN,
    "test_tool_calling_with_no_arguments": NEVER_CALLS_ON_ITS_OWN,
    "test_agent_loop": NEVER_CALLS_ON_ITS_OWN,
    "test_unicode_tool_call_integration": NEVER_CALLS_ON_ITS_OWN,
    "test_json_mode": LEAVES_OUT_KEYS,
}


class TestChatOllamaOverMlxiServe(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[ChatOllama]:
        return ChatOllama

    @property
    def chat_model_params(self) -> dict:
        return {
            "base_url": _url(),
            "model": "smollm",
            "temperature": 0,
            "num_predict": 100,
            # A 135M model loops at greedy without it.
            "repeat_penalty": 1.3,
        }

    @property
    def model_override_value(self) -> str:
        return "tiny"

    @property
    def has_tool_choice(self) -> bool:
        return False  # ChatOllama drops tool_choice: Ollama's API has none

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def supported_usage_metadata_details(self) -> dict:
        return {"invoke": [], "stream": []}


@tool
def get_weather(location: str) -> str:
    """Get the weather at a location."""
    return "It's sunny."


class Joke(BaseModel):
    """Joke to tell user."""

    setup: str = Field(description="question to set up a joke")
    punchline: str = Field(description="answer to resolve the joke")


def _llm() -> ChatOllama:
    return ChatOllama(**TestChatOllamaOverMlxiServe().chat_model_params)


def test_limit_smollm2_never_calls_tools_on_its_own():
    question = [HumanMessage("What is the weather in San Francisco, CA?")]
    llm = _llm().bind_tools([get_weather])
    free = llm.invoke(question)
    assert free.tool_calls == [] and free.invalid_tool_calls == []
    held = llm.invoke(question, format=Joke.model_json_schema())
    assert held.tool_calls and held.tool_calls[0]["name"] == "get_weather"
    assert isinstance(held.tool_calls[0]["args"]["location"], str)


def test_limit_smollm2_leaves_out_keys_under_json_mode():
    msg = (
        "Tell me a joke about cats. Return the result as a JSON with 'setup' and "
        "'punchline' keys. Return nothing other than JSON."
    )
    raw = _llm().invoke(msg, format="json")
    answer = json.loads(str(raw.content))  # valid JSON, as format 'json' promises
    assert "setup" in answer and "punchline" not in answer
    held = _llm().with_structured_output(Joke).invoke(msg)  # format: the schema
    assert isinstance(held, Joke)
