"""Hermes / Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Hermes 2 Pro, Qwen2.5 and Qwen3 write one JSON object between the tags per call. It is
also the layout tools are described in for templates that cannot render tools, and the
family chosen when nothing else matches.
"""

from __future__ import annotations

from mlx_integrations.chat.tool_formats.base import JsonBodyFormat


class HermesFormat(JsonBodyFormat):
    """``<tool_call>`` JSON calls; markers may be set from the tokenizer (mlx-lm)."""

    name = "hermes"
    aliases = ("json_tools", "qwen", "qwen2_5", "qwen3")
    clues = ("<tool_call>",)
    start = "<tool_call>"
    end = "</tool_call>"

    def __init__(self, start: str | None = None, end: str | None = None) -> None:
        if start:
            self.start = start
            self.end = end or ""
