"""ChatMLX's replies as LangChain's standard content blocks (v1), exactly.

A reply carries its answer as ``content``, its thinking in
``additional_kwargs["reasoning_content"]`` and its calls in ``tool_calls`` /
``invalid_tool_calls``. The translator registered here for the provider ``"mlx"``
(``response_metadata["model_provider"]``) turns that into blocks, so
``message.content_blocks`` and ``output_version="v1"`` hold the reasoning, the text,
every call and every malformed call, not LangChain's best-effort guess (which leaves
malformed calls out). :class:`BlockIndexer` numbers the blocks of a stream.
"""

from __future__ import annotations

import json

from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.messages import content as types
from langchain_core.messages.block_translators import register_translator

PROVIDER = "mlx"

_CALLS = ("tool_call", "invalid_tool_call", "tool_call_chunk")


def _content_blocks(message: AIMessage) -> list[types.ContentBlock]:
    """The blocks of a message's own content: a string is one text block; a list is read
    as LangChain reads any message (v0 and OpenAI-style image blocks, say of a reply a
    caller edited, become standard ones). Calls come from ``tool_calls`` instead."""
    content = message.content
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks = super(AIMessage, message).content_blocks  # LangChain's own parsing
    return [b for b in blocks if b.get("type") not in _CALLS]


def _reasoning(message: AIMessage) -> list[types.ContentBlock]:
    reasoning = message.additional_kwargs.get("reasoning_content")
    return [{"type": "reasoning", "reasoning": reasoning}] if reasoning else []


def translate_content(message: AIMessage) -> list[types.ContentBlock]:
    """A whole reply's blocks: reasoning, text, calls, malformed calls (in that order,
    the order the model writes them in)."""
    blocks = _reasoning(message) + _content_blocks(message)
    blocks += [
        {"type": "tool_call", "id": c.get("id"), "name": c["name"], "args": c["args"]}
        for c in message.tool_calls
    ]
    blocks += [
        {
            "type": "invalid_tool_call",
            "id": c.get("id"),
            "name": c.get("name"),
            "args": _raw_args(c.get("args"), c.get("error")),
            "error": c.get("error"),
        }
        for c in message.invalid_tool_calls
    ]
    return blocks


def _raw_args(args: str | None, error: str | None) -> str | None:
    """The raw text of a malformed call. A streamed one travels as a JSON string (so
    that LangChain never reads a cut-off call as a valid one) and comes back without
    an error: unquote it."""
    if error is None and isinstance(args, str):
        try:
            inner = json.loads(args)
        except ValueError:
            return args
        return inner if isinstance(inner, str) else args
    return args


def translate_content_chunk(chunk: AIMessageChunk) -> list[types.ContentBlock]:
    """A stream chunk's blocks; a whole (summed) stream reads as a whole reply."""
    if chunk.chunk_position == "last":
        return translate_content(chunk)
    blocks = _reasoning(chunk) + _content_blocks(chunk)
    for call in chunk.tool_call_chunks:
        block: types.ToolCallChunk = {
            "type": "tool_call_chunk",
            "id": call.get("id"),
            "name": call.get("name"),
            "args": call.get("args"),
        }
        if (index := call.get("index")) is not None:
            block["index"] = index
        blocks.append(block)
    return blocks


register_translator(PROVIDER, translate_content, translate_content_chunk)


class BlockIndexer:
    """Positions of the blocks of one streamed reply: a block ends where the kind of
    output changes (thinking, text) and each call is a block of its own."""

    def __init__(self) -> None:
        self._kind: str | None = None
        self.count = 0
        """Blocks begun so far."""

    def index(self, kind: str) -> int:
        """The position of the block a piece of output of ``kind`` belongs to
        (``"reasoning"``, ``"text"``, or ``"call"``: a new block each time)."""
        if kind != self._kind or kind == "call":
            self._kind = kind
            self.count += 1
        return self.count - 1
