"""Any other family mlx-lm knows, through its ``mlx_lm.tool_parsers.<module>``.

mlx-lm's parser modules give the markers (``tool_call_start``/``tool_call_end``) and a
``parse_tool_call``; the families without a module of their own here (Kimi K2, MiniMax
M2, Gemma 4, FunctionGemma, LongCat, MiniCPM...) are used through them. Their call
bodies have no grammar here: a forced call holds the model to the family's markers
and the parser checks what it writes between them.
"""

from __future__ import annotations

import importlib
from typing import Any

from mlx_integrations.chat import lark
from mlx_integrations.chat.tool_formats.base import ToolFormat


class MlxLmFormat(ToolFormat):
    """A family read by one of mlx-lm's tool-parser modules."""

    def __init__(self, module: str) -> None:
        mod = importlib.import_module(f"mlx_lm.tool_parsers.{module}")
        self.name = module
        self.start = mod.tool_call_start
        self.end = mod.tool_call_end or ""
        self._parse = mod.parse_tool_call

    @staticmethod
    def exists(module: str) -> bool:
        """Whether mlx-lm has a tool-parser module of this name."""
        if not module.isidentifier():
            return False
        try:
            importlib.import_module(f"mlx_lm.tool_parsers.{module}")
        except ImportError:
            return False
        return True

    def parse(self, body: str, tools: list[dict[str, Any]] | None) -> Any:
        return self._parse(body, tools)

    def calls_grammar(self, tokenizer: Any, tools: Any, parallel: bool) -> str:
        opening = lark.marker(tokenizer, self.start)
        if not self.end:
            return r"calls: /(?s:.+)/"
        end = lark.marker(tokenizer, self.end)
        # The body is the model's own; it ends at the first end marker.
        more = f"(/\\s*/ {opening} body)*" if parallel else ""
        close = self.end if isinstance(lark.marker_pieces(tokenizer, self.end)[0], str) else ""
        body = f"body[lazy]: /(?s:.+)/ {lark.lit(close)}" if close else f"body: /(?s:.+)/ {end}"
        return f"calls: body {more}\n{body}"
