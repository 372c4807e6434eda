"""Tool-call formats on the text real chat templates write, whole and token by token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mlx_integrations.chat.messages import normalize_messages
from mlx_integrations.chat.output_parser import (
    ChatOutputParser,
    ParsedOutput,
    TextDelta,
    collect,
    parse_output,
)
from mlx_integrations.chat.template import probe_template, render_chat_prompt
from mlx_integrations.chat.tool_formats import (
    InvalidToolCall,
    ParsedToolCall,
    ToolFormat,
    detect_format,
    get_format,
    parse_calls,
)
from tests.support.chat_templates import (
    FAMILIES,
    TEMPLATES_DIR,
    TOOLS,
    Family,
    load_family_tokenizer,
    render_reply,
    write_tokenizer,
)

WEATHER = ("get_weather", {"city": "Paris", "days": 3, "metric": True, "hours": [6, 12]})
TIME = ("get_time", {"zone": "CET"})
FIRST_FAMILIES = tuple(FAMILIES)
# Gemma 3's template writes no comma between the arguments of one call (its separator
# flag is reset inside the loop), so its calls here take one argument each.
ONE_ARGUMENT = {"gemma3_pythonic"}


def calls_for(family: str) -> list[tuple[str, dict[str, Any]]]:
    """The calls a family's reply holds in these tests."""
    weather = ("get_weather", {"city": "Paris"}) if family in ONE_ARGUMENT else WEATHER
    return [weather, TIME] if FAMILIES[family].parallel else [weather]


@pytest.fixture(scope="module")
def family_tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """mlx-lm tokenizers around each family's real template."""
    return {
        name: load_family_tokenizer(tmp_path_factory.mktemp(name), family)
        for name, family in FAMILIES.items()
    }


def render(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    caps: Any = None,
    native: bool = True,
) -> str:
    """Messages rendered through the tokenizer's template as the engines render them."""
    caps = caps or probe_template(tokenizer)
    return render_chat_prompt(
        tokenizer,
        normalize_messages(messages),
        tools=TOOLS,
        native_tool_format=native,
        capabilities=caps,
        tool_format=detect_format(tokenizer),
    )


def stream_tokens(tokenizer: Any, text: str, **options: Any) -> ParsedOutput:
    """Feed ``text`` to a parser in the pieces the tokenizer's detokenizer yields."""
    detok = tokenizer.detokenizer
    detok.reset()
    parser = ChatOutputParser(**options)
    events = []
    for token in tokenizer.encode(text, add_special_tokens=False):
        detok.add_token(token)
        events += parser.feed(detok.last_segment)
    detok.finalize()
    events += parser.feed(detok.last_segment)
    return collect(events + parser.finish())


def as_pairs(calls: list[ParsedToolCall]) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, c.arguments) for c in calls]


# ------------------------------------------------------------------ detection


def test_every_family_has_its_template_file():
    names = {p.name for p in TEMPLATES_DIR.glob("*.jinja")}
    assert {f.template for f in FAMILIES.values()} <= names
    readme = (TEMPLATES_DIR / "README.md").read_text()
    for family in FAMILIES.values():
        assert family.template in readme


@pytest.mark.parametrize("family", FIRST_FAMILIES)
def test_detect_format_from_mlx_lm_tokenizer(family: str, family_tokenizers: dict[str, Any]):
    fmt = detect_format(family_tokenizers[family])
    assert fmt.name == FAMILIES[family].format


@pytest.mark.parametrize("family", FIRST_FAMILIES)
def test_detect_format_from_template_of_plain_hf_tokenizer(family: str, tmp_path: Path):
    """Without mlx-lm's wrapper (no ``tool_parser``), the template's clues decide."""
    from transformers import PreTrainedTokenizerFast

    template = (TEMPLATES_DIR / FAMILIES[family].template).read_text()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(write_tokenizer(tmp_path, template)))
    assert not hasattr(tokenizer, "tool_parser")
    assert detect_format(tokenizer).name == FAMILIES[family].format


