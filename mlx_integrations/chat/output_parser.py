"""Splitting a model's reply into text, reasoning and tool calls, while it streams.

Markup never leaks into text: anything that may be the start of a marker is held
back until the next piece decides. Text before a call comes out as text; each call
comes out as soon as its closing marker arrives; calls keep their order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlx_integrations.chat.reasoning import THINK_MARKERS
from mlx_integrations.chat.stopping import partial_suffix_len
from mlx_integrations.chat.tool_formats import (
    InvalidToolCall,
    ParsedToolCall,
    ToolFormat,
    parse_calls,
)

# After a call of a family without end marker, what may stand before the next call.
_SEPARATORS = " \t\r\n;,"


@dataclass
class TextDelta:
    """Answer text."""

    text: str


@dataclass
class ReasoningDelta:
    """Text the model wrote inside its thinking markers."""

    text: str


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token and its log-probability.

    Attributes:
        token_id: The token sampled.
        logprob: Its log-probability (natural log) under the distribution it was
            sampled from (after the request's logits processors, before temperature).
        top: The most likely tokens of that step, ``(token_id, logprob)``, most likely
            first (``top_logprobs`` of them).
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = field(default=())


@dataclass
class Logprobs:
    """The log-probabilities of the tokens of the reply's latest events (where the
    request asked for them), in OpenAI's ``logprobs.content`` shape
    (:func:`~mlx_integrations.chat.completion.logprob_content`)."""

    content: list[dict[str, Any]]


Event = TextDelta | ReasoningDelta | ParsedToolCall | InvalidToolCall


@dataclass
class ParsedOutput:
    """A whole reply, split."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ParsedToolCall] = field(default_factory=list)
    invalid_tool_calls: list[InvalidToolCall] = field(default_factory=list)

    def add(self, event: Event) -> None:
        """Fold one more event of the reply in."""
        if isinstance(event, TextDelta):
            self.content += event.text
        elif isinstance(event, ReasoningDelta):
            self.reasoning += event.text
        elif isinstance(event, ParsedToolCall):
            self.tool_calls.append(event)
        else:
            self.invalid_tool_calls.append(event)


