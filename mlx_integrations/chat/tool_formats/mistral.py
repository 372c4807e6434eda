"""Mistral: ``[TOOL_CALLS]`` and then the call, in the layout the model's template writes.

Three layouts exist: a JSON list (``[{"name": ..., "arguments": {...}}]``, v0.3),
``name[ARGS]{...}`` and ``name[CALL_ID]id[ARGS]{...}`` (newer tokenizers). The layout
is found once by rendering a call through the template; all three are read back.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from mlx_integrations.chat import lark
from mlx_integrations.chat.tool_formats.base import ToolFormat, json_call_lark, written_call
from mlx_integrations.chat.tools import ToolSpec

MistralLayout = Literal["list", "header", "header_id"]

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"

# ``name[ARGS]`` or ``name[CALL_ID]id[ARGS]`` before one call's JSON arguments.
_HEADER = re.compile(r"[\s,;]*([\w.-]+)\s*(?:\[CALL_ID\]\s*[\w-]*\s*)?\[ARGS\]\s*")


def _prefixes(literal: str) -> str:
    """A regex matching any prefix of ``literal`` (the empty one included)."""
    return "".join(f"(?:{re.escape(c)}" for c in literal) + ")?" * len(literal)


def parse_mistral_calls(body: str, tools: Any = None) -> Any:
    """Mistral calls: a JSON list, ``name[ARGS]{...}``, or ``name[CALL_ID]id[ARGS]{...}``.

    Calls with an id are read one after the other from the start (the arguments as one
    JSON value each), so ``[CALL_ID]`` inside an argument string is left alone. The
    model's own ids are dropped: every call gets a fresh id, as in all formats.
    """
    if CALL_ID not in body or body.lstrip().startswith(("[", "{")):
        from mlx_lm.tool_parsers import mistral

        return mistral.parse_tool_call(body, tools)
    decoder = json.JSONDecoder()
    text = body.rstrip()
    calls, pos = [], 0
    while pos < len(text):
        header = _HEADER.match(text, pos)
        if header is None:
            raise ValueError(f"Could not parse tool call from: {body}")
        arguments, pos = decoder.raw_decode(text, header.end())
        if not isinstance(arguments, dict):
            raise ValueError(f"Tool call arguments must be a JSON object: {body}")
        calls.append({"name": header.group(1), "arguments": arguments})
    return calls[0] if len(calls) == 1 else calls


def call_layout(tokenizer: Any) -> MistralLayout | None:
    """How a Mistral template writes a tool call after ``[TOOL_CALLS]``.

    Returns:
        ``"list"``, ``"header"`` or ``"header_id"``; None when the template writes no
        ``[TOOL_CALLS]`` call.
    """
    after = written_call(tokenizer, TOOL_CALLS)
    if after is None:
        return None
    if after.startswith("["):
        return "list"
    if after.startswith("zq_probe_tool"):
        return "header_id" if CALL_ID in after.split(ARGS, 1)[0] else "header"
    return None


class MistralFormat(ToolFormat):
    """``[TOOL_CALLS]`` calls in one of Mistral's three layouts."""

    name = "mistral"
    start = TOOL_CALLS
    next_call = re.compile(r"[\[{]|[\w.-]+\s*\[(?:CALL_ID|ARGS)\]")
    maybe_next_call = re.compile(
        rf"[\w.-]*\s*(?:{_prefixes(ARGS)}|{_prefixes(CALL_ID)}"
        rf"|\[CALL_ID\]\s*[\w-]*\s*{_prefixes(ARGS)})"
    )

    def __init__(self, layout: MistralLayout = "list") -> None:
        self.layout: MistralLayout = layout

    @classmethod
    def recognise(cls, template: str, tokenizer: Any) -> ToolFormat | None:
        if TOOL_CALLS not in template:
            return None
        return cls(call_layout(tokenizer) or "list")

    def parse(self, body: str, tools: list[dict[str, Any]] | None) -> Any:
        return parse_mistral_calls(body, tools)

    def call_lark(self, tokenizer: Any, tool: ToolSpec) -> str:
        if self.layout == "list":
            return json_call_lark(tool)
        # The arguments are the whole JSON value here: their own schema, local refs included.
        args = lark.json_value(tool.constrained_parameters)
        call_id = ""
        if self.layout == "header_id":
            call_id = f"{lark.marker(tokenizer, CALL_ID)} /[A-Za-z0-9]{{9}}/ "
        return f"{lark.lit(tool.name)} {call_id}{lark.marker(tokenizer, ARGS)} {args}"

    def calls_grammar(self, tokenizer: Any, tools: Any, parallel: bool) -> str:
        if self.layout != "list":
            return super().calls_grammar(tokenizer, tools, parallel)
        alternatives, rules = self._alternatives(tokenizer, tools)
        items = f'(", " ({alternatives}))*' if parallel else ""
        return f'calls: " "? "[" ({alternatives}) {items} "]"\n{rules}'

    def write_calls(self, calls: Any) -> str:
        if self.layout == "list":
            body = json.dumps([{"name": n, "arguments": a} for n, a in calls], ensure_ascii=False)
            return f"{TOOL_CALLS}{body}"
        parts = []
        for i, (name, args) in enumerate(calls):
            call_id = f"{CALL_ID}call{i:05d}" if self.layout == "header_id" else ""
            parts.append(f"{TOOL_CALLS}{name}{call_id}{ARGS}{json.dumps(args, ensure_ascii=False)}")
        return "".join(parts)