def test_detect_format_lfm_markers_keep_their_markers(tmp_path: Path):
    """mlx-lm's ``pythonic`` parser is for ``<|tool_call_start|>`` calls (LFM2)."""
    from mlx_lm.tokenizer_utils import load

    template = (
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{%- endfor %}{%- if tools %}<|tool_list_start|>{{ tools | tojson }}<|tool_list_end|>"
        "Call with <|tool_call_start|>[name(arg=value)]<|tool_call_end|>{%- endif %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
    )
    tokenizer = load(write_tokenizer(tmp_path, template))
    assert tokenizer.tool_call_start == "<|tool_call_start|>"
    fmt = detect_format(tokenizer)
    assert (fmt.start, fmt.end) == ("<|tool_call_start|>", "<|tool_call_end|>")
    out = parse_output(
        'Sure.<|tool_call_start|>[get_time(zone="CET")]<|tool_call_end|>', tool_format=fmt
    )
    assert out.content == "Sure."
    assert as_pairs(out.tool_calls) == [TIME]


def test_detect_format_override_and_default(family_tokenizers: dict[str, Any]):
    tokenizer = family_tokenizers["hermes"]
    assert detect_format(tokenizer, "mistral").name == "mistral"
    assert detect_format(object()).name == "hermes"


def test_get_format_aliases_and_unknown_name():
    assert get_format("json_tools").name == "hermes"
    assert get_format("llama").name == "llama3_json"
    assert get_format("glm47").name == "glm"
    # A family only mlx-lm knows is used through its module.
    kimi = get_format("kimi_k2")
    assert isinstance(kimi, ToolFormat) and kimi.start and kimi.name == "kimi_k2"
    with pytest.raises(ValueError, match=r"Unknown tool-call format 'nope'.*hermes"):
        get_format("nope")


# ------------------------------------------------------ real template renders


@pytest.mark.parametrize("family", FIRST_FAMILIES)
def test_parsed_calls_and_results_render_back_natively(
    family: str, family_tokenizers: dict[str, Any]
):
    """Round trip: parse the family's reply, send the calls and results back as history."""
    fam = FAMILIES[family]
    tokenizer = family_tokenizers[family]
    caps = probe_template(tokenizer)
    assert caps.renders_tools and caps.renders_tool_messages
    fmt = detect_format(tokenizer)
    calls = calls_for(family)
    parsed = parse_output(render_reply(tokenizer, fam, calls), tool_format=fmt, tools=TOOLS)
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                # OpenAI clients send arguments as a JSON string; templates need a mapping.
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for c in parsed.tool_calls
            ],
        },
        *(
            {"role": "tool", "tool_call_id": c.id, "name": c.name, "content": f"result {i}"}
            for i, c in enumerate(parsed.tool_calls)
        ),
    ]
    prompt = render(tokenizer, history, caps=caps)
    turns = [p.split(fam.reply_end, 1)[0] for p in prompt.split(fam.reply_start)[1:]]
    written = [t for t in turns if t.strip()][-1]
    again = parse_output(written, tool_format=fmt, tools=TOOLS)
    assert as_pairs(again.tool_calls) == calls
    tail = prompt.split(written, 1)[1]
    assert all(f"result {i}" in tail for i in range(len(calls)))


@pytest.mark.parametrize("family", FIRST_FAMILIES)
def test_parse_what_the_template_writes(family: str, family_tokenizers: dict[str, Any]):
    fam: Family = FAMILIES[family]
    tokenizer = family_tokenizers[family]
    calls = calls_for(family)
    reply = render_reply(tokenizer, fam, calls)
    fmt = detect_format(tokenizer)
    whole = parse_output(reply, tool_format=fmt, tools=TOOLS)
    streamed = stream_tokens(tokenizer, reply, tool_format=fmt, tools=TOOLS)
    for out in (whole, streamed):
        assert out.invalid_tool_calls == [], reply
        assert as_pairs(out.tool_calls) == calls, reply
        assert out.content.strip() == ""
        assert len({c.id for c in out.tool_calls}) == len(calls)
        assert all(c.id.startswith("call_") for c in out.tool_calls)


