"""A server on a free loopback port, serving tiny models, for the real client libraries.

The server runs in a thread of the test process (``BackgroundServer``), so a test can
read its engines' statistics; ``start()`` returns once the preloaded models are loaded
and the socket accepts, so no test races the start.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlx_integrations.serve.config import ModelConfig, ServeConfig
from mlx_integrations.serve.server import BackgroundServer
from tests.support.tiny_models import CHATML_TOOLS_TEMPLATE, build_tiny_model

# The generation prompt opens a thinking block (Qwen3 and DeepSeek-R1 style).
THINKING_TEMPLATE = CHATML_TOOLS_TEMPLATE.replace(
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}",
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    },
}
# Bounded values: a random model would fill a free string until max_tokens.
CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["Paris", "Rome", "Tokyo"]},
        "population": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "population"],
    "additionalProperties": False,
}


@pytest.fixture(scope="session")
def thinking_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model whose chat template opens a thinking block for the reply."""
    assert THINKING_TEMPLATE != CHATML_TOOLS_TEMPLATE
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny-thinker"), chat_template=THINKING_TEMPLATE
    )


@pytest.fixture(scope="session")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model with a context of 64k tokens: with its end tokens banned, a reply
    runs for tens of seconds, so a test can act while it is in flight."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-long"), max_position_embeddings=65536)


LONG = 60000
"""max_tokens of a reply that is still running when the test acts on it."""


@pytest.fixture(scope="module")
def server(tiny_llama: Path, thinking_model: Path) -> Iterator[BackgroundServer]:
    """``tiny`` (prefix cache on), ``exact`` (the same model, no prefix cache: greedy
    replies do not depend on what was cached) and ``thinker``."""
    config = ServeConfig(
        models=[
            # All that is cached, on CUDA too (its default key step is 256 tokens).
            ModelConfig(
                "tiny", source=str(tiny_llama), options={"prefix_key_step": 1}, preload=True
            ),
            ModelConfig(
                "exact", source=str(tiny_llama), options={"cache_memory_mb": 0}, preload=True
            ),
            ModelConfig("thinker", source=str(thinking_model)),
        ],
        only_listed=True,
    )
    background = BackgroundServer(config)
    background.start()
    yield background
    background.stop()


@pytest.fixture(scope="module")
def url(server: BackgroundServer) -> str:
    return server.url


def engine_of(server: BackgroundServer, name: str) -> Any:
    return server.state.registry.get(name, "chat").engine


def wait_for(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll ``check`` until it holds (the engines work on their own threads)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def no_eos_bias(model: Any) -> dict[str, float]:
    """A logit_bias that bans the end tokens of a tiny model (a folder or its engine):
    the reply runs to max_tokens."""
    folder = Path(getattr(model, "model_path", model))
    added = json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    ends = {"<|endoftext|>", "<|im_end|>"}
    return {str(t["id"]): -100.0 for t in added if t["content"] in ends}


def no_end_bias(model: Any) -> dict[str, float]:
    """``no_eos_bias`` that also bans ``</think>``: a thinking model thinks until
    max_tokens, unless a thinking budget closes the thinking."""
    folder = Path(getattr(model, "model_path", model))
    added = json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    bias = no_eos_bias(model)
    bias.update({str(t["id"]): -100.0 for t in added if t["content"] == "</think>"})
    return bias


def sse_events(response: httpx.Response) -> Iterator[tuple[str | None, Any]]:
    """(event name, data) of each server-sent event of a streamed response."""
    name = None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
            yield name, data if data == "[DONE]" else json.loads(data)
            name = None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip, with its reason, each test a module names in its ``SKIPPED_HERE`` table (by
    test id, or by name for all its parameters): test_standard_openai.py's way to leave
    out standard tests without overriding them."""
    for item in items:
        table = getattr(getattr(item, "module", None), "SKIPPED_HERE", None)
        if not table:
            continue
        reason = table.get(item.name) or table.get(getattr(item, "originalname", ""))
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
