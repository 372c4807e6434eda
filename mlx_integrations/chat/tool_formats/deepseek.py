"""DeepSeek R1 / V3: calls between ``<｜tool▁calls▁begin｜>`` and ``<｜tool▁calls▁end｜>``.

Each call is ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>name`` and its arguments in a
fenced JSON block, then ``<｜tool▁call▁end｜>``; V3.1 writes ``name<｜tool▁sep｜>{...}``
without the type and the fence. Both are read; forced calls take the R1 layout.
"""

from __future__ import annotations

import json
import re
from typing import Any

from mlx_integrations.chat import lark
from mlx_integrations.chat.tool_formats.base import ToolFormat, written_call
from mlx_integrations.chat.tools import ToolSpec

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"

_CALL = re.compile(
    re.escape(CALL_BEGIN)
    + r"(?:(?P<type>\w+)"
    + re.escape(SEP)
    + r"(?P<name>[\w.-]+)\s*```(?:json)?\s*(?P<fenced>.*?)\s*```"
    + r"|(?P<bare_name>[\w.-]+)"
    + re.escape(SEP)
    + r"(?P<bare>.*?))\s*"
    + re.escape(CALL_END),
    re.DOTALL,
)


def parse_deepseek_calls(body: str, tools: Any = None) -> list[dict[str, Any]]:
    """The calls inside one ``<｜tool▁calls▁begin｜>...`` block."""
    calls = []
    pos = 0
    text = body.strip()
    while pos < len(text):
        match = _CALL.match(text, pos)
        if match is None:
            raise ValueError(f"expected {CALL_BEGIN}...{CALL_END} at {text[pos : pos + 40]!r}")
        name = match.group("name") or match.group("bare_name")
        raw = match.group("fenced") if match.group("name") else match.group("bare")
        arguments = json.loads(raw) if raw.strip() else {}
        if not isinstance(arguments, dict):
            raise ValueError(f"arguments of {name!r} must be a JSON object, got {raw!r:.80}")
        calls.append({"name": name, "arguments": arguments})
        pos = match.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    if not calls:
        raise ValueError("no tool call in the block")
    return calls


class DeepSeekFormat(ToolFormat):
    """DeepSeek's tool-call blocks, in the layout the model's template writes.

    Args:
        bare: V3.1's layout, ``name<｜tool▁sep｜>{...}``; else R1's typed and fenced one.
    """

    name = "deepseek"
    aliases = ("deepseek_r1", "deepseek_v3", "deepseekv3", "deepseek_v31")
    start = CALLS_BEGIN
    end = CALLS_END
    clues = (CALLS_BEGIN,)

    def __init__(self, bare: bool = False) -> None:
        self.bare = bare

    @classmethod
    def recognise(cls, template: str, tokenizer: Any) -> ToolFormat | None:
        if CALLS_BEGIN not in template:
            return None
        written = written_call(tokenizer, CALL_BEGIN)
        return cls(bare=written is not None and written.startswith("zq_probe_tool"))

    def parse(self, body: str, tools: list[dict[str, Any]] | None) -> Any:
        return parse_deepseek_calls(body, tools)

    def call_lark(self, tokenizer: Any, tool: ToolSpec) -> str:
        args = lark.json_value(tool.constrained_parameters)
        begin, sep, end = (lark.marker(tokenizer, m) for m in (CALL_BEGIN, SEP, CALL_END))
        if self.bare:
            return f"{begin} {lark.lit(tool.name)} {sep} {args} {end}"
        fence = lark.lit(f"{tool.name}\n```json\n")
        return (
            f"{begin} {lark.lit('function')} {sep} {fence} {args} {lark.lit(chr(10) + '```')} {end}"
        )

    def calls_grammar(self, tokenizer: Any, tools: Any, parallel: bool) -> str:
        alternatives, rules = self._alternatives(tokenizer, tools)
        # Templates indent between the calls and before the end: a little space is allowed.
        more = f"(/[ \\n]{{1,9}}/ ({alternatives}))*" if parallel else ""
        end = f"/[ \\n]{{0,8}}/ {lark.marker(tokenizer, CALLS_END)}"
        return f"calls: ({alternatives}) {more} {end}\n{rules}"

    def write_calls(self, calls: Any) -> str:
        body = "\n".join(
            f"{CALL_BEGIN}{name}{SEP}{json.dumps(args, ensure_ascii=False)}{CALL_END}"
            if self.bare
            else f"{CALL_BEGIN}function{SEP}{name}\n```json\n"
            f"{json.dumps(args, ensure_ascii=False)}\n```{CALL_END}"
            for name, args in calls
        )
        return f"{CALLS_BEGIN}{body}{CALLS_END}"
