"""Constrained decoding through a real SimpleEngine on tiny random models and SmolLM2.

Random models sample almost anything, so every output that finishes is a real check
of the grammar: schemas here bound their strings (``maxLength``/``enum``) and
numbers so that a random walk through them ends.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from mlx_integrations.chat.constraints import (
    JsonObjectConstraint,
    JsonSchemaConstraint,
    ToolChoiceConstraint,
    response_format_constraint,
)
from mlx_integrations.chat.output_parser import ParsedOutput, parse_output
from mlx_integrations.chat.schemas import (
    StructuredOutputError,
    unenforced_keywords,
    validate_json_output,
)
from mlx_integrations.chat.tool_formats import ToolFormat, detect_format, get_format
from mlx_integrations.chat.tool_formats.hermes import HermesFormat
from mlx_integrations.chat.tools import ToolChoiceMode, read_tool_request
from mlx_integrations.engine import SimpleEngine


def tool_choice_constraint(
    tools: Any, choice: Any = "auto", *, parallel: bool = True, markers: ToolFormat | None = None
) -> ToolChoiceConstraint:
    return ToolChoiceConstraint(read_tool_request(tools, choice, parallel), markers)


def tool_choice_processor(tokenizer: Any, tools: Any, choice: Any, *, parallel: bool = True):
    return tool_choice_constraint(tools, choice, parallel=parallel).make_processor(tokenizer)


def json_schema_processor(tokenizer: Any, schema: dict[str, Any]):
    return JsonSchemaConstraint(schema).make_processor(tokenizer)


def json_object_processor(tokenizer: Any):
    return JsonObjectConstraint().make_processor(tokenizer)


def validate_tool_call_output(
    text: str,
    tools: Any,
    *,
    markers: ToolFormat | None = None,
    finish_reason: str | None = None,
    require_call: bool = False,
) -> ParsedOutput:
    """The calls of a constrained output, read by the family's parser and checked here."""
    out = parse_output(text, tool_format=markers or get_format("hermes"), tools=tools)
    assert not out.invalid_tool_calls, (finish_reason, text)
    params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for call in out.tool_calls:
        jsonschema.validate(call.arguments, params[call.name])
    assert out.tool_calls or not require_call, text
    return out


SEEDS = range(6)
MESSAGES = [{"role": "user", "content": "What is the weather in Paris? Answer in JSON."}]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": -5, "maximum": 500},
        "unit": {"enum": ["celsius", "fahrenheit", None]},
        "tags": {
            "type": "array",
            "items": {"type": "string", "maxLength": 3},
            "maxItems": 2,
        },
    },
    "required": ["name", "ok", "n", "unit", "tags"],
    "additionalProperties": False,
}

WEATHER = {
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
            "additionalProperties": False,
        },
    },
}
ADD = {
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
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, ADD]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
CALL = re.compile(r"<tool_call>\n?(.*?)\n?</tool_call>", re.DOTALL)


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_qwen2"])
def engine(request):
    eng = SimpleEngine(request.getfixturevalue(request.param))
    yield eng
    asyncio.run(eng.stop())


@pytest.fixture(scope="module")
def llama(tiny_llama: Path):
    eng = SimpleEngine(tiny_llama, prefix_key_step=1)  # all that is cached, on CUDA too
    yield eng
    asyncio.run(eng.stop())


def token_id(engine: SimpleEngine, text: str) -> int:
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, f"{text!r} is not one token: {ids}"
    return ids[0]


def calls_in(text: str) -> list[dict]:
    """Tool calls parsed without the module under test: regex, json, jsonschema."""
    calls = []
    for body in CALL.findall(text):
        call = json.loads(body)
        assert set(call) == {"name", "arguments"}
        jsonschema.validate(call["arguments"], PARAMS[call["name"]])
        calls.append(call)
    return calls


# ----------------------------------------------------------------- JSON schema / mode


