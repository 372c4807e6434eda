"""A chat turn as LangChain's content-block protocol events (``stream_events(version="v3")``).

ChatMLX emits them itself rather than through LangChain's bridge from stream chunks:
the chat core knows where each block ends, so a thinking block finishes as soon as
the answer begins, text written after a call is a block of its own (the bridge
merges all the text of a reply into one block), and a malformed call arrives as an
``invalid_tool_call`` block (the bridge would finish it as a call with string
arguments).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from mlx_integrations.chat.completion import (
    Finished,
    InvalidToolCall,
    ParsedToolCall,
    ReasoningDelta,
    TextDelta,
)

if TYPE_CHECKING:
    from langchain_protocol.protocol import MessagesData


class ProtocolEvents:
    """Turns the chat core's events of one reply into protocol events.

    Args:
        provider: ``metadata.provider`` of ``message-start``.
        model: ``metadata.model`` of ``message-start`` (the name as given).
        finish: Usage and response metadata of the reply's :class:`Finished` event,
            as ``(usage, metadata)``.
    """

    def __init__(
        self,
        provider: str,
        model: str | None,
        finish: Callable[[Finished], tuple[dict[str, Any], dict[str, Any]]],
    ) -> None:
        self._metadata = {"provider": provider, **({"model": model} if model else {})}
        self._finish = finish
        self._started = False
        self._open: tuple[int, str] | None = None  # (index, "text" or "reasoning")
        self._accumulated = ""
        self._next = 0

    def feed(self, event: Any) -> list[MessagesData]:
        """The protocol events that one chat-core event makes."""
        out: list[dict[str, Any]] = []
        if not self._started:
            self._started = True
            out.append(
                {"event": "message-start", "role": "ai", "id": "", "metadata": self._metadata}
            )
        if isinstance(event, (TextDelta, ReasoningDelta)):
            # A text block holds "text", a reasoning block "reasoning".
            kind = "text" if isinstance(event, TextDelta) else "reasoning"
            if self._open is None or self._open[1] != kind:
                out += self._close()
                self._open = (self._begin(out, {"type": kind, kind: ""}), kind)
            self._accumulated += event.text
            delta = {"type": f"{kind}-delta", kind: event.text}
            out.append({"event": "content-block-delta", "index": self._open[0], "delta": delta})
        elif isinstance(event, ParsedToolCall):
            out += self._close()
            args = json.dumps(event.arguments, ensure_ascii=False)
            start = {"type": "tool_call_chunk", "id": event.id, "name": event.name, "args": ""}
            index = self._begin(out, start)
            delta = {"type": "tool-call-delta", "args": args}
            out.append({"event": "content-block-delta", "index": index, "delta": delta})
            call = {
                "type": "tool_call",
                "id": event.id,
                "name": event.name,
                "args": event.arguments,
            }
            out.append({"event": "content-block-finish", "index": index, "content": call})
        elif isinstance(event, InvalidToolCall):
            out += self._close()
            invalid = {"type": "invalid_tool_call", "id": event.id, "name": event.name}
            index = self._begin(out, {**invalid, "args": None, "error": None})
            whole = {**invalid, "args": event.raw, "error": event.error}
            out.append({"event": "content-block-finish", "index": index, "content": whole})
        else:
            assert isinstance(event, Finished)
            out += self._close()
            usage, metadata = self._finish(event)
            out.append({"event": "message-finish", "usage": usage, "metadata": metadata})
        return cast("list[MessagesData]", out)

    def _begin(self, out: list[dict[str, Any]], skeleton: dict[str, Any]) -> int:
        index, self._next = self._next, self._next + 1
        out.append({"event": "content-block-start", "index": index, "content": skeleton})
        return index

    def _close(self) -> list[dict[str, Any]]:
        """The finish of the open text or thinking block, if one is open."""
        if self._open is None:
            return []
        (index, kind), self._open = self._open, None
        text, self._accumulated = self._accumulated, ""
        block = {"type": kind, kind: text}
        return [{"event": "content-block-finish", "index": index, "content": block}]