def test_parse_template_reply_with_text_before_the_call(family_tokenizers: dict[str, Any]):
    """Qwen3-Coder writes the assistant's words, then the calls."""
    tokenizer = family_tokenizers["qwen3coder"]
    fam = FAMILIES["qwen3coder"]
    reply = render_reply(tokenizer, fam, [WEATHER, TIME], content="Let me check both.")
    assert reply.startswith("Let me check both.")
    fmt = detect_format(tokenizer)
    for out in (
        parse_output(reply, tool_format=fmt, tools=TOOLS),
        stream_tokens(tokenizer, reply, tool_format=fmt, tools=TOOLS),
    ):
        assert out.content.strip() == "Let me check both."
        assert as_pairs(out.tool_calls) == [WEATHER, TIME]


def test_qwen3_coder_values_stay_strings_without_tool_schemas(
    family_tokenizers: dict[str, Any],
):
    tokenizer = family_tokenizers["qwen3coder"]
    reply = render_reply(tokenizer, FAMILIES["qwen3coder"], [WEATHER])
    out = parse_output(reply, tool_format=get_format("qwen3_coder"))
    assert out.tool_calls[0].arguments == {
        "city": "Paris",
        "days": "3",
        "metric": "True",
        "hours": "[6, 12]",
    }


@pytest.mark.parametrize("family", ["hermes", "mistral_parallel"])
def test_json_families_keep_awkward_strings(family: str, family_tokenizers: dict[str, Any]):
    """Quotes, braces, brackets, newlines and non-ASCII survive the round trip."""
    args = {"note": 'He said "hi" {x} [y] (z)\nline two', "city": "São Paulo 東京 👋🏽"}
    tokenizer = family_tokenizers[family]
    reply = render_reply(tokenizer, FAMILIES[family], [("get_weather", args), TIME])
    fmt = detect_format(tokenizer)
    for out in (
        parse_output(reply, tool_format=fmt),
        stream_tokens(tokenizer, reply, tool_format=fmt),
    ):
        assert as_pairs(out.tool_calls) == [("get_weather", args), TIME]


# ---------------------------------------------------------- forms per family


def test_hermes_calls_with_text_around_and_reasoning():
    text = (
        "<think>The user wants weather.</think>\n\nChecking.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": "{\\"zone\\": \\"CET\\"}"}</tool_call>'
    )
    out = parse_output(text, tool_format=get_format("hermes"))
    assert out.reasoning == "The user wants weather."
    assert out.content == "Checking.\n\n"
    # Arguments written as a JSON string are decoded to a dict.
    assert as_pairs(out.tool_calls) == [("get_weather", {"city": "Paris"}), TIME]


def test_mistral_name_args_form():
    text = (
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}'
        '[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}'
    )
    out = parse_output(text, tool_format=get_format("mistral"))
    assert as_pairs(out.tool_calls) == [("get_weather", {"city": "Paris", "days": 3}), TIME]
    assert out.content == ""


def test_mistral_name_args_calls_without_separator():
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}get_time[ARGS]{"zone": "CET"}'
    for out in (
        parse_output(text, tool_format=get_format("mistral")),
        _stream_chars(text, tool_format=get_format("mistral")),
    ):
        assert as_pairs(out.tool_calls) == [("get_weather", {"city": "Paris"}), TIME]
        assert out.content == ""


def test_mistral_json_list_form():
    text = (
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "arguments": {"zone": "CET"}}]'
    )
    out = parse_output(text, tool_format=get_format("mistral"))
    assert as_pairs(out.tool_calls) == [("get_weather", {"city": "Paris"}), TIME]


