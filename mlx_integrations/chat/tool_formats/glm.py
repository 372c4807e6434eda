"""GLM 4.5 / 4.6 / 4.7: ``<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>``.

Each argument is a key tag and a value tag; a string value is written as it is, any
other as JSON. mlx-lm's ``glm47`` parser reads the arguments back.
"""

from __future__ import annotations

import re
from typing import Any

from mlx_integrations.chat.tool_formats.xml_args import TaggedArgsFormat

_BARE_NAME = re.compile(r"\s*([A-Za-z_][\w.-]*)\s*")


class GlmFormat(TaggedArgsFormat):
    """GLM's key/value tagged calls inside ``<tool_call>`` tags."""

    name = "glm"
    aliases = ("glm47", "glm45", "glm4", "glm4_moe")
    start = "<tool_call>"
    end = "</tool_call>"
    balanced = (("<arg_key>", "</arg_key>"), ("<arg_value>", "</arg_value>"))
    clues = ("<arg_key>",)

    def parse_whole(self, body: str, tools: list[dict[str, Any]] | None) -> Any:
        if "<arg_key>" not in body:
            # A call without arguments is its name alone; mlx-lm would call it "unknown".
            bare = _BARE_NAME.fullmatch(body)
            if bare is None:
                raise ValueError(f"expected a function name, got {body!r:.80}")
            return {"name": bare.group(1), "arguments": {}}
        from mlx_lm.tool_parsers import glm47

        return glm47.parse_tool_call(body, tools)

    def head(self, name: str) -> str:
        return f"{name}\n"

    def tags(self, name: str) -> tuple[str, str]:
        return f"<arg_key>{name}</arg_key>\n<arg_value>", "</arg_value>\n"
