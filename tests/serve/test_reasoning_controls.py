"""``reasoning_effort`` and ``thinking_budget`` over HTTP: the effort goes to the chat
template's own switch, the budget closes the thinking after N tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlx_integrations.serve.config import ModelConfig, ServeConfig
from mlx_integrations.serve.server import BackgroundServer
from tests.serve.conftest import no_end_bias
from tests.support.thinking import QWEN3_TEMPLATE, build_thinking_model

USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def url(thinking_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``qwen3`` (Qwen3's template: enable_thinking) and ``thinker`` (its generation
    prompt opens a thinking block)."""
    qwen3 = build_thinking_model(tmp_path_factory.mktemp("serve-qwen3"), QWEN3_TEMPLATE)
    config = ServeConfig(
        models=[
            ModelConfig("qwen3", source=str(qwen3)),
            ModelConfig("thinker", source=str(thinking_model)),
        ],
        only_listed=True,
    )
    with BackgroundServer(config) as base:
        yield base


def post(url: str, path: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/{path}", json=body, timeout=120)


def prompt_tokens(url: str, **extra: Any) -> int:
    body = {"model": "qwen3", "messages": USER, "max_tokens": 1, **extra}
    reply = post(url, "chat/completions", **body)
    assert reply.status_code == 200, reply.text
    return int(reply.json()["usage"]["prompt_tokens"])


def test_reasoning_effort_goes_to_the_templates_switch(url):
    # Qwen3's template writes an empty thinking block when thinking is off.
    on, off = prompt_tokens(url, reasoning_effort="high"), prompt_tokens(url)
    assert on == off  # Qwen3 thinks unless told not to
    assert prompt_tokens(url, reasoning_effort="none") > on
    reply = post(
        url,
        "responses",
        model="qwen3",
        input="Hi",
        max_output_tokens=1,
        reasoning={"effort": "none"},
    )
    assert reply.status_code == 200, reply.text
    plain = post(url, "responses", model="qwen3", input="Hi", max_output_tokens=1)
    assert reply.json()["usage"]["input_tokens"] > plain.json()["usage"]["input_tokens"]


@pytest.mark.parametrize(
    ("path", "extra", "param", "says"),
    [
        ("chat/completions", {"reasoning_effort": "minimal"}, "reasoning_effort", "one of"),
        ("chat/completions", {"thinking_budget": -1}, "thinking_budget", ">= 0"),
        ("responses", {"reasoning": {"effort": "max"}}, "reasoning.effort", "one of"),
    ],
)
def test_bad_values_are_a_400_naming_the_field(url, path, extra, param, says):
    body = {"model": "qwen3", "max_tokens": 1, **extra}
    body.update({"messages": USER} if path == "chat/completions" else {"input": "Hi"})
    reply = post(url, path, **body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and says in error["message"]


def test_a_level_the_template_does_not_take_is_a_400_naming_those_it_takes(url):
    reply = post(url, "chat/completions", model="qwen3", messages=USER, reasoning_effort="low")
    assert reply.status_code == 400, reply.text
    assert "takes reasoning_effort 'none', 'high', not 'low'" in reply.json()["error"]["message"]
    again = post(url, "chat/completions", model="qwen3", messages=USER, max_tokens=2)
    assert again.status_code == 200  # the model serves on


def test_thinking_budget_closes_the_thinking_then_the_answer_follows(url, thinking_model):
    """The thinker's prompt opens <think>; with </think> and the end tokens banned it
    thinks to max_tokens; the budget writes </think> after 3 tokens, then it answers."""
    bias = no_end_bias(thinking_model)
    body = {"model": "thinker", "messages": USER, "max_tokens": 16, "temperature": 0}
    unbounded = post(url, "chat/completions", **body, logit_bias=bias).json()
    thought = unbounded["choices"][0]["message"]
    assert thought["reasoning_content"] and not thought["content"]
    capped = post(url, "chat/completions", **body, logit_bias=bias, thinking_budget=3).json()
    message = capped["choices"][0]["message"]
    assert message["reasoning_content"] and message["content"]  # the answer after </think>
    assert len(message["reasoning_content"]) < len(thought["reasoning_content"])
    assert thought["reasoning_content"].startswith(message["reasoning_content"])