def test_mistral_text_after_the_call_is_not_dropped():
    """The format has no end marker; words after a complete call are still answer text."""
    text = '[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}\n\nLet me check that.'
    for out in (
        parse_output(text, tool_format=get_format("mistral")),
        _stream_chars(text, tool_format=get_format("mistral")),
    ):
        assert as_pairs(out.tool_calls) == [TIME]
        assert out.content.strip() == "Let me check that."


def test_llama_python_tag_and_bare_json():
    fmt = get_format("llama3_json")
    tagged = parse_output(
        '<|python_tag|>{"name": "get_time", "parameters": {"zone": "CET"}}', tool_format=fmt
    )
    assert as_pairs(tagged.tool_calls) == [TIME]
    bare = parse_output(' \n{"name": "get_time", "parameters": {"zone": "CET"}}', tool_format=fmt)
    assert as_pairs(bare.tool_calls) == [TIME] and bare.content.strip() == ""
    spaced = parse_output('{ "name": "get_time", "parameters": {"zone": "CET"}}', tool_format=fmt)
    assert as_pairs(spaced.tool_calls) == [TIME]


def test_llama_several_calls_after_python_tag():
    text = (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {"zone": "CET"}}'
    )
    for out in (
        parse_output(text, tool_format=get_format("llama3_json")),
        _stream_chars(text, tool_format=get_format("llama3_json")),
    ):
        assert as_pairs(out.tool_calls) == [("get_weather", {"city": "Paris"}), TIME]
        assert out.content == ""


def test_llama_json_in_the_middle_of_an_answer_is_text():
    """Bare JSON counts as a call only where the reply starts."""
    text = 'An example call: {"name": "get_time", "parameters": {"zone": "CET"}}'
    out = parse_output(text, tool_format=get_format("llama3_json"))
    assert out.tool_calls == [] and out.content == text


def test_pythonic_list():
    out = parse_output(
        '[get_weather(city="Paris", days=1), get_time(zone="CET")]',
        tool_format=get_format("pythonic"),
    )
    assert as_pairs(out.tool_calls) == [("get_weather", {"city": "Paris", "days": 1}), TIME]


def test_pythonic_json_literals_and_nested_values():
    out = parse_output(
        '[f(a=true, b=null, c=false, d=[1, {"k": "v"}], e=-2.5, g=\'x\')]',
        tool_format=get_format("pythonic"),
    )
    assert out.tool_calls[0].arguments == {
        "a": True,
        "b": None,
        "c": False,
        "d": [1, {"k": "v"}],
        "e": -2.5,
        "g": "x",
    }


def test_qwen3_coder_multiline_parameter():
    text = (
        "<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n"
        "<parameter=body>\ndef f():\n    return 1\n</parameter>\n</function>\n</tool_call>"
    )
    out = parse_output(text, tool_format=get_format("qwen3_coder"))
    assert as_pairs(out.tool_calls) == [
        ("write_file", {"path": "a.py", "body": "def f():\n    return 1"})
    ]


# ------------------------------------------------------------------ malformed

MALFORMED = [
    ("hermes", '<tool_call>{"name": "get_time", "arguments": {"zone": </tool_call>', "get_time"),
    ("hermes", "<tool_call>get the time please</tool_call>", None),
    ("hermes", '<tool_call>{"arguments": {"zone": "CET"}}</tool_call>', None),
    ("hermes", '<tool_call>{"name": "get_time", "arguments": [1, 2]}</tool_call>', "get_time"),
    ("qwen3_coder", "<tool_call>\n<parameter=zone>\nCET\n</parameter>\n</tool_call>", None),
    ("mistral", '[TOOL_CALLS]get_time[ARGS]{"zone": ', "get_time"),
    ("mistral", "[TOOL_CALLS] nothing to call", None),
    ("llama3_json", '<|python_tag|>{"name": "get_time", "parameters": {"zone"', "get_time"),
    ("pythonic", '[get_time(zone="CET"', "get_time"),
    ("pythonic", "[get_time(*args)]", "get_time"),
    ("lfm", "<|tool_call_start|>[get_time(zone=]<|tool_call_end|>", "get_time"),
]


