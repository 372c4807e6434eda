"""``reasoning_effort`` and ``thinking_budget`` over HTTP: the effort goes to the chat
template's own switch, the budget closes the thinking after N tokens. Anthropic's
``thinking`` and ``output_config.effort`` come to the same switches."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlx_integrations.serve.config import ModelConfig, ServeConfig
from mlx_integrations.serve.protocol.base import IGNORED_HEADER
from mlx_integrations.serve.server import BackgroundServer
from tests.serve.conftest import no_end_bias
from tests.support.thinking import EFFORT_TEMPLATE, QWEN3_TEMPLATE, build_thinking_model

USER = [{"role": "user", "content": "What is the weather in Paris?"}]

# gpt-oss style (the template reads reasoning_effort), each level a system line of its
# own length, so the prompt's token count says which level the template was given.
LEVELS_TEMPLATE = EFFORT_TEMPLATE.replace(
    "Reasoning: {{ reasoning_effort | default('medium') }}",
    "Reasoning:{% for _ in range({'low': 1, 'medium': 3, 'high': 5}"
    "[reasoning_effort | default('medium')]) %} x{% endfor %}",
)


@pytest.fixture(scope="module")
def url(
    thinking_model: Path, tiny_plain: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """``qwen3`` (Qwen3's template: enable_thinking), ``thinker`` (its generation
    prompt opens a thinking block), ``levels`` (reasoning_effort low, medium, high) and
    ``plain`` (a model that does not think)."""
    qwen3 = build_thinking_model(tmp_path_factory.mktemp("serve-qwen3"), QWEN3_TEMPLATE)
    levels = build_thinking_model(tmp_path_factory.mktemp("serve-levels"), LEVELS_TEMPLATE)
    config = ServeConfig(
        models=[
            ModelConfig("qwen3", source=str(qwen3)),
            ModelConfig("thinker", source=str(thinking_model)),
            ModelConfig("levels", source=str(levels)),
            ModelConfig("plain", source=str(tiny_plain)),
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


def counted(url: str, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": USER, "max_tokens": 1, **extra}
    reply = post(url, "messages/count_tokens", **body)
    assert reply.status_code == 200, reply.text
    return reply


def tokens(url: str, model: str, **extra: Any) -> int:
    return int(counted(url, model, **extra).json()["input_tokens"])


def effort(level: str) -> dict[str, Any]:
    return {"output_config": {"effort": level}}


def test_anthropic_effort_is_the_templates_reasoning_effort(url):
    low, medium, high = (tokens(url, "levels", **effort(x)) for x in ("low", "medium", "high"))
    assert low < medium < high  # each level reached the template as itself
    assert tokens(url, "levels", **effort("max")) == high  # Anthropic's max is the top
    assert tokens(url, "levels") == medium  # unset: the template's default
    # The same prompt as the chat endpoint's reasoning_effort, and a reply follows.
    assert prompt_tokens_of(url, "levels", reasoning_effort="low") == low
    reply = post(url, "messages", model="levels", messages=USER, max_tokens=2, **effort("low"))
    assert reply.status_code == 200, reply.text
    usage = reply.json()["usage"]  # the prompt is cached since the call before
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == low
    assert IGNORED_HEADER not in reply.headers


def prompt_tokens_of(url: str, model: str, **extra: Any) -> int:
    body = {"model": model, "messages": USER, "max_tokens": 1, **extra}
    reply = post(url, "chat/completions", **body)
    assert reply.status_code == 200, reply.text
    return int(reply.json()["usage"]["prompt_tokens"])


def test_anthropic_thinking_switches_the_templates_thinking(url):
    # Qwen3 thinks unless told not to; off, its template writes an empty thinking block.
    on = tokens(url, "qwen3")
    assert tokens(url, "qwen3", thinking={"type": "enabled", "budget_tokens": 2048}) == on
    assert tokens(url, "qwen3", thinking={"type": "adaptive"}) == on
    off = tokens(url, "qwen3", thinking={"type": "disabled"})
    assert off == prompt_tokens_of(url, "qwen3", reasoning_effort="none") > on
    # A level Qwen3's template lacks is the nearest one it takes (thinking on), not a 400.
    assert tokens(url, "qwen3", **effort("low")) == on
    # Thinking turned off wins over an effort, which is left out and named.
    both = counted(url, "qwen3", thinking={"type": "disabled"}, **effort("high"))
    assert both.json()["input_tokens"] == off
    assert both.headers[IGNORED_HEADER] == "output_config.effort"


def test_a_model_that_does_not_think_leaves_the_thinking_settings_out(url):
    plain = tokens(url, "plain")
    settings = {"thinking": {"type": "enabled", "budget_tokens": 1024}, **effort("high")}
    reply = post(url, "messages", model="plain", messages=USER, max_tokens=2, **settings)
    assert reply.status_code == 200, reply.text
    usage = reply.json()["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == plain
    ignored = reply.headers[IGNORED_HEADER].split(",")
    assert ignored == ["thinking.budget_tokens", "output_config.effort"]
    unknown = counted(url, "levels", **effort("extreme"))  # a level Anthropic may add
    assert unknown.json()["input_tokens"] == tokens(url, "levels")
    assert unknown.headers[IGNORED_HEADER] == "output_config.effort"


def response_tokens(url: str, model: str, effort: str | None) -> httpx.Response:
    body: dict[str, Any] = {"model": model, "input": "Hi", "max_output_tokens": 1}
    if effort is not None:
        body["reasoning"] = {"effort": effort, "summary": "auto"}
    reply = post(url, "responses", **body)
    assert reply.status_code == 200, reply.text
    return reply


def test_responses_effort_is_fitted_to_the_template_never_refused(url):
    """Codex sends reasoning.effort "medium" to every model."""
    usage = lambda reply: reply.json()["usage"]["input_tokens"]  # noqa: E731
    levels = {e: usage(response_tokens(url, "levels", e)) for e in ("low", "medium", "high")}
    assert levels["low"] < levels["medium"] < levels["high"]
    assert usage(response_tokens(url, "levels", "minimal")) == levels["low"]
    assert usage(response_tokens(url, "levels", "xhigh")) == levels["high"]
    # Qwen3 takes none and high: medium is thinking on, as with no effort.
    assert usage(response_tokens(url, "qwen3", "medium")) == usage(
        response_tokens(url, "qwen3", None)
    )
    # A model that does not think leaves the effort out, and says so.
    plain = response_tokens(url, "plain", "medium")
    assert plain.headers[IGNORED_HEADER] == "reasoning.summary,reasoning.effort"
    assert usage(plain) == usage(response_tokens(url, "plain", None))