class ChatOutputParser:
    """Incremental parser of one reply.

    Args:
        tool_format: The model's tool-call format, or None to leave markup as text
            (no tools bound, or ``tool_choice="none"``).
        tools: Tool definitions, passed to parsers that coerce argument types.
        think_markers: (start, end) of reasoning, or None when the model has none.
        starts_in_reasoning: The prompt already opened the thinking block (templates
            that end the generation prompt with ``<think>``).
    """

    def __init__(
        self,
        *,
        tool_format: ToolFormat | None = None,
        tools: Any = None,
        think_markers: tuple[str, str] | None = THINK_MARKERS,
        starts_in_reasoning: bool = False,
    ):
        self._fmt = tool_format
        self._tools = tools
        self._think = think_markers
        self._buf = ""
        self._state = "reasoning" if (starts_in_reasoning and think_markers) else "text"
        self._at_start = True  # no answer text yet (bare-call formats only start a reply)
        self._bare = False  # the call being read began without a marker
        self._after_think = False  # newlines right after the end of reasoning are dropped
        self._scanned = 0  # end-less call: buffer positions already tried as a call's end

    def feed(self, text: str) -> list[Event]:
        """Add the next piece of the reply; return what it completes."""
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        """The reply ended: flush held text, close an open call."""
        return self._drain(final=True)

    # ------------------------------------------------------------------ internals

    def _drain(self, final: bool) -> list[Event]:
        events: list[Event] = []
        while True:
            if self._state == "reasoning":
                if not self._step_reasoning(events, final):
                    break
            elif self._state == "text":
                if not self._step_text(events, final):
                    break
            elif self._state == "more_calls":
                if not self._step_more_calls(final):
                    break
            elif not self._step_call(events, final):
                break
        return _merge(events)

    def _step_reasoning(self, events: list[Event], final: bool) -> bool:
        assert self._think is not None
        end = self._think[1]
        idx = self._buf.find(end)
        if idx >= 0:
            self._emit_reasoning(events, self._buf[:idx])
            self._buf = self._buf[idx + len(end) :]
            self._state = "text"
            self._after_think = True
            return True
        keep = 0 if final else partial_suffix_len(self._buf, [end])
        self._emit_reasoning(events, self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep :]
        return False

    def _step_text(self, events: list[Event], final: bool) -> bool:
        if self._after_think:
            # The newlines may come in a later piece than the end marker.
            self._buf = self._buf.lstrip("\n")
            if not self._buf:
                return False
            self._after_think = False
        fmt = self._fmt
        if fmt and fmt.bare_prefixes and self._at_start:
            stripped = self._buf.lstrip()
            if not stripped:
                return False if not final else self._flush_text(events)
            begins = fmt.bare_start(stripped)
            if begins:
                self._buf = stripped
                self._state = "call"
                self._bare = True
                return True
            if begins is None and not final:
                return False  # too short to tell yet
        markers: list[tuple[str, str]] = []
        if self._think:
            markers.append((self._think[0], "reasoning"))
        if fmt and fmt.start:
            markers.append((fmt.start, "call"))
        first: tuple[int, str, str] | None = None
        for marker, state in markers:
            idx = self._buf.find(marker)
            if idx >= 0 and (first is None or idx < first[0]):
                first = (idx, marker, state)
        if first is not None:
            idx, marker, state = first
            self._emit_text(events, self._buf[:idx])
            self._buf = self._buf[idx + len(marker) :]
            self._state = state
            return True
        if final:
            return self._flush_text(events)
        keep = partial_suffix_len(self._buf, [m for m, _ in markers])
        self._emit_text(events, self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep :]
        return False

    def _flush_text(self, events: list[Event]) -> bool:
        self._emit_text(events, self._buf)
        self._buf = ""
        return False

    def _step_call(self, events: list[Event], final: bool) -> bool:
        fmt = self._fmt
        assert fmt is not None
        if not fmt.end:
            return self._step_open_call(events, final)
        # The end marker can occur inside an argument string; the call ends at the first
        # occurrence where the body parses. Until one does, wait for more text.
        first = idx = self._buf.find(fmt.end)
        while idx >= 0:
            parsed = parse_calls(fmt, self._buf[:idx], self._tools)
            if all(isinstance(p, ParsedToolCall) for p in parsed):
                return self._close_call(events, parsed, idx + len(fmt.end))
            idx = self._buf.find(fmt.end, idx + 1)
        if first >= 0 and final:
            parsed = parse_calls(fmt, self._buf[:first], self._tools)
            return self._close_call(events, parsed, first + len(fmt.end))
        if final:
            if self._buf.strip():
                events.extend(parse_calls(fmt, self._buf, self._tools))
            self._buf = ""
        return False

    def _close_call(
        self, events: list[Event], parsed: list[ParsedToolCall | InvalidToolCall], end: int
    ) -> bool:
        events.extend(parsed)
        self._buf = self._buf[end:]
        self._state = "text"
        self._at_start = False
        return True

    def _step_open_call(self, events: list[Event], final: bool) -> bool:
        """A call of a format without end marker (Mistral, Llama, pythonic).

        It ends at the first point where its text parses as complete calls, so a call
        comes out as soon as it is whole, whatever the pieces; the next start marker
        or the end of the reply also ends it.
        """
        fmt = self._fmt
        assert fmt is not None
        nxt = self._buf.find(fmt.start) if fmt.start else -1
        limit = nxt if nxt >= 0 else len(self._buf)
        for i in range(self._scanned, limit):
            if self._buf[i] not in "}])":
                continue
            parsed = parse_calls(fmt, self._buf[: i + 1], self._tools)
            if all(isinstance(p, ParsedToolCall) for p in parsed):
                events.extend(parsed)
                self._buf = self._buf[i + 1 :]
                self._scanned = 0
                self._state = "more_calls"
                self._at_start = False
                return True
        self._scanned = limit
        if nxt < 0 and not final:
            return False
        body = self._buf[:limit]
        if body.strip():
            if self._bare and fmt.is_answer(body, self._tools):
                self._emit_text(events, body)  # it looked like a call, but it is the answer
            else:
                events.extend(parse_calls(fmt, body, self._tools))
        self._bare = False
        self._buf = self._buf[limit + len(fmt.start) :] if nxt >= 0 else ""
        self._scanned = 0
        self._state = "call" if nxt >= 0 else "text"
        return nxt >= 0

    def _step_more_calls(self, final: bool) -> bool:
        """After a call without end marker: decide whether another call or text follows."""
        head = self._buf.lstrip(_SEPARATORS)
        fmt = self._fmt
        assert fmt is not None
        if head and fmt.next_call.match(head):
            self._buf = head  # ``; {...}``, ``, [...]``, ``b[ARGS]{...}``
            self._state = "call"
        elif not final and (
            not head or (fmt.maybe_next_call is not None and fmt.maybe_next_call.fullmatch(head))
        ):
            return False  # too short to tell
        else:
            self._state = "text"
        return True

    def _emit_text(self, events: list[Event], text: str) -> None:
        if text:
            if text.strip():
                self._at_start = False
            events.append(TextDelta(text))

    @staticmethod
    def _emit_reasoning(events: list[Event], text: str) -> None:
        if text:
            events.append(ReasoningDelta(text))


def _merge(events: list[Event]) -> list[Event]:
    merged: list[Event] = []
    for ev in events:
        if merged and type(ev) in (TextDelta, ReasoningDelta) and type(merged[-1]) is type(ev):
            merged[-1].text += ev.text  # type: ignore[union-attr]
        else:
            merged.append(ev)
    return merged


def collect(events: list[Event], into: ParsedOutput | None = None) -> ParsedOutput:
    """Fold events into a :class:`ParsedOutput`."""
    out = into or ParsedOutput()
    for ev in events:
        out.add(ev)
    return out


def parse_output(text: str, **options: Any) -> ParsedOutput:
    """Parse a whole reply at once (same rules as streaming)."""
    parser = ChatOutputParser(**options)
    return collect(parser.feed(text) + parser.finish())
