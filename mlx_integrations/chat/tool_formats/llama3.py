"""Llama 3.x JSON: ``{"name": ..., "parameters": {...}}``, bare or after ``<|python_tag|>``.

Llama 3.1/3.2 JSON templates ask for a bare object with ``parameters``;
``<|python_tag|>`` opens calls of built-in tools, and models also write it before
their own calls, so both are read. Forced calls are written the way the template asks.
"""

from __future__ import annotations

from typing import Any

from mlx_integrations.chat.tool_formats.base import JsonBodyFormat, json_call


class Llama3JsonFormat(JsonBodyFormat):
    """Bare JSON calls with ``parameters`` (``<|python_tag|>`` read as well)."""

    name = "llama3_json"
    aliases = ("llama", "llama3", "llama3.1", "llama3.2_json")
    clues = ("<|python_tag|>", '"parameters": dictionary of argument')
    start = "<|python_tag|>"
    bare_prefixes = ('{"name"', '{"type"', '{ "name"')
    arguments_key = "parameters"

    @property
    def forced_start(self) -> str:
        return ""

    def calls_grammar(self, tokenizer: Any, tools: Any, parallel: bool) -> str:
        alternatives, rules = self._alternatives(tokenizer, tools)
        more = f'("; " ({alternatives}))*' if parallel else ""
        return f"calls: ({alternatives}) {more}\n{rules}"

    def write_calls(self, calls: Any) -> str:
        return "; ".join(json_call(n, a, key="parameters") for n, a in calls)