async def test_json_schema_every_output_validates(engine):
    constraint = JsonSchemaConstraint(PERSON)
    for seed in SEEDS:
        processor = constraint.make_processor(engine.tokenizer)
        out = await engine.chat(
            MESSAGES, max_tokens=120, temperature=1.0, seed=seed, logits_processors=[processor]
        )
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), PERSON)
        assert validate_json_output(out.text, PERSON, finish_reason=out.finish_reason) == (
            json.loads(out.text)
        )
        assert processor.is_accepting and processor.error is None


async def test_unconstrained_random_model_is_not_json(llama):
    # The control: without the processor the same sampling never gives valid JSON.
    for seed in SEEDS:
        out = await llama.chat(MESSAGES, max_tokens=40, temperature=1.0, seed=seed)
        with pytest.raises(StructuredOutputError):
            validate_json_output(out.text, PERSON, finish_reason=out.finish_reason)


async def test_json_schema_with_refs_and_any_of(llama):
    schema = {
        "$defs": {
            "point": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 9},
                "minItems": 2,
                "maxItems": 2,
            }
        },
        "type": "object",
        "properties": {
            "at": {"$ref": "#/$defs/point"},
            "label": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 4}]},
        },
        "required": ["at", "label"],
        "additionalProperties": False,
    }
    for seed in SEEDS:
        out = await llama.chat(
            MESSAGES,
            max_tokens=60,
            temperature=1.0,
            seed=seed,
            logits_processors=[json_schema_processor(llama.tokenizer, schema)],
        )
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), schema)


async def test_json_object_mode_gives_objects(llama):
    # Keys and values are free strings here, which a random model rarely closes.
    finished = 0
    for seed in range(12):
        out = await llama.chat(
            MESSAGES,
            max_tokens=40,
            temperature=1.0,
            seed=seed,
            logits_processors=[json_object_processor(llama.tokenizer)],
        )
        if out.finish_reason == "stop":
            finished += 1
            assert isinstance(json.loads(out.text), dict)
        else:
            with pytest.raises(StructuredOutputError) as err:
                validate_json_output(out.text, finish_reason=out.finish_reason)
            assert err.value.truncated
    assert finished >= 2


async def test_constraint_holds_with_kv_reuse(llama):
    # The same prompt again reuses the cache: the processor sees a shorter prompt part.
    constraint = JsonSchemaConstraint(PERSON)
    outs = [
        await llama.chat(
            MESSAGES,
            max_tokens=120,
            temperature=0,
            logits_processors=[constraint.make_processor(llama.tokenizer)],
        )
        for _ in range(2)
    ]
    assert outs[1].cached_tokens > 0
    assert outs[0].tokens == outs[1].tokens
    jsonschema.validate(json.loads(outs[1].text), PERSON)


async def test_a_processor_serves_one_request(llama):
    processor = json_schema_processor(llama.tokenizer, PERSON)
    await llama.chat(MESSAGES, max_tokens=8, temperature=0, logits_processors=[processor])
    with pytest.raises(RuntimeError, match="one request only"):
        await llama.chat(MESSAGES, max_tokens=8, temperature=0, logits_processors=[processor])
    # The engine is still fine afterwards.
    out = await llama.chat(MESSAGES, max_tokens=4, temperature=0)
    assert out.finish_reason in ("stop", "length")


async def test_truncated_json_is_an_error_not_a_value(llama):
    out = await llama.chat(
        MESSAGES,
        max_tokens=4,
        temperature=1.0,
        seed=0,
        logits_processors=[json_schema_processor(llama.tokenizer, PERSON)],
    )
    assert out.finish_reason == "length"
    with pytest.raises(StructuredOutputError, match="max_tokens") as err:
        validate_json_output(out.text, PERSON, finish_reason=out.finish_reason)
    assert err.value.truncated and isinstance(err.value, ValueError)
    assert err.value.text == out.text


# ----------------------------------------------------------------- tool choice


