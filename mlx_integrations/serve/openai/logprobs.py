"""Which generated tokens a reply's ``logprobs`` list: those of its answer text.

The engines give a log-probability for every token they generate (the chat core's
:class:`~mlx_integrations.chat.completion.Logprobs` events, one after the events of
each engine chunk). OpenAI's replies list the tokens of the answer: ``logprobs.content``
of a chat choice, the ``logprobs`` of a Responses ``output_text``. So the tokens inside
a thinking block and the markup of tool calls are left out, and so are the tokens that
end a reply without adding to its text (the end-of-sequence token, a stop sequence),
as OpenAI lists none of them: the listed tokens' bytes, joined, are the answer's.

A chunk's tokens go where the chunk's events went: with answer text, to the answer;
with reasoning only, or a tool call, nowhere. A chunk with no event yet (a marker, a
call being written, text the parser holds back) waits for the next chunk that has
one, and then goes with what came before it (a thinking block's end marker goes
with the thinking), unless that next chunk completes a tool call. An answer's token
is listed once the text it adds has arrived: the last tokens, whose text never does,
are left out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from mlx_integrations.chat.completion import (
    Finished,
    InvalidToolCall,
    Logprobs,
    ParsedToolCall,
    ReasoningDelta,
    TextDelta,
)
from mlx_integrations.serve.sse import closing

__all__ = ["AnswerLogprobs", "TextLogprobs", "with_answer_logprobs"]

Entry = dict[str, Any]
"""One token in OpenAI's ``logprobs.content`` shape (``token``, ``logprob``,
``bytes``, ``top_logprobs``)."""


class TextLogprobs:
    """Tokens listed once the text they add has arrived (raw completions, and the
    answer's tokens of a chat reply)."""

    def __init__(self) -> None:
        self.waiting: list[Entry] = []
        self._text = 0  # bytes of text seen
        self._listed = 0  # bytes of the tokens listed

    def text(self, text: str) -> None:
        """Text of the reply arrived."""
        self._text += len(text.encode("utf-8"))

    def release(self) -> list[Entry]:
        """The waiting tokens whose text has arrived, in order."""
        out: list[Entry] = []
        while self.waiting and self._listed < self._text:
            entry = self.waiting.pop(0)
            out.append(entry)
            self._listed += len(entry.get("bytes") or ())
        return out


class AnswerLogprobs:
    """Sorts a chat turn's tokens into its answer's and the others (see the module).

    Feed it every event of the turn with :meth:`event`; it returns, for a
    :class:`Logprobs` event, the tokens of the answer now known, and :meth:`finish`
    (after the turn's last parsed event) the last of them.
    """

    def __init__(self) -> None:
        self.answer = TextLogprobs()
        self._kinds: list[str] = []  # what the events since the last chunk's tokens were
        self._pending: list[Entry] = []  # tokens of chunks without an event
        self._before: str | None = None  # what the last chunk with an event held

    def event(self, event: Any) -> list[Entry]:
        """Take one event of the turn; the answer's tokens it makes known."""
        if isinstance(event, Logprobs):
            return self._chunk(event.content)
        if isinstance(event, (TextDelta, InvalidToolCall)):
            self._kinds.append("text")
            self.answer.text(event.text if isinstance(event, TextDelta) else event.raw)
        elif isinstance(event, ReasoningDelta):
            self._kinds.append("reasoning")
        elif isinstance(event, ParsedToolCall):
            self._kinds.append("call")
        return []

    def finish(self) -> list[Entry]:
        """The reply ended (its parser's last events were fed): the last answer tokens."""
        self._chunk([])
        return self.answer.release()

    def _chunk(self, entries: list[Entry]) -> list[Entry]:
        kinds, self._kinds = self._kinds, []
        if not kinds:
            self._pending += entries
            return []
        pending, self._pending = self._pending, []
        if "call" in kinds:
            self._before = "call"
            return self.answer.release()
        if "text" not in kinds:
            self._before = "reasoning"
            return []
        if (self._before or kinds[0]) == "text":
            self.answer.waiting += pending
        self.answer.waiting += entries
        self._before = "text"
        return self.answer.release()


async def with_answer_logprobs(
    events: AsyncIterator[Any], asked: bool
) -> AsyncIterator[tuple[Any, list[Entry] | None]]:
    """A turn's events, each with the answer's tokens it carries.

    With ``asked`` (a turn that yields :class:`Logprobs` events), the events of an
    engine chunk wait for its tokens, which come with its first event of text (as
    OpenAI's streams send them with the text they make), or else as ``(None, tokens)``
    after its events; the :class:`Logprobs` events themselves are left out. Without,
    each event comes at once, with None.
    """
    async with closing(events):
        if not asked:
            async for event in events:
                yield event, None
            return
        answer = AnswerLogprobs()
        held: list[Any] = []
        async for event in events:
            if isinstance(event, (Logprobs, Finished)):
                tokens = answer.event(event) if isinstance(event, Logprobs) else answer.finish()
                for item in _attach(held, tokens):
                    yield item
                held = []
                if isinstance(event, Finished):
                    yield event, []
            elif isinstance(event, (TextDelta, InvalidToolCall, ReasoningDelta, ParsedToolCall)):
                answer.event(event)
                held.append(event)
            else:
                yield event, []


def _attach(held: list[Any], tokens: list[Entry]) -> list[tuple[Any, list[Entry]]]:
    """The held events, the tokens with the first of them that is text."""
    out = []
    for event in held:
        text = isinstance(event, (TextDelta, InvalidToolCall))
        out.append((event, tokens if text else []))
        tokens = [] if text else tokens
    if tokens:
        out.append((None, tokens))
    return out
