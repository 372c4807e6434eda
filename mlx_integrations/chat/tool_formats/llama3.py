"""Llama 3.x JSON: ``{"name": ..., "parameters": {...}}``, bare or after ``<|python_tag|>``.

Llama 3.1/3.2 JSON templates ask for a bare object with ``parameters``;
``<|python_tag|>`` opens calls of built-in tools, and models also write it before
their own calls, so both are read. Forced calls are written the way the template asks.
"""

from __future__ import annotations

from typing import Any

from mlx_integrations.chat.tool_formats.base import (
    JsonBodyFormat,
    call_from_json,
    json_call,
    json_objects,
)


class Llama3JsonFormat(JsonBodyFormat):
    """Bare JSON calls with ``parameters`` (``<|python_tag|>`` read as well)."""

    name = "llama3_json"
    aliases = ("llama", "llama3", "llama3.1", "llama3.2_json")
    clues = ("<|python_tag|>", '"parameters": dictionary of argument')
    start = "<|python_tag|>"
    bare_prefixes = ('{"name"', '{"type"', '{ "name"')
    arguments_key = "parameters"

    def parse(self, body: str, tools: list[dict[str, Any]] | None) -> Any:
        objects = json_objects(body)
        if _no_calls(objects, tools):
            raise ValueError("this JSON is no call: it has no 'parameters' or names no bound tool")
        return [call_from_json(o) for o in objects]

    def is_answer(self, body: str, tools: list[dict[str, Any]] | None) -> bool:
        """Whole JSON that is no call: without ``parameters``, or naming no bound tool.

        ``{"name": "Paris", "population": 2100000}`` is the model's answer.
        """
        try:
            objects = json_objects(body)
        except ValueError:
            return False  # cut or broken: an invalid call, not an answer
        return _no_calls(objects, tools)

    @property
    def forced_start(self) -> str:
        return ""

    def calls_grammar(self, tokenizer: Any, tools: Any, parallel: bool) -> str:
        alternatives, rules = self._alternatives(tokenizer, tools)
        more = f'("; " ({alternatives}))*' if parallel else ""
        return f"calls: ({alternatives}) {more}\n{rules}"

    def write_calls(self, calls: Any) -> str:
        return "; ".join(json_call(n, a, key="parameters") for n, a in calls)


def _no_calls(objects: list[Any], tools: list[dict[str, Any]] | None) -> bool:
    """Decoded JSON values that are no calls: one lacks arguments or names no bound tool."""
    keys = ("parameters", "arguments", "function")
    if not all(isinstance(o, dict) and any(k in o for k in keys) for o in objects):
        return True
    names = {t["function"]["name"] for t in tools or [] if isinstance(t.get("function"), dict)}
    return bool(names) and any(
        isinstance(o.get("name"), str) and o["name"] not in names for o in objects
    )
