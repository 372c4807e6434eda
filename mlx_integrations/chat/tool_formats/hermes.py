"""Hermes / Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Hermes 2 Pro, Qwen2.5 and Qwen3 write one JSON object between the tags per call. It is
also the layout tools are described in for templates that cannot render tools, and the
family chosen when nothing else matches.
"""

from __future__ import annotations

from typing import Any

from mlx_integrations.chat.tool_formats.base import (
    ToolFormat,
    json_call_lark,
    parse_json_calls,
)
from mlx_integrations.chat.tools import ToolSpec


class HermesFormat(ToolFormat):
    """``<tool_call>`` JSON calls; markers may be set from the tokenizer (mlx-lm)."""

    name = "hermes"
    aliases = ("json_tools", "qwen", "qwen2_5", "qwen3")
    start = "<tool_call>"
    end = "</tool_call>"

    def __init__(self, start: str | None = None, end: str | None = None) -> None:
        if start:
            self.start = start
        if end is not None and start:
            self.end = end

    @classmethod
    def recognise(cls, template: str, tokenizer: Any) -> ToolFormat | None:
        return cls() if "<tool_call>" in template else None

    def parse(self, body: str, tools: list[dict[str, Any]] | None) -> Any:
        return parse_json_calls(body, tools)

    def call_lark(self, tokenizer: Any, tool: ToolSpec) -> str:
        return json_call_lark(tool)
