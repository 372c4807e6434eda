"""A chat-core field path, as the field is named in the request of each API.

The chat core names a bad field by its path in OpenAI's chat-completions spelling
(``tools[2].function.parameters``, ``messages[3].content``, ``max_tokens``). An
endpoint's translator knows where each of its fields went, so it keeps a
:class:`WirePaths`: the renamed fields (``max_tokens`` is ``max_output_tokens`` in
the Responses API) and where each chat-core message and tool came from in its
request (an Anthropic ``system`` becomes messages[0]; a ``tool_result`` block becomes
a message of its own).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["WirePaths"]

_HEAD = re.compile(r"^(messages|tools)\[(\d+)\]")
_CALL = re.compile(r"^\.tool_calls\[(\d+)\]")


@dataclass
class WirePaths:
    """How the chat core's paths read in one request.

    Attributes:
        fields: Chat-core field (or path prefix) to the request's, the longest
            prefix winning (``response_format.json_schema`` -> ``text.format``).
        messages: For each chat-core message, the path of what it was made from;
            None when messages map one to one.
        tools: For each chat-core tool, the path of the request's tool; None when
            they map one to one.
        tool_fields: Inside a tool, chat-core path to the request's
            (``function.parameters`` -> ``input_schema``).
        calls: For a chat-core message whose tool calls were items or blocks of
            their own, the path of each call (``input[3]``, ``messages[1].content[2]``).
        call_fields: Inside such a call, chat-core path to the request's
            (``function.name`` -> ``name``).
    """

    fields: dict[str, str] = field(default_factory=dict)
    messages: list[str] | None = None
    tools: list[str] | None = None
    tool_fields: dict[str, str] = field(default_factory=dict)
    calls: dict[int, list[str]] = field(default_factory=dict)
    call_fields: dict[str, str] = field(default_factory=dict)

    def __call__(self, path: str) -> str:
        """The request's path of the field at chat-core ``path``."""
        head = _HEAD.match(path)
        if head is not None:
            kind, index = head.group(1), int(head.group(2))
            rest = path[head.end() :]
            table = self.messages if kind == "messages" else self.tools
            base = f"{kind}[{index}]"
            if table is not None and index < len(table):
                base = table[index]
            call = _CALL.match(rest) if kind == "messages" else None
            calls = self.calls.get(index, [])
            if call is not None and int(call.group(1)) < len(calls):
                base = calls[int(call.group(1))]
                rest = _nested(rest[call.end() :], self.call_fields)
            elif kind == "tools":
                rest = _nested(rest, self.tool_fields)
            return base + rest
        return _renamed(path, self.fields)


def _nested(rest: str, table: dict[str, str]) -> str:
    """``rest`` (``.function.name``) renamed by ``table``, still a path's tail."""
    renamed = _renamed(rest.removeprefix("."), table)
    return f".{renamed}" if renamed and not renamed.startswith("[") else renamed


def _renamed(path: str, table: dict[str, str]) -> str:
    for old in sorted(table, key=len, reverse=True):
        if path == old or (path.startswith(old) and path[len(old)] in ".["):
            new = table[old]
            rest = path[len(old) :]
            return (new + rest) if new else rest.removeprefix(".")
    return path
