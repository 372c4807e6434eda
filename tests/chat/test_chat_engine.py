"""Tool calls and reasoning end to end: SimpleEngine on tiny models, forced to known text.

A logits processor makes the random model write a chosen reply, so the real engine
streams it in its own pieces (token by token, through the detokenizer) and the
parser must rebuild the calls from those pieces.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlx_integrations.chat.output_parser import (
    ChatOutputParser,
    Event,
    ParsedOutput,
    TextDelta,
    collect,
)
from mlx_integrations.chat.tool_formats import ParsedToolCall, detect_format
from mlx_integrations.engine import SimpleEngine
from tests.engine.test_simple_engine import forcing
from tests.support.chat_templates import TOOLS
from tests.support.tiny_models import build_tiny_model

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL_REPLY = (
    "Let me check.<tool_call>"
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
    "</tool_call>"
)

# A reasoning template: thinking on, the generation prompt opens the block (as
# DeepSeek-R1 and Qwen3 thinking models do); off, it writes an empty block.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)


def _engine(path: Path, **kwargs: Any) -> Iterator[SimpleEngine]:
    eng = SimpleEngine(path, **kwargs)
    yield eng
    asyncio.run(eng.stop())


@pytest.fixture(scope="module")
def llama(tiny_llama: Path) -> Iterator[SimpleEngine]:
    yield from _engine(tiny_llama)


@pytest.fixture(scope="module")
def qwen2(tiny_qwen2: Path) -> Iterator[SimpleEngine]:
    yield from _engine(tiny_qwen2)


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny-thinking"), arch="qwen2", chat_template=THINKING_TEMPLATE
    )


async def stream_forced(
    engine: SimpleEngine,
    messages: list[dict[str, Any]],
    reply: str,
    parser: ChatOutputParser,
    **kwargs: Any,
) -> tuple[list[list[Event]], list[Event], Any]:
    """Make the engine write ``reply``; feed each streamed ``new_text`` to ``parser``.

    Returns the events of each chunk, those of ``finish()``, and the last output.
    """
    processor, sequence = forcing(engine.tokenizer, reply)
    per_chunk: list[list[Event]] = []
    last = None
    async for out in engine.stream_chat(
        messages,
        max_tokens=len(sequence) + 4,
        temperature=0,
        logits_processors=[processor],
        **kwargs,
    ):
        per_chunk.append(parser.feed(out.new_text))
        last = out
    assert last is not None and last.finish_reason == "stop"
    assert last.text == reply
    return per_chunk, parser.finish(), last


def flat(per_chunk: list[list[Event]], tail: list[Event]) -> ParsedOutput:
    return collect([e for events in per_chunk for e in events] + tail)


# ------------------------------------------------------------------ tool calls


@pytest.mark.parametrize("model", ["llama", "qwen2"])
async def test_forced_hermes_call_is_parsed_from_streamed_chunks(
    model: str, request: pytest.FixtureRequest
):
    engine: SimpleEngine = request.getfixturevalue(model)
    fmt = detect_format(engine.tokenizer)
    assert fmt.name == "hermes"
    parser = ChatOutputParser(tool_format=fmt, tools=TOOLS)
    per_chunk, tail, _ = await stream_forced(engine, QUESTION, CALL_REPLY, parser, tools=TOOLS)
    assert sum(1 for events in per_chunk if events) > 2  # it did stream, piece by piece
    out = flat(per_chunk, tail)
    assert out.content == "Let me check."
    assert [(c.name, c.arguments) for c in out.tool_calls] == [
        ("get_weather", {"city": "Paris", "days": 3})
    ]
    assert out.invalid_tool_calls == []
    # The call came out while streaming (when its end marker arrived), not at finish().
    assert not any(isinstance(e, ParsedToolCall) for e in tail)
    for events in per_chunk:
        for ev in events:
            if isinstance(ev, TextDelta):
                assert "<tool_call" not in ev.text and "</tool_call" not in ev.text


async def test_two_parallel_calls_keep_order_and_get_unique_ids(llama: SimpleEngine):
    reply = (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>'
    )
    parser = ChatOutputParser(tool_format=detect_format(llama.tokenizer), tools=TOOLS)
    per_chunk, tail, _ = await stream_forced(llama, QUESTION, reply, parser, tools=TOOLS)
    out = flat(per_chunk, tail)
    assert [c.name for c in out.tool_calls] == ["get_weather", "get_time"]
    assert out.tool_calls[0].id != out.tool_calls[1].id
    assert out.content.strip() == ""


async def test_malformed_forced_call_comes_back_invalid(llama: SimpleEngine):
    reply = '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>'
    parser = ChatOutputParser(tool_format=detect_format(llama.tokenizer), tools=TOOLS)
    per_chunk, tail, _ = await stream_forced(llama, QUESTION, reply, parser, tools=TOOLS)
    out = flat(per_chunk, tail)
    assert out.tool_calls == [] and out.content == ""
    (bad,) = out.invalid_tool_calls
    assert bad.name == "get_weather"
    assert bad.raw == '{"name": "get_weather", "arguments": {"city": '
    assert "JSONDecodeError" in bad.error


# ------------------------------------------------------- two-turn conversation


def _history(call: ParsedToolCall, result: str) -> list[dict[str, Any]]:
    """The conversation after the model's call and the tool's answer, OpenAI style."""
    return [
        *QUESTION,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    # Arguments as a JSON string, as OpenAI clients send them.
                    "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": result},
    ]


async def test_two_turn_tool_conversation_renders_natively(llama: SimpleEngine):
    fmt = detect_format(llama.tokenizer)
    first = ChatOutputParser(tool_format=fmt, tools=TOOLS)
    per_chunk, tail, _ = await stream_forced(llama, QUESTION, CALL_REPLY, first, tools=TOOLS)
    (call,) = flat(per_chunk, tail).tool_calls

    history = _history(call, "21 C and sunny")
    assert llama.preserve_native_tool_format is True
    prompt = llama.render_prompt(history, tools=TOOLS)
    # Exactly as the template writes a call and a tool result: arguments as a mapping.
    assert (
        "<|im_start|>assistant\n<tool_call>"
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
        "</tool_call><|im_end|>\n"
    ) in prompt
    assert "<|im_start|>user\n<tool_response>\n21 C and sunny\n</tool_response><|im_end|>\n" in (
        prompt
    )
    assert '"name": "get_weather"' in prompt.split("</tools>")[0]  # tools in the system turn
    assert prompt.endswith("<|im_start|>assistant\n")

    answer = "It is 21 C and sunny in Paris."
    second = ChatOutputParser(tool_format=fmt, tools=TOOLS)
    per_chunk, tail, last = await stream_forced(llama, history, answer, second, tools=TOOLS)
    out = flat(per_chunk, tail)
    assert out.content == answer and out.tool_calls == []
    assert last.prompt_tokens == len(llama.tokenizer.encode(prompt, add_special_tokens=False))


async def test_history_becomes_text_when_native_format_is_off(tiny_llama: Path):
    engine = SimpleEngine(tiny_llama, preserve_native_tool_format=False)
    try:
        call = ParsedToolCall("get_weather", {"city": "Paris"}, id="call_7")
        prompt = engine.render_prompt(_history(call, "21 C"), tools=TOOLS)
        assert engine.preserve_native_tool_format is False
        assert (
            "<|im_start|>assistant\n"
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
            "<|im_end|>\n"
        ) in prompt
        assert (
            "<|im_start|>user\nThe get_weather tool returned: 21 C\nUse this result to answer."
            in prompt
        )
        assert "<|im_start|>tool" not in prompt
        # This template renders tools itself, so they are not described twice.
        assert "You can call these functions" not in prompt
        assert prompt.count('"name": "get_weather"') == 2  # <tools> and the call
    finally:
        await engine.stop()


async def test_template_without_tools_gets_them_in_the_system_message(tiny_plain: Path):
    engine = SimpleEngine(tiny_plain)
    try:
        caps = engine.template_capabilities
        assert not caps.renders_tools and not caps.renders_tool_messages
        assert engine.preserve_native_tool_format is False
        call = ParsedToolCall("get_weather", {"city": "Paris"}, id="call_7")
        prompt = engine.render_prompt(_history(call, "21 C"), tools=TOOLS)
        system = prompt.split("<|im_end|>")[0]
        assert system.startswith("<|im_start|>system\nYou can call these functions:")
        for tool in TOOLS:
            fn = tool["function"]
            assert f"- {fn['name']}(" in system and fn["description"] in system
        assert '<tool_call>{"name": "get_weather", "arguments": {"city": "..."}}</tool_call>' in (
            system
        )
        assert "<|im_start|>assistant\n<tool_call>" in prompt
        assert "The get_weather tool returned: 21 C\nUse this result to answer." in prompt
        # The model can still answer with a call the parser reads.
        parser = ChatOutputParser(tool_format=detect_format(engine.tokenizer), tools=TOOLS)
        per_chunk, tail, _ = await stream_forced(engine, QUESTION, CALL_REPLY, parser, tools=TOOLS)
        assert [c.name for c in flat(per_chunk, tail).tool_calls] == ["get_weather"]
    finally:
        await engine.stop()


# ------------------------------------------------------------------- reasoning


async def test_reasoning_opened_by_the_generation_prompt(thinking_model: Path):
    engine = SimpleEngine(thinking_model)
    try:
        tok = engine.tokenizer
        markers = (tok.think_start, tok.think_end)
        assert markers == ("<think>", "</think>")
        prompt = engine.render_prompt(QUESTION, enable_thinking=True)
        assert prompt.endswith("<think>\n")
        parser = ChatOutputParser(
            think_markers=markers, starts_in_reasoning=prompt.rstrip().endswith(markers[0])
        )
        reply = "The user asks about Paris.</think>\n\nIt is sunny."
        per_chunk, tail, last = await stream_forced(
            engine, QUESTION, reply, parser, enable_thinking=True
        )
        assert last.prompt_tokens == len(tok.encode(prompt, add_special_tokens=False))
        out = flat(per_chunk, tail)
        assert (out.reasoning, out.content) == ("The user asks about Paris.", "It is sunny.")
        # The reasoning streamed before the block closed.
        first_kinds = [type(e).__name__ for events in per_chunk[:3] for e in events]
        assert first_kinds and set(first_kinds) == {"ReasoningDelta"}

        off = engine.render_prompt(QUESTION, enable_thinking=False)
        assert off.endswith("<think>\n\n</think>\n\n")
        parser = ChatOutputParser(
            think_markers=markers, starts_in_reasoning=off.rstrip().endswith(markers[0])
        )
        per_chunk, tail, _ = await stream_forced(
            engine, QUESTION, "It is sunny.", parser, enable_thinking=False
        )
        out = flat(per_chunk, tail)
        assert (out.reasoning, out.content) == ("", "It is sunny.")
    finally:
        await engine.stop()


async def test_reasoning_then_call_through_the_engine(llama: SimpleEngine):
    reply = "<think>Weather needs the tool.</think>\n" + CALL_REPLY
    tok = llama.tokenizer
    parser = ChatOutputParser(
        tool_format=detect_format(tok), tools=TOOLS, think_markers=(tok.think_start, tok.think_end)
    )
    per_chunk, tail, _ = await stream_forced(llama, QUESTION, reply, parser, tools=TOOLS)
    out = flat(per_chunk, tail)
    assert out.reasoning == "Weather needs the tool."
    assert out.content == "Let me check."
    assert [c.name for c in out.tool_calls] == ["get_weather"]


@pytest.mark.parametrize("reasoning", [True, False])
def test_a_reasoning_turn_renders_the_template_once(thinking_model: Path, reasoning: bool):
    """The engine renders the prompt and tells the chat core whether it opened a block."""
    from langchain_core.messages import HumanMessage

    from mlx_integrations.langchain import ChatMLX
    from tests.support.forcing import forcing

    engine = SimpleEngine(thinking_model)
    try:
        tok = engine.tokenizer
        renders: list[bool] = []
        original = tok.apply_chat_template

        def counting(*args: Any, **kwargs: Any) -> Any:
            renders.append(bool(kwargs.get("add_generation_prompt")))
            return original(*args, **kwargs)

        tok.apply_chat_template = counting
        reply = "Paris is the question.</think>\n\nIt is sunny." if reasoning else "It is sunny."
        llm = ChatMLX(engine=engine, max_tokens=40, reasoning=reasoning)
        message = llm.invoke(
            [HumanMessage("Weather in Paris?")], logits_processors=[forcing(tok, reply)[0]]
        )
        assert renders == [True]
        assert message.content == "It is sunny."
        expected = "Paris is the question." if reasoning else None
        assert message.additional_kwargs.get("reasoning_content") == expected
    finally:
        asyncio.run(engine.stop())


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def test_forced_calls_and_json_hold_after_the_thinking_the_prompt_opens(thinking_model: Path):
    """The model thinks first, then the constraint holds from the end of the thinking on."""
    from langchain_core.messages import HumanMessage

    from mlx_integrations.langchain import ChatMLX
    from tests.support.forcing import forcing

    engine = SimpleEngine(thinking_model)
    try:
        llm = ChatMLX(engine=engine, max_tokens=80, reasoning=True)
        call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        reply = f"The user wants Paris.</think>\n\n{call}"
        bound = llm.bind_tools([WEATHER_TOOL], tool_choice="required")
        message = bound.invoke(
            [HumanMessage("Weather?")], logits_processors=[forcing(engine.tokenizer, reply)[0]]
        )
        assert message.additional_kwargs["reasoning_content"] == "The user wants Paris."
        assert [(c["name"], c["args"]) for c in message.tool_calls] == [
            ("get_weather", {"city": "Paris"})
        ]
        schema = {"type": "object", "properties": {"city": {"type": "string"}}}
        schema["required"] = ["city"]
        reply = 'Just the city.</think>\n\n{"city": "Paris"}'
        structured = llm.with_structured_output(schema)
        value = structured.invoke("Where?", logits_processors=[forcing(engine.tokenizer, reply)[0]])
        assert value == {"city": "Paris"}
    finally:
        asyncio.run(engine.stop())


def test_a_user_grammar_holds_after_the_thinking_the_prompt_opens(thinking_model: Path):
    """A Lark response_format lets the model think first, then holds from the end marker."""
    from tests.support.forcing import forcing

    engine = SimpleEngine(thinking_model)
    grammar = {"type": "grammar", "grammar": 'start: "yes" | "no"'}
    messages = [{"role": "user", "content": "Yes or no?"}]
    try:
        reply = "Maybe not.</think>\n\nno"
        processor, sequence = forcing(engine.tokenizer, reply)
        out = asyncio.run(
            engine.chat(
                messages,
                max_tokens=len(sequence) + 4,
                temperature=0,
                response_format=grammar,
                logits_processors=[processor],
            )
        )
        assert out.text == reply and out.finish_reason == "stop"
        # After the marker only the grammar's words are allowed: a forced "maybe" ends at
        # the first token the grammar refuses.
        processor, sequence = forcing(engine.tokenizer, "Hmm.</think>\n\nmaybe")
        out = asyncio.run(
            engine.chat(
                messages,
                max_tokens=len(sequence) + 4,
                temperature=0,
                response_format=grammar,
                logits_processors=[processor],
            )
        )
        assert "maybe" not in out.text
        assert out.text.startswith("Hmm.</think>")
    finally:
        asyncio.run(engine.stop())