@pytest.mark.parametrize(("fmt_name", "text", "name"), MALFORMED)
def test_malformed_call_is_kept_as_invalid(fmt_name: str, text: str, name: str | None):
    fmt = get_format(fmt_name)
    for out in (parse_output(text, tool_format=fmt), _stream_chars(text, tool_format=fmt)):
        assert out.tool_calls == []
        assert len(out.invalid_tool_calls) == 1
        bad = out.invalid_tool_calls[0]
        assert bad.raw.strip() and bad.raw.strip() in text
        assert bad.error
        assert bad.name == name
        assert bad.id.startswith("call_")
        if fmt.start:
            assert fmt.start not in out.content


def test_invalid_call_between_valid_ones_keeps_order_and_neighbours():
    text = (
        '<tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>'
        "<tool_call>{oops}</tool_call>"
        '<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>'
    )
    parser = ChatOutputParser(tool_format=get_format("hermes"))
    events = parser.feed(text) + parser.finish()
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["ParsedToolCall", "InvalidToolCall", "ParsedToolCall"]
    assert events[1].raw == "{oops}"  # type: ignore[union-attr]


def test_parse_body_never_raises_on_parser_errors():
    class Boom(ToolFormat):
        name, start, end = "boom", "<c>", "</c>"

        def parse(self, body: str, tools: Any = None) -> Any:
            raise RuntimeError("parser bug")

    fmt = Boom()
    (bad,) = parse_calls(fmt, '{"name": "x"}')
    assert isinstance(bad, InvalidToolCall)
    assert bad.error == "RuntimeError: parser bug" and bad.name == "x"


def test_no_format_leaves_markup_as_text():
    text = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    out = parse_output(text, tool_format=None)
    assert out.content == text and out.tool_calls == []


def _stream_chars(text: str, **options: Any) -> ParsedOutput:
    parser = ChatOutputParser(**options)
    events = []
    for ch in text:
        events += parser.feed(ch)
    events += parser.finish()
    assert all(not isinstance(e, TextDelta) or e.text for e in events)
    return collect(events)


# ------------------------------------------- templates that check call ids

# Written for these tests: like Mistral v0.3, Nemo and Small 3.x templates, it raises
# unless every tool-call id has exactly 9 characters.
STRICT_IDS_TEMPLATE = (
    "{%- macro check(id) %}{% if id is not defined or id|length != 9 %}"
    "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
    "{% endif %}{% endmacro %}"
    "{%- if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{%- elif m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS][{% for c in m.tool_calls %}"
    "{{- check(c.id) }}{{ {'name': c.function.name, 'arguments': c.function.arguments,"
    " 'id': c.id}|tojson }}{% if not loop.last %}, {% endif %}{% endfor %}]<|im_end|>"
    "{%- elif m.role == 'assistant' %}{{ m.content }}<|im_end|>"
    "{%- elif m.role == 'tool' %}{{ check(m.tool_call_id) }}"
    "[TOOL_RESULTS]{{ {'content': m.content, 'call_id': m.tool_call_id}|tojson }}[/TOOL_RESULTS]"
    "{%- endif %}{%- endfor %}"
)


