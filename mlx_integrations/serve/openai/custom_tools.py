"""Custom (freeform) tools of the Responses API, served as function tools.

A custom tool takes one string, its input: free text, or text of a grammar
(``format: {"type": "grammar", "syntax": "lark" | "regex", "definition": ...}``; Codex
sends its ``apply_patch`` tool that way). Chat templates and the tool-call families
know function tools, so each custom tool is offered as a function of one string
argument, ``input``, and its description says so. A regular expression becomes that
string's ``pattern``: the constrained decoding holds it as it holds any JSON schema. So
does a Lark grammar that describes a regular language (:mod:`.lark_regex`; Codex's
``apply_patch`` does); another one is shown to the model in the description only (the
family writes the call as JSON, and the chat core cannot hold a Lark grammar inside a
JSON string). The model's call comes back as a ``custom_tool_call`` item with its
``input``.
"""

from __future__ import annotations

import json
from typing import Any

from mlx_integrations.chat.completion import ParsedToolCall
from mlx_integrations.serve.openai.lark_regex import lark_to_regex
from mlx_integrations.serve.protocol import responses as wire

__all__ = ["INPUT", "as_function", "call_arguments", "input_of"]

INPUT = "input"
"""The one argument of a custom tool offered as a function."""


def as_function(tool: wire.CustomTool) -> dict[str, Any]:
    """The custom tool as a function tool of one string argument, ``input``."""
    text: dict[str, Any] = {"type": "string"}
    notes = [f"Call it with one argument, `{INPUT}`: the whole input, as one string."]
    grammar = tool.format if isinstance(tool.format, wire.GrammarToolFormat) else None
    if grammar is not None and grammar.syntax == "regex":
        text["pattern"] = f"^(?:{grammar.definition})$"
        notes.append(f"The input matches this regular expression: {grammar.definition}")
    elif grammar is not None:
        regular = lark_to_regex(grammar.definition)
        if regular is not None:
            text["pattern"] = f"^(?:{regular})$"
        notes.append(f"The input follows this Lark grammar:\n{grammar.definition}")
    description = "\n\n".join([tool.description or "", *notes]).strip()
    parameters = {"type": "object", "properties": {INPUT: text}, "required": [INPUT]}
    return {
        "type": "function",
        "function": {"name": tool.name, "description": description, "parameters": parameters},
    }


def call_arguments(text: str) -> str:
    """An earlier call's input as the arguments of the function the model sees."""
    return json.dumps({INPUT: text}, ensure_ascii=False)


def input_of(call: ParsedToolCall) -> str:
    """The input of a custom tool's call (its one argument)."""
    value = call.arguments.get(INPUT, "") if isinstance(call.arguments, dict) else ""
    return value if isinstance(value, str) else str(value)
