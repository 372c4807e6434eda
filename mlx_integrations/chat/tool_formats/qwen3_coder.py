"""Qwen3-Coder XML: ``<tool_call><function=name><parameter=p>value</parameter>...``.

A string argument is written as it is, any other value as JSON; mlx-lm's parser reads
the values back by the types the tool declares.
"""

from __future__ import annotations

from typing import Any

from mlx_integrations.chat.tool_formats.base import ToolFormat
from mlx_integrations.chat.tool_formats.xml_args import tagged_call_rules
from mlx_integrations.chat.tools import ToolSpec


def _value_text(value: Any) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class Qwen3CoderFormat(ToolFormat):
    """``<function=...>`` calls inside ``<tool_call>`` tags."""

    name = "qwen3_coder"
    aliases = ("qwen3coder", "qwen3_xml")
    start = "<tool_call>"
    end = "</tool_call>"

    @classmethod
    def recognise(cls, template: str, tokenizer: Any) -> ToolFormat | None:
        if "<tool_call>\\n<function=" in template or "<tool_call>\n<function=" in template:
            return cls()
        return None

    def parse(self, body: str, tools: list[dict[str, Any]] | None) -> Any:
        from mlx_lm.tool_parsers import qwen3_coder

        return qwen3_coder.parse_tool_call(body, tools)

    def call_rules(self, tokenizer: Any, tool: ToolSpec, rule: str) -> str:
        return tagged_call_rules(
            tokenizer,
            tool,
            rule,
            f"\n<function={tool.name}>\n",
            lambda name: (f"<parameter={name}>\n", "\n</parameter>\n"),
            "</function>\n",
        )

    def calls_grammar(self, tokenizer: Any, tools: Any, parallel: bool) -> str:
        return self._tagged_calls_grammar(tokenizer, tools, parallel)

    def write_calls(self, calls: Any) -> str:
        out = []
        for name, args in calls:
            params = "".join(
                f"<parameter={k}>\n{_value_text(v)}\n</parameter>\n" for k, v in args.items()
            )
            out.append(f"{self.start}\n<function={name}>\n{params}</function>\n{self.end}")
        return "\n".join(out)