async def test_required_tool_choice_always_gives_a_valid_call(engine):
    constraint = tool_choice_constraint(TOOLS, "required", parallel=False)
    for seed in SEEDS:
        out = await engine.chat(
            MESSAGES,
            tools=TOOLS,
            max_tokens=80,
            temperature=1.0,
            seed=seed,
            logits_processors=[constraint.make_processor(engine.tokenizer)],
        )
        assert out.finish_reason == "stop", out.text
        assert out.text.startswith("<tool_call>") and out.text.endswith("</tool_call>")
        assert len(calls_in(out.text)) == 1
        parsed = validate_tool_call_output(
            out.text, TOOLS, finish_reason=out.finish_reason, require_call=True
        )
        assert [c.name for c in parsed.tool_calls] == [calls_in(out.text)[0]["name"]]
        assert parsed.content == ""


async def test_any_is_required_and_parallel_calls_each_validate(llama):
    processor_calls = []
    for seed in SEEDS:
        out = await llama.chat(
            MESSAGES,
            tools=TOOLS,
            max_tokens=150,
            temperature=1.0,
            seed=seed,
            logits_processors=[tool_choice_processor(llama.tokenizer, TOOLS, "any")],
        )
        calls = calls_in(out.text)
        assert len(calls) >= 1
        if out.finish_reason == "stop":
            assert len(calls) == out.text.count("<tool_call>")
        processor_calls.append(len(calls))
    # With parallel calls allowed, some turns hold more than one.
    assert max(processor_calls) > 1


async def test_named_tool_is_the_one_called(engine):
    for choice in ("add", {"type": "function", "function": {"name": "add"}}):
        constraint = tool_choice_constraint(TOOLS, choice, parallel=False)
        assert constraint.request.mode is ToolChoiceMode.NAMED
        for seed in SEEDS[:3]:
            out = await engine.chat(
                MESSAGES,
                tools=TOOLS,
                max_tokens=80,
                temperature=1.0,
                seed=seed,
                logits_processors=[constraint.make_processor(engine.tokenizer)],
            )
            assert out.finish_reason == "stop"
            assert [c["name"] for c in calls_in(out.text)] == ["add"]


async def test_none_never_writes_the_marker(llama):
    marker = token_id(llama, "<tool_call>")
    push = {marker: 8.0}
    control = [
        await llama.chat(MESSAGES, max_tokens=30, temperature=1.0, seed=s, logit_bias=push)
        for s in SEEDS
    ]
    assert sum("<tool_call>" in out.text for out in control) >= 3
    constraint = tool_choice_constraint(TOOLS, "none")
    for seed in SEEDS:
        out = await llama.chat(
            MESSAGES,
            tools=TOOLS,
            max_tokens=30,
            temperature=1.0,
            seed=seed,
            logit_bias=push,
            logits_processors=[constraint.make_processor(llama.tokenizer)],
        )
        assert marker not in out.tokens and "<tool_call>" not in out.text


async def test_none_with_a_text_marker(llama):
    # "Call" is plain text in this tokenizer: the grammar must keep it out of the text.
    call = token_id(llama, "Call")
    push = {call: 6.0}
    control = [
        await llama.chat(MESSAGES, max_tokens=30, temperature=1.0, seed=s, logit_bias=push)
        for s in SEEDS
    ]
    assert sum("Call" in out.text for out in control) >= 3
    constraint = tool_choice_constraint(TOOLS, "none", markers=HermesFormat("Call", "End"))
    for seed in SEEDS:
        out = await llama.chat(
            MESSAGES,
            max_tokens=30,
            temperature=1.0,
            seed=seed,
            logit_bias=push,
            logits_processors=[constraint.make_processor(llama.tokenizer)],
        )
        assert "Call" not in out.text


async def test_auto_text_then_call_bodies_validate(engine):
    # A push towards the marker makes the model open calls; the bodies must be valid.
    marker = token_id(engine, "<tool_call>")
    constraint = tool_choice_constraint(TOOLS, "auto", parallel=False)
    opened = with_text = 0
    for seed in SEEDS:
        out = await engine.chat(
            MESSAGES,
            tools=TOOLS,
            max_tokens=80,
            temperature=1.0,
            seed=seed,
            logit_bias={marker: 3.0},
            logits_processors=[constraint.make_processor(engine.tokenizer)],
        )
        if "<tool_call>" not in out.text:
            continue
        opened += 1
        if out.finish_reason != "stop":
            continue
        head = out.text.partition("<tool_call>")[0]
        with_text += bool(head)
        assert len(calls_in(out.text)) == 1 and out.text.endswith("</tool_call>")
        assert validate_tool_call_output(out.text, TOOLS).content == head
    assert opened >= 3 and with_text >= 1


