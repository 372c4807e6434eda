"""Qwen3-Coder XML: ``<tool_call><function=name><parameter=p>value</parameter>...``.

A string argument is written as it is, any other value as JSON; mlx-lm's parser reads
the values back by the types the tool declares.
"""

from __future__ import annotations

from typing import Any

from mlx_integrations.chat.tool_formats.xml_args import TaggedArgsFormat


class Qwen3CoderFormat(TaggedArgsFormat):
    """``<function=...>`` calls inside ``<tool_call>`` tags."""

    name = "qwen3_coder"
    aliases = ("qwen3coder", "qwen3_xml")
    start = "<tool_call>"
    end = "</tool_call>"
    balanced = (("<function=", "</function>"), ("<parameter=", "</parameter>"))
    tail = "</function>\n"
    clues = ("<tool_call>\\n<function=", "<tool_call>\n<function=")

    def parse_whole(self, body: str, tools: list[dict[str, Any]] | None) -> Any:
        from mlx_lm.tool_parsers import qwen3_coder

        return qwen3_coder.parse_tool_call(body, tools)

    def head(self, name: str) -> str:
        return f"\n<function={name}>\n"

    def tags(self, name: str) -> tuple[str, str]:
        return f"<parameter={name}>\n", "\n</parameter>\n"
