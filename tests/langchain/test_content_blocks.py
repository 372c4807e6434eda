"""ChatMLX's replies as LangChain's standard blocks: content_blocks, output_version="v1"
(whole and streamed) and stream_events(version="v3") hold the reasoning, the text, each
call and each malformed call, in the order the model wrote them."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langchain_core.tools import tool
from langchain_tests.utils.stream_lifecycle import assert_valid_event_stream

from mlx_integrations.langchain import ChatMLX
from mlx_integrations.langchain.messages import to_neutral_messages
from tests.support.forcing import forcing


@tool
def get_weather(city: str) -> str:
    """Get the weather of a city."""
    return f"sunny in {city}"


# Thinking, text, a call, a malformed call, and text after the calls.
REPLY = (
    "<think>Needs the tool.</think>Checking. "
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call> Done.'
)
RAW_BAD_CALL = '{"name": "get_weather", "arguments": {"city": '


@pytest.fixture(scope="module")
def llm(tiny_llama) -> ChatMLX:
    return ChatMLX(model=str(tiny_llama), temperature=0, max_tokens=80)


def forced(llm: ChatMLX) -> dict[str, Any]:
    return {"logits_processors": [forcing(llm.engine.tokenizer, REPLY)[0]]}


def v1(llm: ChatMLX) -> Any:
    return llm.model_copy(update={"output_version": "v1"}).bind_tools([get_weather])


def shape(blocks: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What each block says, ids and positions left out."""
    out = []
    for b in blocks:
        kind = b["type"]
        if kind in ("text", "reasoning"):
            out.append((kind, b[kind]))
        elif kind == "tool_call":
            out.append((kind, b["name"], b["args"]))
        else:
            assert kind == "invalid_tool_call", b
            out.append((kind, b["name"], b["args"], bool(b["error"])))
    return out


IN_ORDER = [
    ("reasoning", "Needs the tool."),
    ("text", "Checking. "),
    ("tool_call", "get_weather", {"city": "Paris"}),
    ("invalid_tool_call", "get_weather", RAW_BAD_CALL, True),
    ("text", " Done."),
]


def test_content_blocks_are_exact_not_best_effort(llm):
    msg = llm.bind_tools([get_weather]).invoke("Weather?", **forced(llm))
    assert msg.response_metadata["model_provider"] == "mlx"
    # A text reply keeps one text block; the malformed call is a block too (LangChain's
    # best effort would leave it out).
    assert shape(msg.content_blocks) == [
        ("reasoning", "Needs the tool."),
        ("text", "Checking.  Done."),
        ("tool_call", "get_weather", {"city": "Paris"}),
        ("invalid_tool_call", "get_weather", RAW_BAD_CALL, True),
    ]
    call_id = msg.tool_calls[0]["id"]
    assert msg.content_blocks[2]["id"] == call_id
    assert msg.usage_metadata["output_token_details"]["reasoning"] == len(
        llm.engine.tokenizer.encode("Needs the tool.", add_special_tokens=False)
    )


def test_v1_output_keeps_the_order_whole_and_streamed(llm):
    whole = v1(llm).invoke("Weather?", **forced(llm))
    assert whole.response_metadata["output_version"] == "v1"
    assert shape(whole.content) == IN_ORDER
    assert whole.tool_calls[0]["args"] == {"city": "Paris"}
    chunks = list(v1(llm).stream("Weather?", **forced(llm)))
    assert all(isinstance(c.content, list) for c in chunks)
    summed: AIMessageChunk = sum(chunks[1:], chunks[0])
    assert shape(summed.content_blocks) == IN_ORDER
    assert [b.get("index") for b in summed.content if b["type"] != "tool_call"] == [0, 1, 3, 4]
    assert summed.tool_calls[0]["args"] == {"city": "Paris"}