async def test_auto_with_a_text_marker_constrains_after_it(llama):
    # Force the text "Hi [[call]]" first, then leave the model to the grammar.
    markers = HermesFormat("[[call]]", "[[end]]")
    forced = llama.tokenizer.encode("Hi [[call]]", add_special_tokens=False)
    constraint = tool_choice_constraint([ADD], "auto", parallel=False, markers=markers)

    def force_prefix():
        import mlx.core as mx

        state = {"start": None}

        def processor(tokens, logits):
            if state["start"] is None:
                state["start"] = tokens.size
            i = tokens.size - state["start"]
            if i >= len(forced):
                return logits
            bias = mx.full(logits.shape, -1e9)
            bias[..., forced[i]] = 0
            return logits + bias

        return processor

    for seed in SEEDS[:4]:
        out = await llama.chat(
            MESSAGES,
            max_tokens=60,
            temperature=1.0,
            seed=seed,
            logits_processors=[force_prefix(), constraint.make_processor(llama.tokenizer)],
        )
        assert out.finish_reason == "stop", out.text
        assert out.text.startswith("Hi [[call]]") and out.text.endswith("[[end]]")
        parsed = validate_tool_call_output(out.text, [ADD], markers=markers)
        assert parsed.content == "Hi " and [c.name for c in parsed.tool_calls] == ["add"]
        body = out.text[len("Hi [[call]]") : -len("[[end]]")]
        jsonschema.validate(json.loads(body)["arguments"], PARAMS["add"])


async def test_required_with_text_markers(llama):
    markers = HermesFormat("[[call]]", "[[end]]")
    constraint = tool_choice_constraint([WEATHER], "required", parallel=False, markers=markers)
    for seed in SEEDS[:3]:
        out = await llama.chat(
            MESSAGES,
            max_tokens=80,
            temperature=1.0,
            seed=seed,
            logits_processors=[constraint.make_processor(llama.tokenizer)],
        )
        assert out.finish_reason == "stop"
        parsed = validate_tool_call_output(out.text, [WEATHER], markers=markers)
        assert [c.name for c in parsed.tool_calls] == ["get_weather"]


async def test_truncated_tool_call_is_an_error(llama):
    out = await llama.chat(
        MESSAGES,
        tools=TOOLS,
        max_tokens=6,
        temperature=1.0,
        seed=1,
        logits_processors=[tool_choice_processor(llama.tokenizer, TOOLS, "required")],
    )
    assert out.finish_reason == "length" and out.text.startswith("<tool_call>")
    # A call cut at max_tokens is never taken for a call: it comes back invalid.
    parsed = parse_output(out.text, tool_format=get_format("hermes"), tools=TOOLS)
    assert parsed.tool_calls == [] and len(parsed.invalid_tool_calls) == 1


# ----------------------------------------------------------------- processor details


def test_processor_masks_padded_vocab_and_forces_eos(llama):
    import mlx.core as mx

    tok = llama.tokenizer
    processor = json_schema_processor(tok, {"enum": ["ok"]})
    width = len(tok.get_vocab()) + 40  # a model vocabulary padded past the tokenizer's
    prompt = mx.array(tok.encode("hello", add_special_tokens=False))
    first = processor(prompt, mx.zeros((1, width)))
    allowed = [i for i, v in enumerate(first[0].tolist()) if v > -float("inf")]
    assert allowed and all(i < width - 40 for i in allowed)
    assert all(tok.decode([i]) in ('"', '"ok', '"o', '"ok"') for i in allowed)
    # Feed '"ok"' token by token, then only EOS may follow.
    tokens = prompt
    for t in tok.encode('"ok"', add_special_tokens=False):
        tokens = mx.concatenate([tokens, mx.array([t])])
        last = processor(tokens, mx.zeros((1, width)))
    allowed = [i for i, v in enumerate(last[0].tolist()) if v > -float("inf")]
    assert allowed == sorted(tok.eos_token_ids)


