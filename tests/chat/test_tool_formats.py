"""Each tool-call family through its real chat template, on a tiny random model.

A forced call (a named tool, ``any``, ``required``) comes out in the family's own
layout, and the family's parser reads it back into calls whose arguments fit the
tool's schema. A reply written the way the template writes calls, with tools bound and
``tool_choice`` left to auto, comes back from both adapters as those calls, whole and
streamed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from mlx_integrations.chat.output_parser import parse_output
from mlx_integrations.engine import SimpleEngine
from tests.support.chat_templates import FAMILIES, TEMPLATES_DIR, render_reply
from tests.support.forcing import forcing
from tests.support.tiny_models import build_tiny_model

# Schemas bounded so that a random walk through them ends.
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 8},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two small numbers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "minimum": 0, "maximum": 99},
                    "b": {"type": "integer", "minimum": 0, "maximum": 99},
                },
                "required": ["a"],
            },
        },
    },
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]

# The family each template is read as, and how a forced reply begins in its layout.
FORCED = {
    "hermes": ("hermes", "<tool_call>"),
    "qwen3": ("hermes", "<tool_call>"),
    "llama3.1_json": ("llama3_json", '{"name": "'),
    "llama3.2_pythonic": ("pythonic", "["),
    "llama4_pythonic": ("pythonic", "["),
    "gemma3_pythonic": ("pythonic", "["),
    "mistral_parallel": ("mistral", "[TOOL_CALLS]"),
    "mistral_small_3.1": ("mistral", "[TOOL_CALLS]"),
    "qwen3coder": ("qwen3_coder", "<tool_call>\n<function="),
    "glm4.6": ("glm", "<tool_call>"),
    "lfm2": ("lfm", "<|tool_call_start|>"),
    "deepseek_r1": (
        "deepseek",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>",
    ),
}
# Another family's markers must never appear in a forced reply.
FOREIGN = ["<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "<function=", "<arg_key>"]


def test_every_template_is_covered():
    assert set(FORCED) == set(FAMILIES)


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory):
    made: dict[str, SimpleEngine] = {}

    def get(family: str) -> SimpleEngine:
        if family not in made:
            fam = FAMILIES[family]
            path = build_tiny_model(
                tmp_path_factory.mktemp(family.replace(".", "_")),
                chat_template=(TEMPLATES_DIR / fam.template).read_text(),
                special_tokens=fam.special_tokens,
            )
            made[family] = SimpleEngine(path)
        return made[family]

    yield get
    for engine in made.values():
        asyncio.run(engine.stop())


@pytest.mark.parametrize("family", sorted(FORCED))
async def test_forced_calls_come_in_the_family_layout(family: str, engines: Any):
    engine = engines(family)
    name, opening = FORCED[family]
    assert engine.tool_format.name == name
    finished = 0
    for seed in range(2):
        for choice in ("add", "required", "any"):
            out = await engine.chat(
                MESSAGES,
                tools=TOOLS,
                tool_choice=choice,
                parallel_tool_calls=False,
                max_tokens=120,
                temperature=1.0,
                seed=seed,
            )
            text = out.text
            assert text.startswith(opening), (choice, text)
            own = (TEMPLATES_DIR / FAMILIES[family].template).read_text()
            for marker in FOREIGN:
                assert marker not in text or marker in own, (marker, text)
            if out.finish_reason != "stop":
                continue  # a random model may run a free string to the token limit
            finished += 1
            parsed = parse_output(text, tool_format=engine.tool_format, tools=TOOLS)
            assert not parsed.invalid_tool_calls and len(parsed.tool_calls) == 1, text
            call = parsed.tool_calls[0]
            if choice == "add":
                assert call.name == "add"
            jsonschema.validate(call.arguments, PARAMS[call.name])
            assert parsed.content.strip() == "", text
    assert finished >= 3


WEATHER = ("get_weather", {"city": "Paris", "unit": "celsius"})
ADD = ("add", {"a": 2, "b": 3})


@pytest.mark.parametrize("family", sorted(FORCED))
@pytest.mark.parametrize("count", [1, 2])
def test_native_reply_in_auto_mode_through_both_adapters(family: str, count: int, engines: Any):
    from langchain_core.messages import HumanMessage
    from llama_index.core.llms import ChatMessage

    from mlx_integrations.langchain import ChatMLX
    from mlx_integrations.llama_index import MLXLLM

    fam = FAMILIES[family]
    if count == 2 and not fam.parallel:
        pytest.skip("the template writes one call per turn")
    if family == "gemma3_pythonic":
        pytest.skip("the template writes no comma between a call's arguments")
    engine = engines(family)
    calls = [WEATHER, ADD][:count]
    reply = render_reply(engine.tokenizer, fam, calls).strip()
    expected = [(n, a) for n, a in calls]

    def forced() -> Any:
        return forcing(engine.tokenizer, reply)[0]

    chat = ChatMLX(engine=engine, max_tokens=200).bind_tools(TOOLS)
    message = chat.invoke([HumanMessage("weather?")], logits_processors=[forced()])
    assert [(c["name"], c["args"]) for c in message.tool_calls] == expected, reply
    assert message.invalid_tool_calls == []
    streamed = None
    for chunk in chat.stream([HumanMessage("weather?")], logits_processors=[forced()]):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed is not None
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == expected

    llm = MLXLLM(engine=engine, max_tokens=200)
    response = llm.chat_with_tools(
        [_li_tool(t) for t in TOOLS],
        chat_history=[ChatMessage(role="user", content="weather?")],
        allow_parallel_tool_calls=True,
        logits_processors=[forced()],
    )
    selections = llm.get_tool_calls_from_response(response, error_on_no_tool_call=False)
    assert [(s.tool_name, s.tool_kwargs) for s in selections] == expected


def _li_tool(tool: dict[str, Any]) -> Any:
    from typing import Literal

    from llama_index.core.tools import FunctionTool
    from pydantic import create_model

    fn = tool["function"]
    fields: dict[str, Any] = (
        {"city": (str, ...), "unit": (Literal["celsius", "fahrenheit"], ...)}
        if fn["name"] == "get_weather"
        else {"a": (int, ...), "b": (int | None, None)}
    )
    schema = create_model(fn["name"], **fields)
    return FunctionTool.from_defaults(
        fn=lambda **kw: kw, name=fn["name"], description=fn["description"], fn_schema=schema
    )


def test_family_override_on_the_engine(tmp_path: Path):
    # The default chat template here writes Hermes calls; the override wins.
    engine = SimpleEngine(build_tiny_model(tmp_path / "m"), tool_format="pythonic")
    try:
        assert engine.tool_format.name == "pythonic"
        out = asyncio.run(
            engine.chat(MESSAGES, tools=TOOLS, tool_choice="add", max_tokens=80, temperature=0)
        )
        assert out.text.startswith("[add("), out.text
    finally:
        asyncio.run(engine.stop())
    with pytest.raises(ValueError, match="Unknown tool-call format 'nope'"):
        SimpleEngine(tmp_path / "m", tool_format="nope")


# Argument shapes that layouts write differently: a referenced enum, an optional string,
# a nested object, a list, and a tool without arguments.
SHAPES = [
    {
        "type": "function",
        "function": {
            "name": "plan",
            "parameters": {
                "type": "object",
                "properties": {
                    "unit": {"$ref": "#/$defs/Unit"},
                    "note": {"anyOf": [{"type": "string", "maxLength": 6}, {"type": "null"}]},
                    "where": {
                        "type": "object",
                        "properties": {"lat": {"type": "integer", "minimum": 0, "maximum": 9}},
                        "required": ["lat"],
                    },
                    "tags": {
                        "type": "array",
                        "items": {"enum": ["a", "b"]},
                        "maxItems": 2,
                    },
                },
                "required": ["unit", "note", "where", "tags"],
                "$defs": {"Unit": {"type": "string", "enum": ["celsius", "kelvin"]}},
            },
        },
    },
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object"}}},
]


@pytest.mark.parametrize("family", sorted(FORCED))
async def test_forced_calls_of_every_argument_shape_read_back_valid(family: str, engines: Any):
    engine = engines(family)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in SHAPES}
    finished = 0
    for seed in range(3):
        for choice in ("plan", "ping"):
            out = await engine.chat(
                MESSAGES,
                tools=SHAPES,
                tool_choice=choice,
                parallel_tool_calls=False,
                max_tokens=150,
                temperature=1.0,
                seed=seed,
            )
            if out.finish_reason != "stop":
                continue
            finished += 1
            parsed = parse_output(out.text, tool_format=engine.tool_format, tools=SHAPES)
            assert not parsed.invalid_tool_calls and len(parsed.tool_calls) == 1, out.text
            call = parsed.tool_calls[0]
            assert call.name == choice
            jsonschema.validate(call.arguments, schemas[choice])
            if choice == "plan":
                assert call.arguments["unit"] in ("celsius", "kelvin")  # no quotes kept
    assert finished >= 3


# DeepSeek V3.1 writes ``name<｜tool▁sep｜>{...}`` without the type and the fence.
V31_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'user' %}<｜User｜>{{ m.content }}"
    "{% elif m.role == 'assistant' and m.tool_calls %}<｜Assistant｜><｜tool▁calls▁begin｜>"
    "{% for c in m.tool_calls %}<｜tool▁call▁begin｜>{{ c.function.name }}<｜tool▁sep｜>"
    "{{ c.function.arguments | tojson }}<｜tool▁call▁end｜>{% endfor %}"
    "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
    "{% elif m.role == 'tool' %}<｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜>"
    "{% else %}<｜Assistant｜>{{ m.content }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
    "{% if tools %}{{ tools | tojson }}{% endif %}"
    "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)
V31_TOKENS = (
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜end▁of▁sentence｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
)


async def test_deepseek_v31_calls_are_forced_in_its_own_layout(tmp_path: Path):
    path = build_tiny_model(tmp_path / "v31", chat_template=V31_TEMPLATE, special_tokens=V31_TOKENS)
    engine = SimpleEngine(path)
    try:
        assert engine.tool_format.name == "deepseek" and engine.tool_format.bare
        finished = 0
        for seed in range(3):
            out = await engine.chat(
                MESSAGES,
                tools=TOOLS,
                tool_choice="add",
                parallel_tool_calls=False,
                max_tokens=80,
                temperature=1.0,
                seed=seed,
            )
            assert out.text.startswith(
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{"
            ), out.text
            if out.finish_reason == "stop":
                finished += 1
                parsed = parse_output(out.text, tool_format=engine.tool_format, tools=TOOLS)
                assert [c.name for c in parsed.tool_calls] == [
                    "add"
                ] and not parsed.invalid_tool_calls
                jsonschema.validate(parsed.tool_calls[0].arguments, PARAMS["add"])
        assert finished >= 2
    finally:
        await engine.stop()
