"""Bad chat input is refused at the boundary with the value and the fix; the engine serves on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlx_integrations.engine import SimpleEngine

USER = [{"role": "user", "content": "hi"}]
TOOL = {
    "type": "function",
    "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
}


@pytest.fixture(scope="module")
def engine(tiny_llama: Path) -> Iterator[SimpleEngine]:
    eng = SimpleEngine(tiny_llama)
    yield eng
    asyncio.run(eng.stop())


BAD_CHATS = [
    (
        {"messages": [{"role": "user", "content": "ok \udcff"}]},
        ValueError,
        r"messages\[0\]\.content holds a lone surrogate '\\udcff' at character 3",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
        ValueError,
        "lone surrogate",
    ),
    ({"response_format": "json"}, TypeError, "response_format must be a dict"),
    (
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [{"function": "f"}]},
            ]
        },
        TypeError,
        r"messages\[1\]\.tool_calls entry .* has 'function' 'f'",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}],
                },
            ]
        },
        TypeError,
        "arguments '\\[1\\]'|arguments \\[1\\]",
    ),
    # Tools are checked on every call, not only when a tool choice is given.
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
        TypeError,
        "'parameters' must be a JSON schema dict",
    ),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {"a": {"type": 3}}},
                    },
                }
            ]
        },
        ValueError,
        "parameters of tool 'f'",
    ),
    ({"tools": [TOOL], "tool_choice": "g"}, ValueError, "'g', which is not bound"),
    ({"tools": [TOOL], "parallel_tool_calls": "yes"}, TypeError, "parallel_tool_calls"),
    ({"tool_format": "nope"}, ValueError, "Unknown tool-call format 'nope'"),
]


@pytest.mark.parametrize(("kwargs", "exc", "match"), BAD_CHATS)
async def test_bad_chat_input_is_refused_and_the_engine_serves_on(engine, kwargs, exc, match):
    kwargs = {"messages": USER, **kwargs}
    with pytest.raises(exc, match=match):
        await engine.chat(max_tokens=4, **kwargs)
    out = await engine.chat(USER, max_tokens=4, temperature=0)
    assert out.finish_reason in ("stop", "length") and out.completion_tokens >= 1


async def test_lone_surrogate_in_a_raw_prompt(engine):
    with pytest.raises(ValueError, match="prompt holds a lone surrogate"):
        await engine.generate("x\udcffy", max_tokens=4)
    assert (await engine.generate("hello", max_tokens=2)).completion_tokens >= 1


def test_adapters_refuse_a_lone_surrogate(tiny_llama):
    from langchain_core.messages import HumanMessage
    from llama_index.core.llms import ChatMessage

    from mlx_integrations.langchain import ChatMLX
    from mlx_integrations.llama_index import MLXLLM

    with pytest.raises(ValueError, match="lone surrogate"):
        ChatMLX(model=str(tiny_llama), max_tokens=4).invoke([HumanMessage("a\udcffb")])
    with pytest.raises(ValueError, match="lone surrogate"):
        MLXLLM(model=str(tiny_llama), max_tokens=4).chat(
            [ChatMessage(role="user", content="a\udcffb")]
        )


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": [b"x" * 100_000]}],
        [{"role": "user", "content": b"y" * 100_000}],
        [b"z" * 100_000],
        [{"role": "assistant", "content": "", "tool_calls": [b"w" * 100_000]}],
    ],
)
def test_errors_about_large_values_stay_short(messages: Any):
    """A bad message holding a large payload is named, not echoed whole."""
    from mlx_integrations.chat.messages import normalize_messages

    with pytest.raises((TypeError, ValueError)) as info:
        normalize_messages(messages)
    assert "messages[0]" in str(info.value) and len(str(info.value)) < 400