def test_markers_come_from_the_tokenizer(llama):
    fmt = detect_format(llama.tokenizer)
    assert (fmt.name, fmt.start, fmt.end) == ("hermes", "<tool_call>", "</tool_call>")
    grammar = tool_choice_constraint(TOOLS, "required").grammar(llama.tokenizer)
    # Special-token markers are matched as the special token, not as text.
    marker = token_id(llama, "<tool_call>")
    assert f"<[{marker}]>" in grammar


# ----------------------------------------------------------------- bad input


def test_invalid_schema_is_rejected_before_generation():
    with pytest.raises(ValueError, match="not a valid JSON schema"):
        JsonSchemaConstraint({"type": "objekt"})
    # What the grammar cannot express is left to the check of the result, not refused.
    JsonSchemaConstraint({"type": "string", "format": "no-such-format"})
    assert unenforced_keywords({"type": "string", "format": "no-such-format"})
    assert unenforced_keywords({"type": "object", "propertyNames": {"maxLength": 3}})
    assert not unenforced_keywords({"type": "object", "properties": {"a": {"type": "string"}}})
    with pytest.raises(TypeError, match="must be a dict"):
        JsonSchemaConstraint("{}")  # type: ignore[arg-type]


def test_bad_tools_are_rejected_with_the_tool_named():
    nameless = {"type": "function", "function": {"parameters": {"type": "object"}}}
    with pytest.raises(ValueError, match=r"tools\[1\] has no name"):
        tool_choice_constraint([WEATHER, nameless], "required")
    no_params = {"type": "function", "function": {"name": "ping"}}
    # A tool without parameters takes no arguments.
    assert tool_choice_constraint([no_params], "auto").request.tools[0].properties == {}
    with pytest.raises(TypeError, match="'parameters' must be a JSON schema dict"):
        tool_choice_constraint([{"name": "ping", "parameters": "x"}], "auto")
    bad = {"name": "ping", "parameters": {"type": "object", "properties": {"a": {"type": 3}}}}
    with pytest.raises(ValueError, match="parameters of tool 'ping'"):
        tool_choice_constraint([bad], "auto")
    with pytest.raises(ValueError, match="'nope', which is not bound"):
        tool_choice_constraint(TOOLS, "nope")
    # The same tool twice is one tool.
    assert len(tool_choice_constraint([ADD, ADD], "required").request.tools) == 1
    with pytest.raises(ValueError, match="needs tools"):
        tool_choice_constraint([], "required")
    with pytest.raises(TypeError, match="tool_choice 3 is not understood"):
        tool_choice_constraint(TOOLS, 3)
    with pytest.raises(TypeError, match="tools must be a list"):
        tool_choice_constraint(WEATHER, "auto")  # type: ignore[arg-type]
    assert tool_choice_constraint([], "none").request.mode is ToolChoiceMode.NONE


