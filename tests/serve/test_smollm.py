"""Real answers over HTTP from SmolLM2-135M-Instruct, the same as in process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from mlx_integrations.langchain import ChatMLX
from mlx_integrations.serve.config import ModelConfig, ServeConfig
from mlx_integrations.serve.server import BackgroundServer

pytestmark = pytest.mark.smollm

QUESTION = "What is the capital of France?"
# No KV reuse: a prompt prefilled in other pieces differs in the last float bits.
OPTIONS = {"cache_memory_mb": 0}


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return "sunny"


@pytest.fixture(scope="module")
def url(smollm2_path: Path) -> Iterator[str]:
    config = ServeConfig(
        models=[ModelConfig("smollm", source=str(smollm2_path), options=OPTIONS, preload=True)]
    )
    with BackgroundServer(config) as base:
        yield base


def test_a_real_answer_through_both_sdks(url: str):
    reply = openai.OpenAI(base_url=f"{url}/v1", api_key="unused").chat.completions.create(
        model="smollm",
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=40,
        temperature=0,
    )
    assert "Paris" in (reply.choices[0].message.content or "")
    with anthropic.Anthropic(base_url=url, api_key="unused").messages.stream(
        model="smollm",
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=40,
        extra_body={"temperature": 0},
    ) as stream:
        text = "".join(stream.text_stream)
    assert "Paris" in text


def test_the_same_in_process_and_over_http(url: str, smollm2_path: Path):
    local = ChatMLX(model=str(smollm2_path), temperature=0, max_tokens=60, engine_options=OPTIONS)
    remote = ChatOpenAI(
        base_url=f"{url}/v1",
        api_key="unused",
        model="smollm",
        temperature=0,
        max_tokens=60,  # type: ignore[arg-type]
    )
    assert remote.invoke(QUESTION).content == local.invoke(QUESTION).content
    question = "What is the weather in Paris?"
    over_http = remote.bind_tools([get_weather], tool_choice="any").invoke(question)
    in_process = local.bind_tools([get_weather], tool_choice="any").invoke(question)
    assert [(c["name"], c["args"]) for c in over_http.tool_calls] == [
        (c["name"], c["args"]) for c in in_process.tool_calls
    ]
    assert "paris" in over_http.tool_calls[0]["args"]["city"].lower()
