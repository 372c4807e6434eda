"""ChatMLX's replies as LangChain's standard blocks: content_blocks, output_version="v1"
(whole and streamed) and stream_events(version="v3") hold the reasoning, the text, each
call and each malformed call, in the order the model wrote them."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
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
    # The usage travels beside the blocks, thinking tokens counted apart.
    for msg in (whole, summed):
        assert msg.usage_metadata["output_tokens"] == whole.usage_metadata["output_tokens"]
        assert msg.usage_metadata["output_token_details"]["reasoning"] == len(
            llm.engine.tokenizer.encode("Needs the tool.", add_special_tokens=False)
        )


def test_images_in_a_reply_read_as_standard_image_blocks():
    """A reply whose content holds images in OpenAI's or LangChain's v0 layout (a
    history message a caller built or edited) reads as standard image blocks."""
    png = "iVBORw0KGgo="
    msg = AIMessage(
        [
            {"type": "text", "text": "Here:"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
            {"type": "image", "source_type": "url", "url": "http://127.0.0.1/cat.png"},
            {"type": "image", "url": "http://127.0.0.1/dog.png"},
        ],
        additional_kwargs={"reasoning_content": "Show them."},
        response_metadata={"model_provider": "mlx"},
    )
    blocks = [{k: v for k, v in b.items() if k != "id"} for b in msg.content_blocks]
    assert blocks == [
        {"type": "reasoning", "reasoning": "Show them."},
        {"type": "text", "text": "Here:"},
        {"type": "image", "base64": png, "mime_type": "image/png"},
        {"type": "image", "url": "http://127.0.0.1/cat.png"},
        {"type": "image", "url": "http://127.0.0.1/dog.png"},
    ]


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


STEPS = [
    "<think>Needs the tool.</think>Checking. "
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call> Wait.',
    "<think>Got it.</think>It is sunny.",
]


@pytest.mark.filterwarnings("ignore:The v3 streaming protocol on Pregel is experimental")
def test_an_agent_streamed_as_v3_gets_each_steps_own_blocks(llm):
    """LangGraph's v3 stream of a create_agent run routes each model step through
    ChatMLX's own events: each step's thinking, text and call are blocks of their own."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import AgentMiddleware, ModelRequest

    class Scripted(AgentMiddleware):
        """Makes the random model write STEPS[n] once n tool results are in."""

        def wrap_model_call(self, request: ModelRequest, handler: Any) -> Any:
            step = sum(isinstance(m, ToolMessage) for m in request.messages)
            processor = forcing(llm.engine.tokenizer, STEPS[step])[0]
            settings = {**request.model_settings, "logits_processors": [processor]}
            return handler(request.override(model_settings=settings))

    agent = create_agent(llm, tools=[get_weather], middleware=[Scripted()])
    run = agent.stream_events({"messages": [("human", "Weather in Paris?")]}, version="v3")
    steps = []
    for stream in run.messages:
        events = list(stream)
        assert_valid_event_stream(events)
        steps.append(stream.output)
    assert [shape(s.content_blocks) for s in steps] == [
        [
            ("reasoning", "Needs the tool."),
            ("text", "Checking. "),
            ("tool_call", "get_weather", {"city": "Paris"}),
            ("text", " Wait."),
        ],
        [("reasoning", "Got it."), ("text", "It is sunny.")],
    ]
    assert all(s.usage_metadata["output_token_details"]["reasoning"] > 0 for s in steps)
    messages = run.output["messages"]
    assert isinstance(messages[2], ToolMessage) and messages[2].content == "sunny in Paris"
    assert messages[-1].content_blocks == steps[-1].content_blocks


def test_a_v3_stream_closes_its_request_at_message_finish(llm, tiny_plain):
    """LangChain stops pulling events at message-finish; the request of a per-call
    model is over by then, so its pooled engine is no longer counted as in use."""
    from mlx_integrations.engine import pool

    stream = llm.stream_events("Hi", version="v3", model=str(tiny_plain), max_tokens=4)
    events = list(stream)
    assert events[-1]["event"] == "message-finish"
    users = {str(e.model_path): n for e, n in pool.shared_engines()}
    assert users[str(tiny_plain)] == 0  # the stream object is still alive here
    del stream


EXITS = """
import sys
from mlx_integrations.langchain import ChatMLX

llm = ChatMLX(model=sys.argv[1], max_tokens=8)
if sys.argv[2] == "open":
    stream = llm.stream("Hi")
    next(stream)  # left open: the interpreter closes it as it exits
else:
    events = llm.stream_events("Hi", version="v3")
    list(events)
print("done")
"""


@pytest.mark.parametrize("how", ["open", "v3"])
def test_a_process_that_leaves_a_stream_open_exits(tiny_llama, how):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", EXITS, str(tiny_llama), how],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,  # a generous bound: the failure this guards against never ends
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "done\n"