def test_response_format():
    assert response_format_constraint(None) is None
    assert response_format_constraint({"type": "text"}) is None
    assert isinstance(response_format_constraint({"type": "json_object"}), JsonObjectConstraint)
    made = response_format_constraint(
        {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    )
    assert isinstance(made, JsonSchemaConstraint) and made.schema == PERSON
    with pytest.raises(ValueError, match="unknown"):
        response_format_constraint({"type": "yaml"})
    with pytest.raises(ValueError, match="needs"):
        response_format_constraint({"type": "json_schema", "json_schema": {}})


def test_validate_json_output_tells_cut_from_wrong():
    with pytest.raises(StructuredOutputError, match="max_tokens") as err:
        validate_json_output('{"name": "ab', PERSON, finish_reason="length")
    assert err.value.truncated
    with pytest.raises(StructuredOutputError, match="ends before") as err:
        validate_json_output('{"name": "ab', PERSON, finish_reason="stop")
    assert err.value.truncated
    with pytest.raises(StructuredOutputError, match="does not match the schema at name") as err:
        validate_json_output('{"name": 3}', {"properties": {"name": {"type": "string"}}})
    assert not err.value.truncated
    with pytest.raises(StructuredOutputError, match="not valid JSON") as err:
        validate_json_output("hello", PERSON)
    assert not err.value.truncated
    # A number at max_tokens may have lost digits.
    with pytest.raises(StructuredOutputError, match="max_tokens"):
        validate_json_output("12", {"type": "integer"}, finish_reason="length")
    assert validate_json_output("12", {"type": "integer"}, finish_reason="stop") == 12
    # A complete object that happened to end exactly at max_tokens is fine.
    assert validate_json_output('{"a": 1}', finish_reason="length") == {"a": 1}


# ----------------------------------------------------------------- SmolLM2


@pytest.fixture(scope="module")
def smollm(smollm2_path: Path):
    eng = SimpleEngine(smollm2_path)
    yield eng
    asyncio.run(eng.stop())


@pytest.mark.smollm
async def test_smollm2_json_schema_output_validates(smollm):
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "country": {"type": "string", "maxLength": 20},
        },
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    out = await smollm.chat(
        [{"role": "user", "content": "Name the capital of France as JSON with city and country."}],
        max_tokens=30,
        temperature=0,
        logits_processors=[json_schema_processor(smollm.tokenizer, schema)],
    )
    assert out.finish_reason == "stop"
    value = validate_json_output(out.text, schema, finish_reason=out.finish_reason)
    jsonschema.validate(json.loads(out.text), schema)
    assert "paris" in value["city"].lower()


@pytest.mark.smollm
async def test_smollm2_required_tool_choice_gives_a_valid_call(smollm):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather in a city.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 20}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
        }
    ]
    out = await smollm.chat(
        [{"role": "user", "content": "What is the weather in Paris?"}],
        tools=tools,
        max_tokens=30,
        temperature=0,
        logits_processors=[
            tool_choice_processor(smollm.tokenizer, tools, "required", parallel=False)
        ],
    )
    assert out.finish_reason == "stop"
    calls = validate_tool_call_output(out.text, tools, require_call=True).tool_calls
    assert [c.name for c in calls] == ["get_weather"]
    jsonschema.validate(calls[0].arguments, tools[0]["function"]["parameters"])
    assert "paris" in calls[0].arguments["city"].lower()


async def test_engine_applies_tool_choice_and_response_format_itself(tiny_llama):
    """A direct caller of SimpleEngine.stream_chat gets the same constraints as the adapters."""
    import jsonschema

    from mlx_integrations.chat.output_parser import parse_output
    from mlx_integrations.chat.tool_formats import get_format
    from mlx_integrations.engine import SimpleEngine

    engine = SimpleEngine(tiny_llama)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "pick",
                "parameters": {
                    "type": "object",
                    "properties": {"color": {"enum": ["red", "blue"]}},
                    "required": ["color"],
                },
            },
        }
    ]
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
    }
    try:
        for seed in range(3):
            out = await engine.chat(
                [{"role": "user", "content": "go"}],
                max_tokens=60,
                temperature=1.0,
                seed=seed,
                tools=tools,
                tool_choice="required",
            )
            parsed = parse_output(out.text, tool_format=get_format("hermes"), tools=tools)
            assert [c.name for c in parsed.tool_calls] == ["pick"]
            out = await engine.chat(
                [{"role": "user", "content": "go"}],
                max_tokens=30,
                temperature=1.0,
                seed=seed,
                response_format={"type": "json_schema", "json_schema": {"schema": schema}},
            )
            jsonschema.validate(json.loads(out.text), schema)
        with pytest.raises(ValueError, match="not bound"):
            await engine.chat([{"role": "user", "content": "go"}], tools=tools, tool_choice="nope")
    finally:
        await engine.stop()


