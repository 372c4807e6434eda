"""Streaming parse equals whole-text parse, for every format and every way to cut a reply.

Replies are built from parts (reasoning, answer text, calls in each format's own
syntax), so the expected text, reasoning and calls are known. Every cut of the
text into pieces must give the same events as parsing it whole, and those events
must be the parts the reply was built from.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mlx_integrations.chat.output_parser import (
    ChatOutputParser,
    Event,
    ReasoningDelta,
    TextDelta,
    collect,
    parse_output,
)
from mlx_integrations.chat.tool_formats import (
    InvalidToolCall,
    ParsedToolCall,
    format_names,
    get_format,
)

THINK = ("<think>", "</think>")
# Markers that must never reach answer text, per format (plus the thinking markers).
MARKUP = {
    "hermes": ["<tool_call>", "</tool_call>"],
    "qwen3_coder": ["<tool_call>", "</tool_call>", "<function=", "<parameter="],
    "mistral": ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"],
    "llama3_json": ["<|python_tag|>", '"parameters"'],
    # A pythonic call is only one where the reply starts, so these may stand in text.
    "pythonic": [],
    "lfm": ["<|tool_call_start|>", "<|tool_call_end|>"],
    "glm": ["<tool_call>", "</tool_call>", "<arg_key>", "<arg_value>"],
    "deepseek": ["<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>"],
}
PROPERTY_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Answer and reasoning text: marker characters included, so partial markers occur;
# no "_" or "|", so no full marker can form by chance.
_CHARS = "abcdefXYZ019 \n\t.,!?:'-<>/[]{}()=\"é東👋"
_SAFE_CHARS = "abcdefXYZ019 \n.,!?'-é東"  # after an end-less call: nothing call-like


def _text(chars: str, min_size: int = 1) -> st.SearchStrategy[str]:
    # Starting with a letter keeps bare-call formats (`[`, `{"name"`) from seeing a call.
    return st.builds(
        lambda head, tail: head + tail,
        st.sampled_from("aZé東"),
        st.text(alphabet=chars, min_size=min_size - 1, max_size=30),
    )


ANSWER = _text(_CHARS)
TRAILING = _text(_SAFE_CHARS)
REASONING = st.text(alphabet=_CHARS + "_|", min_size=0, max_size=40)

_json_scalar = st.one_of(
    st.integers(-(10**6), 10**6),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(alphabet='abcXYZ 09\n\\"{}[]()<>/:,;=é東👋', max_size=12),
)
CALL_IDS = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
    min_size=9,
    max_size=9,
)
JSON_ARGS = st.dictionaries(
    st.sampled_from(["city", "days", "q", "x1", "unit"]),
    st.one_of(_json_scalar, st.lists(_json_scalar, max_size=3)),
    max_size=4,
)
# Qwen3-Coder values are raw text between tags; without schemas they stay strings.
XML_ARGS = st.dictionaries(
    st.sampled_from(["city", "days", "q", "x1", "unit"]),
    st.text(alphabet="abcXYZ 09.,:é東{}[]()\n", min_size=1, max_size=12).filter(
        lambda v: v.strip().lower() != "null"
    ),
    max_size=3,
)
# GLM values are raw text too, and read back as JSON where they parse: keep them words.
GLM_ARGS = st.dictionaries(
    st.sampled_from(["city", "days", "q", "x1", "unit"]),
    st.text(alphabet="abcXYZé東", min_size=1, max_size=8).filter(
        lambda v: v.lower() not in ("null", "true", "false")
    ),
    max_size=3,
)
NAMES = st.sampled_from(["get_weather", "get_time", "search", "f"])


@dataclass
class Reply:
    """A reply and the parts it was built from."""

    text: str = ""
    content: str = ""
    reasoning: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    call_ends: list[int] = field(default_factory=list)
    """Offset in ``text`` after which each call is complete."""

    def add_text(self, text: str) -> None:
        self.text += text
        self.content += text

    def add_calls(self, markup: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
        self.text += markup
        self.calls += calls
        self.call_ends += [len(self.text)] * len(calls)


def _hermes_call(name: str, args: dict[str, Any], args_first: bool) -> str:
    obj = {"arguments": args, "name": name} if args_first else {"name": name, "arguments": args}
    return f"<tool_call>\n{json.dumps(obj, ensure_ascii=False)}\n</tool_call>"


def _xml_call(name: str, args: dict[str, Any]) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _pythonic_list(calls: list[tuple[str, dict[str, Any]]]) -> str:
    def call(name: str, args: dict[str, Any]) -> str:
        return (
            f"{name}("
            + ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
            + ")"
        )

    return "[" + ", ".join(call(n, a) for n, a in calls) + "]"


@st.composite
def replies(draw: st.DrawFn, fmt: str) -> Reply:
    """A reply in format ``fmt``: maybe reasoning, maybe text, calls, maybe more text."""
    reply = Reply()
    if draw(st.booleans()):
        reply.reasoning = draw(REASONING)
        reply.text += f"<think>{reply.reasoning}</think>" + draw(
            st.sampled_from(["", "\n", "\n\n"])
        )
    args = {"qwen3_coder": XML_ARGS, "glm": GLM_ARGS}.get(fmt, JSON_ARGS)
    calls = draw(st.lists(st.tuples(NAMES, args), min_size=0, max_size=3))
    leading = draw(st.booleans())
    if fmt in ("hermes", "qwen3_coder", "lfm", "glm", "deepseek"):
        # Formats with an end marker: text may stand anywhere between calls.
        if leading:
            reply.add_text(draw(ANSWER))
        for name, a in calls:
            if fmt == "hermes":
                markup = _hermes_call(name, a, draw(st.booleans()))
            elif fmt == "qwen3_coder":
                markup = _xml_call(name, a)
            elif fmt in ("glm", "deepseek"):
                markup = get_format(fmt).write_calls([(name, a)])
            else:
                markup = f"<|tool_call_start|>{_pythonic_list([(name, a)])}<|tool_call_end|>"
            reply.add_calls(markup, [(name, a)])
            if draw(st.booleans()):
                reply.add_text(draw(ANSWER))
        return reply
    # Formats without end marker: calls close the answer; text may follow them.
    if fmt == "pythonic":
        leading = False  # a pythonic call list is only recognized where the reply starts
    elif fmt == "llama3_json" and not calls:
        leading = True
    if leading or not calls:
        reply.add_text(draw(ANSWER))
    if calls:
        if fmt == "mistral":
            form = draw(st.sampled_from(["list", "headers", "markers", "call_ids"]))
            if form == "list":
                items = [{"name": n, "arguments": a} for n, a in calls]
                reply.add_calls(f"[TOOL_CALLS] {json.dumps(items, ensure_ascii=False)}", calls)
            else:
                for i, (n, a) in enumerate(calls):
                    marker = "[TOOL_CALLS]" if form == "markers" or i == 0 else ""
                    # Newer Mistral tokenizers write an id between name and arguments.
                    call_id = f"[CALL_ID]{draw(CALL_IDS)}" if form == "call_ids" else ""
                    reply.add_calls(
                        f"{marker}{n}{call_id}[ARGS]{json.dumps(a, ensure_ascii=False)}",
                        [(n, a)],
                    )
        elif fmt == "llama3_json":
            reply.text += "<|python_tag|>" if leading else draw(st.sampled_from(["", " ", "\n"]))
            for i, (n, a) in enumerate(calls):
                sep = "; " if i else ""
                obj = json.dumps({"name": n, "parameters": a}, ensure_ascii=False)
                reply.add_calls(sep + obj, [(n, a)])
        else:
            reply.add_calls(_pythonic_list(calls), calls)
        if draw(st.booleans()):
            reply.add_text(draw(st.sampled_from(["", "\n", " "])) + draw(TRAILING))
    return reply


def normalized(events: list[Event]) -> list[tuple[Any, ...]]:
    """Events with adjacent deltas joined and call ids left out (they are random)."""
    out: list[tuple[Any, ...]] = []
    for ev in events:
        if isinstance(ev, (TextDelta, ReasoningDelta)):
            assert ev.text, "empty delta"
            kind = type(ev).__name__
            if out and out[-1][0] == kind:
                out[-1] = (kind, out[-1][1] + ev.text)
            else:
                out.append((kind, ev.text))
        elif isinstance(ev, ParsedToolCall):
            out.append(("call", ev.name, ev.arguments))
        else:
            assert isinstance(ev, InvalidToolCall)
            out.append(("invalid", ev.raw, ev.error, ev.name))
    return out


def run(pieces: list[str], **options: Any) -> list[Event]:
    parser = ChatOutputParser(**options)
    events: list[Event] = []
    for piece in pieces:
        events += parser.feed(piece)
    return events + parser.finish()


def cut(text: str, points: list[int]) -> list[str]:
    bounds = [0, *sorted(set(points)), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def check_no_markup(events: list[Event], fmt: str) -> None:
    for ev in events:
        if isinstance(ev, TextDelta):
            for marker in [*MARKUP[fmt], *THINK]:
                assert marker not in ev.text, (marker, ev.text)


def check_streaming_matches_whole(text: str, points: list[int], **options: Any) -> None:
    whole = normalized(run([text], **options))
    for i in range(len(text) + 1):
        assert normalized(run([text[:i], text[i:]], **options)) == whole, i
    assert normalized(run(list(text), **options)) == whole
    assert normalized(run(cut(text, points), **options)) == whole


def ws_free(text: str) -> str:
    return "".join(text.split())


@pytest.mark.parametrize("fmt", format_names())
@PROPERTY_SETTINGS
@given(data=st.data())
def test_every_split_gives_the_whole_text_events(fmt: str, data: st.DataObject):
    reply = data.draw(replies(fmt))
    options = {"tool_format": get_format(fmt)}
    points = data.draw(st.lists(st.integers(0, len(reply.text)), max_size=12))
    check_streaming_matches_whole(reply.text, points, **options)

    events = run([reply.text], **options)
    check_no_markup(events, fmt)
    out = collect(events)
    assert out.invalid_tool_calls == []
    assert [(c.name, c.arguments) for c in out.tool_calls] == reply.calls
    assert len({c.id for c in out.tool_calls}) == len(reply.calls)
    assert out.reasoning == reply.reasoning
    assert ws_free(out.content) == ws_free(reply.content)


@pytest.mark.parametrize("fmt", format_names())
@PROPERTY_SETTINGS
@given(data=st.data())
def test_each_call_comes_out_once_its_text_is_complete(fmt: str, data: st.DataObject):
    reply = data.draw(replies(fmt))
    parser = ChatOutputParser(tool_format=get_format(fmt))
    seen = 0
    for i, ch in enumerate(reply.text, start=1):
        seen += sum(isinstance(e, ParsedToolCall) for e in parser.feed(ch))
        assert seen == sum(end <= i for end in reply.call_ends), (i, reply.text[:i])
    parser.finish()


@pytest.mark.parametrize("fmt", format_names())
@PROPERTY_SETTINGS
@given(data=st.data())
def test_reasoning_opened_by_the_prompt(fmt: str, data: st.DataObject):
    """Templates that end the generation prompt with ``<think>``: the reply starts inside."""
    reply = data.draw(replies(fmt))
    assume(reply.text.startswith("<think>"))
    text = reply.text.removeprefix("<think>")
    options = {"tool_format": get_format(fmt), "starts_in_reasoning": True}
    points = data.draw(st.lists(st.integers(0, len(text)), max_size=8))
    check_streaming_matches_whole(text, points, **options)
    out = parse_output(text, **options)
    assert out.reasoning == reply.reasoning
    assert [(c.name, c.arguments) for c in out.tool_calls] == reply.calls


@pytest.mark.parametrize("fmt", format_names())
@PROPERTY_SETTINGS
@given(data=st.data())
def test_truncated_replies_never_raise(fmt: str, data: st.DataObject):
    """A reply cut anywhere (max_tokens) parses the same streamed and whole, without error."""
    reply = data.draw(replies(fmt))
    text = reply.text[: data.draw(st.integers(0, len(reply.text)))]
    points = data.draw(st.lists(st.integers(0, len(text)), max_size=8))
    check_streaming_matches_whole(text, points, tool_format=get_format(fmt))
    check_no_markup(run([text], tool_format=get_format(fmt)), fmt)


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder", "lfm"])
@PROPERTY_SETTINGS
@given(data=st.data())
def test_whatever_stands_between_call_markers_is_a_call_or_an_invalid_call(
    fmt: str, data: st.DataObject
):
    f = get_format(fmt)
    body = data.draw(st.text(alphabet=_CHARS + '"', max_size=60))
    assume(f.end not in body and f.start not in body)
    before = data.draw(ANSWER)
    text = f"{before}{f.start}{body}{f.end}"
    points = data.draw(st.lists(st.integers(0, len(text)), max_size=8))
    check_streaming_matches_whole(text, points, tool_format=f)
    events = run([text], tool_format=f)
    # Even an empty call is reported: the model opened a call and wrote nothing.
    calls = [e for e in events if isinstance(e, (ParsedToolCall, InvalidToolCall))]
    assert len(calls) == 1
    if isinstance(calls[0], InvalidToolCall):
        assert calls[0].raw == body and calls[0].error
    assert collect(events).content == before


def _fragments(fmt: str) -> st.SearchStrategy[str]:
    f = get_format(fmt)
    pieces = [f.start, f.end, *f.bare_prefixes, *THINK, "[ARGS]", "<function=f>", "<parameter=x>"]
    pieces += ['"name": "f"', '"arguments"', "f(a=1)", "{", "}", "[", "]", "(", ")", '"', ":", ";"]
    return st.one_of(st.sampled_from([p for p in pieces if p]), st.text(max_size=6))


@pytest.mark.parametrize("fmt", format_names())
@PROPERTY_SETTINGS
@given(data=st.data())
def test_arbitrary_text_never_raises_and_splits_agree(fmt: str, data: st.DataObject):
    """Random mixes of markers, brackets and text: no exception, same events however cut."""
    text = "".join(data.draw(st.lists(_fragments(fmt), max_size=25)))
    points = data.draw(st.lists(st.integers(0, len(text)), max_size=8))
    for starts_in_reasoning in (False, True):
        check_streaming_matches_whole(
            text, points, tool_format=get_format(fmt), starts_in_reasoning=starts_in_reasoning
        )


# ----------------------------------------------------------------- reasoning


def test_reasoning_is_split_from_the_answer():
    text = "<think>Paris is in France.\nSo: Paris.</think>\n\nThe capital is Paris."
    out = parse_output(text)
    assert out.reasoning == "Paris is in France.\nSo: Paris."
    assert out.content == "The capital is Paris."


@pytest.mark.parametrize("markers", [THINK, ("[THINK]", "[/THINK]"), ("<|think|>", "<|/think|>")])
def test_markers_split_across_pieces_anywhere(markers: tuple[str, str]):
    start, end = markers
    text = f"{start}step one{end}\n\nAnswer <b>ok</b>."
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            out = collect(run([text[:i], text[i:j], text[j:]], think_markers=markers))
            assert (out.reasoning, out.content) == ("step one", "Answer <b>ok</b>."), (i, j)


def test_reasoning_streams_before_it_is_closed():
    parser = ChatOutputParser()
    assert parser.feed("<thi") == []
    assert normalized(parser.feed("nk>Let me see</th")) == [("ReasoningDelta", "Let me see")]
    assert normalized(parser.feed("ink>\n")) == []
    assert normalized(parser.feed("\nYes.")) == [("TextDelta", "Yes.")]
    assert parser.finish() == []


def test_starts_in_reasoning():
    out = parse_output("the user greets me</think>Hello!", starts_in_reasoning=True)
    assert (out.reasoning, out.content) == ("the user greets me", "Hello!")
    # Without the flag the closing marker is plain text: the flag is what makes it work.
    plain = parse_output("the user greets me</think>Hello!")
    assert plain.reasoning == "" and "</think>" in plain.content


def test_unclosed_reasoning_is_all_reasoning():
    out = parse_output("<think>still thinking when max_tokens hit")
    assert (out.reasoning, out.content) == ("still thinking when max_tokens hit", "")


def test_empty_reasoning_block_as_written_with_thinking_off():
    out = parse_output("<think>\n\n</think>\n\nHi.", starts_in_reasoning=False)
    assert out.reasoning == "\n\n" and out.content == "Hi."


def test_tool_markup_inside_reasoning_stays_reasoning():
    text = (
        '<think>I could write <tool_call>{"name": "x", "arguments": {}}</tool_call></think>'
        "No call needed."
    )
    out = parse_output(text, tool_format=get_format("hermes"))
    assert out.tool_calls == [] and out.invalid_tool_calls == []
    assert "<tool_call>" in out.reasoning and out.content == "No call needed."


def test_without_think_markers_everything_is_text():
    text = "<think>x</think>y"
    assert parse_output(text, think_markers=None).content == text
    assert parse_output(text, think_markers=None, starts_in_reasoning=True).content == text


def test_reasoning_then_call_then_text_in_order():
    text = (
        "<think>need weather</think>\n"
        'Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
        " Done."
    )
    events = normalized(run(list(text), tool_format=get_format("hermes")))
    assert events == [
        ("ReasoningDelta", "need weather"),
        ("TextDelta", "Checking."),
        ("call", "get_weather", {"city": "Paris"}),
        ("TextDelta", " Done."),
    ]


def test_end_marker_inside_an_argument_string_does_not_end_the_call():
    from mlx_integrations.chat.tool_formats import get_format

    text = (
        'Hi <tool_call>{"name": "f", "arguments": {"d": "see </tool_call> here"}}</tool_call> bye'
    )
    whole = parse_output(text, tool_format=get_format("hermes"))
    assert [c.arguments for c in whole.tool_calls] == [{"d": "see </tool_call> here"}]
    assert whole.content == "Hi  bye" and whole.invalid_tool_calls == []
    for cut in range(1, len(text)):
        parser = ChatOutputParser(tool_format=get_format("hermes"))
        out = collect(parser.feed(text[:cut]) + parser.feed(text[cut:]) + parser.finish())
        assert [c.arguments for c in out.tool_calls] == [{"d": "see </tool_call> here"}]
        assert out.content == "Hi  bye"