def test_templates_that_need_nine_character_ids_get_native_tool_messages(tmp_path: Path):
    from mlx_lm.tokenizer_utils import load

    from mlx_integrations.chat.template import short_call_id

    tokenizer = load(write_tokenizer(tmp_path, STRICT_IDS_TEMPLATE))
    caps = probe_template(tokenizer)
    assert caps.renders_tools and caps.renders_tool_messages and caps.short_call_ids
    history = [
        {"role": "user", "content": "Weather in Paris and the time in CET?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": n, "arguments": a}}
                for cid, (n, a) in [("call_5f2e9a0b7c1d4e3f", WEATHER), ("call_0", TIME)]
            ],
        },
        {"role": "tool", "tool_call_id": "call_5f2e9a0b7c1d4e3f", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_0", "content": "10:00"},
    ]
    prompt = render(tokenizer, history, caps=caps)
    weather_id, time_id = short_call_id("call_5f2e9a0b7c1d4e3f"), short_call_id("call_0")
    assert weather_id != time_id and len(weather_id) == len(time_id) == 9
    # Each result names the id of its own call, so the model can pair them.
    assert f'"id": "{weather_id}"' in prompt and f'"call_id": "{weather_id}"' in prompt
    assert f'"id": "{time_id}"' in prompt and f'"call_id": "{time_id}"' in prompt
    assert "call_5f2e" not in prompt


def test_templates_that_take_any_id_see_the_ids_unchanged(family_tokenizers: dict[str, Any]):
    caps = probe_template(family_tokenizers["mistral_parallel"])
    assert caps.renders_tool_messages and not caps.short_call_ids


def test_mistral_call_ids_and_the_same_words_inside_arguments():
    text = (
        '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "x[CALL_ID]y[ARGS]z"}'
        '[TOOL_CALLS]get_time[CALL_ID]f5g6h7i8j[ARGS]{"zone": "CET"}'
    )
    streaming = ChatOutputParser(tool_format=get_format("mistral"))
    for out in (
        parse_output(text, tool_format=get_format("mistral")),
        collect(streaming.feed(text) + streaming.finish()),
    ):
        assert as_pairs(out.tool_calls) == [("get_weather", {"city": "x[CALL_ID]y[ARGS]z"}), TIME]


# ------------------------------------------------- what the templates need from us


def _history_without_tool_name() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_abcdef123",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        # LangChain's ToolMessage often carries no name: the call it answers names it.
        {"role": "tool", "tool_call_id": "call_abcdef123", "content": "sunny"},
    ]


@pytest.mark.parametrize("family", ["hermes", "qwen3"])
def test_a_tool_result_without_a_name_renders(family: str, family_tokenizers: dict[str, Any]):
    tokenizer = family_tokenizers[family]
    messages = normalize_messages(_history_without_tool_name())
    assert messages[2]["name"] == "get_weather"
    prompt = render(tokenizer, _history_without_tool_name())
    assert "sunny" in prompt and "get_weather" in prompt


def test_llama4_takes_its_tools_as_custom_tools(family_tokenizers: dict[str, Any]):
    tokenizer = family_tokenizers["llama4_pythonic"]
    caps = probe_template(tokenizer)
    assert caps.renders_tools and caps.tools_argument == "custom_tools"
    prompt = render(
        tokenizer, [{"role": "user", "content": "hi"}], caps=caps, native=caps.renders_tool_messages
    )
    # The definitions reach the template itself: no Hermes description is added.
    assert "Weather forecast for a city." in prompt and "<tool_call>" not in prompt


# A DeepSeek-style template that concatenates the arguments into the prompt as a string.
STRING_ARGUMENTS_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}"
    "{% for c in m.tool_calls %}<|call|>{{ c.function.name }}\n"
    "{{ '```json\\n' + c.function.arguments + '\\n```' }}{% endfor %}"
    "{% elif m.role == 'tool' %}<|result|>{{ m.content }}"
    "{% else %}<|{{ m.role }}|>{{ m.content }}{% endif %}{% endfor %}"
    "{% if tools %}{{ tools | tojson }}{% endif %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_templates_that_take_arguments_as_a_string_get_them_natively(tmp_path: Path):
    from mlx_lm.tokenizer_utils import load

    tokenizer = load(write_tokenizer(tmp_path, STRING_ARGUMENTS_TEMPLATE))
    caps = probe_template(tokenizer)
    assert caps.renders_tool_messages and caps.string_arguments
    prompt = render(tokenizer, _history_without_tool_name(), caps=caps)
    assert '<|call|>get_weather\n```json\n{"city": "Paris"}\n```' in prompt
    assert "<|result|>sunny" in prompt