# Mistral templates, written for these tests in the three layouts Mistral models use.
_MISTRAL_HEAD = (
    "{%- if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{%- elif m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS]"
)
_MISTRAL_TAIL = (
    "<|im_end|>{%- elif m.role == 'assistant' %}{{ m.content }}<|im_end|>"
    "{%- elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]"
    "{%- endif %}{%- endfor %}"
)
MISTRAL_TEMPLATES = {
    "list": _MISTRAL_HEAD
    + "[{% for c in m.tool_calls %}{{ {'name': c.function.name, 'arguments': c.function.arguments,"
    " 'id': c.id}|tojson }}{% if not loop.last %}, {% endif %}{% endfor %}]" + _MISTRAL_TAIL,
    "header": _MISTRAL_HEAD
    + "{% for c in m.tool_calls %}{% if not loop.first %}[TOOL_CALLS]{% endif %}"
    "{{ c.function.name }}[ARGS]{{ c.function.arguments|tojson }}{% endfor %}" + _MISTRAL_TAIL,
    "header_id": _MISTRAL_HEAD
    + "{% for c in m.tool_calls %}{% if not loop.first %}[TOOL_CALLS]{% endif %}"
    "{{ c.function.name }}[CALL_ID]{{ c.id }}[ARGS]{{ c.function.arguments|tojson }}{% endfor %}"
    + _MISTRAL_TAIL,
}
_MISTRAL_AFTER_MARKER = {"list": "[{", "header": "", "header_id": ""}


@pytest.mark.parametrize("layout", list(MISTRAL_TEMPLATES))
async def test_mistral_models_are_constrained_in_their_own_layout(layout, tmp_path):
    """Forced calls come out as the template writes them, and parse back to valid calls."""
    from mlx_integrations.chat.output_parser import parse_output
    from mlx_integrations.chat.tool_formats import detect_format, get_format
    from mlx_integrations.chat.tool_formats.mistral import call_layout
    from tests.support.tiny_models import build_tiny_model

    path = build_tiny_model(
        tmp_path / layout, arch="llama", chat_template=MISTRAL_TEMPLATES[layout]
    )
    engine = SimpleEngine(path)
    await engine.start()
    try:
        assert detect_format(engine.tokenizer).name == "mistral"
        assert call_layout(engine.tokenizer) == layout
        assert engine.tool_format.layout == layout  # probed once, at load
        finished = 0
        for seed in SEEDS[:3]:
            for choice, parallel in (("required", False), ("add", False), ("add", True)):
                out = await engine.chat(
                    MESSAGES,
                    tools=TOOLS,
                    max_tokens=200,
                    temperature=1.0,
                    seed=seed,
                    tool_choice=choice,
                    parallel_tool_calls=parallel,
                )
                # A random model may write a long string, or go on adding parallel calls,
                # until the token limit; what it wrote must still follow the layout.
                assert out.text.startswith("[TOOL_CALLS]"), out.text
                after = out.text.removeprefix("[TOOL_CALLS]").lstrip()
                assert after.startswith(_MISTRAL_AFTER_MARKER[layout]), out.text
                assert ("[CALL_ID]" in out.text) == (layout == "header_id"), out.text
                assert "<tool_call>" not in out.text
                parsed = parse_output(out.text, tool_format=get_format("mistral"), tools=TOOLS)
                if out.finish_reason != "stop":
                    continue  # cut short: a list layout's last call (or whole list) is cut
                finished += 1
                assert parsed.tool_calls and not parsed.invalid_tool_calls, out.text
                if choice == "add":
                    assert {c.name for c in parsed.tool_calls} == {"add"}
                if not parallel:
                    assert len(parsed.tool_calls) == 1
                for call in parsed.tool_calls:
                    schema = next(t for t in TOOLS if t["function"]["name"] == call.name)
                    jsonschema.validate(call.arguments, schema["function"]["parameters"])
        assert finished >= 6  # most turns end on their own (all single-call ones here)
    finally:
        await engine.stop()