def test_a_streamed_v0_reply_reads_as_the_whole_one(llm):
    chunks = list(llm.bind_tools([get_weather]).stream("Weather?", **forced(llm)))
    summed: AIMessageChunk = sum(chunks[1:], chunks[0])
    blocks = shape(summed.content_blocks)
    assert blocks[:3] == [
        ("reasoning", "Needs the tool."),
        ("text", "Checking.  Done."),
        ("tool_call", "get_weather", {"city": "Paris"}),
    ]
    # The raw text of the malformed call, not its JSON-quoted stream form.
    assert blocks[3][:3] == ("invalid_tool_call", "get_weather", RAW_BAD_CALL)


def kinds(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for e in events:
        name = e["event"].replace("content-block-", "")
        block = e.get("content") or e.get("delta") or {}
        out.append(f"{name}:{block['type']}" if block else name)
    return out


def test_v3_events_come_from_the_blocks_themselves(llm):
    stream = llm.bind_tools([get_weather]).stream_events("Weather?", version="v3", **forced(llm))
    events = list(stream)
    assert_valid_event_stream(events)
    compact = [k for i, k in enumerate(kinds(events)) if i == 0 or k != kinds(events)[i - 1]]
    # Each block finishes when the next begins: the thinking before the text starts,
    # the text after the calls is a block of its own, the malformed call is invalid.
    assert compact == [
        "message-start",
        "start:reasoning",
        "delta:reasoning-delta",
        "finish:reasoning",
        "start:text",
        "delta:text-delta",
        "finish:text",
        "start:tool_call_chunk",
        "delta:tool-call-delta",
        "finish:tool_call",
        "start:invalid_tool_call",
        "finish:invalid_tool_call",
        "start:text",
        "delta:text-delta",
        "finish:text",
        "message-finish",
    ]
    finish = events[-1]
    assert finish["usage"]["output_token_details"]["reasoning"] > 0
    assert finish["metadata"]["finish_reason"] == "tool_calls"
    assert events[0]["metadata"] == {"provider": "mlx", "model": llm.model}
    out = stream.output
    assert shape(out.content_blocks) == IN_ORDER
    assert out.tool_calls[0]["args"] == {"city": "Paris"}
    assert out.invalid_tool_calls[0]["args"] == RAW_BAD_CALL
    assert stream.reasoning.get() == "Needs the tool."


async def test_v3_events_async(llm):
    stream = await llm.bind_tools([get_weather]).astream_events(
        "Weather?", version="v3", **forced(llm)
    )
    events = [e async for e in stream]
    assert_valid_event_stream(events)
    out = await stream.output
    assert shape(out.content_blocks) == IN_ORDER


def test_v3_events_of_a_reasoning_reply(llm):
    text = "<think>Say hello.</think>Hello!"
    processor = forcing(llm.engine.tokenizer, text)[0]
    events = list(llm.stream_events("Hi", version="v3", logits_processors=[processor]))
    blocks = [e["content"] for e in events if e["event"] == "content-block-finish"]
    assert blocks == [
        {"type": "reasoning", "reasoning": "Say hello."},
        {"type": "text", "text": "Hello!"},
    ]


def test_reasoning_goes_back_to_the_template(llm):
    """An earlier reply's thinking, as v0 kwargs or a v1 block, reaches the template."""
    v0 = AIMessage("It is sunny.", additional_kwargs={"reasoning_content": "Look it up."})
    v1_msg = AIMessage(
        [
            {"type": "reasoning", "reasoning": "Look it up."},
            {"type": "text", "text": "It is sunny."},
        ]
    )
    for earlier in (v0, v1_msg):
        neutral = to_neutral_messages([HumanMessage("Weather?"), earlier])
        assert neutral[1]["reasoning_content"] == "Look it up."
        assert neutral[1]["content"] == [{"type": "text", "text": "It is sunny."}] or (
            neutral[1]["content"] == "It is sunny."
        )
    # The tiny model's template renders earlier reasoning: it is in the prompt.
    prompt = llm.engine.render_prompt(to_neutral_messages([HumanMessage("Hi"), v0]))
    assert "<think>Look it up.</think>It is sunny." in prompt