# ------------------------------------------------- replies that only look like calls

ODD_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "send-mail",
            "parameters": {
                "type": "object",
                "properties": {"from": {"type": "string"}, "user-id": {"type": "integer"}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "rate",
            "parameters": {"type": "object", "properties": {"title": {"type": "array"}}},
        },
    },
]


def test_pythonic_calls_with_names_python_cannot_read():
    text = '[send-mail(from="ann@x.org", user-id=7), rate(title=["True Grit"])]'
    out = parse_output(text, tool_format=get_format("pythonic"), tools=ODD_TOOLS)
    assert as_pairs(out.tool_calls) == [
        ("send-mail", {"from": "ann@x.org", "user-id": 7}),
        ("rate", {"title": ["True Grit"]}),
    ]


@pytest.mark.parametrize(
    "answer",
    ["[1] Smith et al. found it.", "[Paris](https://en.wikipedia.org/wiki/Paris)", "[2, 3]"],
)
def test_a_pythonic_answer_starting_with_a_bracket_is_text(answer: str):
    fmt = get_format("pythonic")
    for out in (
        parse_output(answer, tool_format=fmt, tools=TOOLS),
        _stream_chars(answer, tool_format=fmt, tools=TOOLS),
    ):
        assert out.content == answer and out.tool_calls == out.invalid_tool_calls == []


def test_a_json_answer_is_not_a_llama_call():
    fmt = get_format("llama3_json")
    answer = '{"name": "Paris", "population": 2100000}'
    for out in (
        parse_output(answer, tool_format=fmt, tools=TOOLS),
        _stream_chars(answer, tool_format=fmt, tools=TOOLS),
    ):
        assert out.content == answer and out.tool_calls == out.invalid_tool_calls == []
    # A call of a tool that is not bound is not taken for a call either.
    other = '{"name": "book_flight", "parameters": {"to": "Rome"}}'
    assert parse_output(other, tool_format=fmt, tools=TOOLS).content == other


@pytest.mark.parametrize(
    ("fmt_name", "cut"),
    [
        (
            "glm",
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3",
        ),
        (
            "qwen3_coder",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3",
        ),
    ],
)
def test_a_tagged_call_cut_at_the_token_limit_is_invalid(fmt_name: str, cut: str):
    fmt = get_format(fmt_name)
    for out in (
        parse_output(cut, tool_format=fmt, tools=TOOLS),
        _stream_chars(cut, tool_format=fmt, tools=TOOLS),
    ):
        assert out.tool_calls == [] and len(out.invalid_tool_calls) == 1


def test_strings_are_read_back_as_declared_types_only_when_whole():
    from mlx_integrations.chat.tool_formats.base import coerce_to_schema

    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "n": {"type": "integer"},
                        "ok": {"type": "boolean"},
                        "xs": {"type": "array"},
                        "x": {"type": "number"},
                        "level": {"enum": [1, 2]},
                    },
                },
            },
        }
    ]
    calls = [
        {
            "name": "f",
            "arguments": {"n": "3", "ok": "True", "xs": '["True Grit"]', "x": "NaN", "level": "2"},
        }
    ]
    assert coerce_to_schema(calls, tools)[0]["arguments"] == {
        "n": 3,
        "ok": True,
        "xs": ["True Grit"],
        "x": "NaN",
        "level": 2,
    }


def test_required_arguments_must_be_listed():
    from mlx_integrations.chat.tools import read_tools

    bad = {
        "name": "f",
        "parameters": {"type": "object", "properties": {"city": {}}, "required": ["town"]},
    }
    with pytest.raises(
        ValueError, match=r"Tool 'f' requires 'town', which is not among its properties \(city\)"
    ):
        read_tools([bad])
    open_ended = {
        "name": "g",
        "parameters": {"type": "object", "required": ["town"], "additionalProperties": True},
    }
    assert read_tools([open_ended])[0].name == "g"
