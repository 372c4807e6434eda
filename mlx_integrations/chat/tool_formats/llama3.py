"""Llama 3.x JSON: ``{"name": ..., "parameters": {...}}``, bare or after ``<|python_tag|>``.

Llama 3.1/3.2 JSON templates ask for a bare object with ``parameters``;
``<|python_tag|>`` opens calls of built-in tools, and models also write it before
their own calls, so both are read. Forced calls are written the way the template asks.
"""

from __future__ import annotations

from typing import Any

from mlx_integrations.chat.tool_formats.base import (
    ToolFormat,
    json_call,
    json_call_lark,
    parse_json_calls,
)
from mlx_integrations.chat.tools import ToolSpec


class Llama3JsonFormat(ToolFormat):
    """Bare JSON calls with ``parameters`` (``<|python_tag|>`` read as well)."""

    name = "llama3_json"
    aliases = ("llama", "llama3", "llama3.1", "llama3.2_json")
    start = "<|python_tag|>"
    bare_prefixes = ('{"name"', '{"type"', '{ "name"')

    @classmethod
    def recognise(cls, template: str, tokenizer: Any) -> ToolFormat | None:
        if "<|python_tag|>" in template or '"parameters": dictionary of argument' in template:
            return cls()
        return None

    def parse(self, body: str, tools: list[dict[str, Any]] | None) -> Any:
        return parse_json_calls(body, tools)

    @property
    def forced_start(self) -> str:
        return ""

    def call_lark(self, tokenizer: Any, tool: ToolSpec) -> str:
        return json_call_lark(tool, key="parameters")

    def calls_grammar(self, tokenizer: Any, tools: Any, parallel: bool) -> str:
        alternatives, rules = self._alternatives(tokenizer, tools)
        more = f'("; " ({alternatives}))*' if parallel else ""
        return f"calls: ({alternatives}) {more}\n{rules}"

    def write_calls(self, calls: Any) -> str:
        return "; ".join(json_call(n, a, key="parameters") for n, a in calls)
