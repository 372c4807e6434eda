"""Lark for argument values written as raw text between XML-like tags.

Qwen3-Coder (``<parameter=p>value</parameter>``) and GLM (``<arg_value>value</arg_value>``)
write a string argument as it is and any other value as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from mlx_integrations.chat import lark
from mlx_integrations.chat.tool_formats.base import ToolFormat
from mlx_integrations.chat.tools import ToolSpec


def resolve(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    """``schema`` with a local ``$ref`` (``#/$defs/X``) replaced by what it names."""
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return schema
    node: Any = defs
    for part in ref[2:].split("/"):
        node = node.get(part) if isinstance(node, Mapping) else None
    if not isinstance(node, Mapping):
        return schema
    rest = {k: v for k, v in schema.items() if k != "$ref"}
    return resolve({**node, **rest}, defs)


def is_text(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> bool:
    """Whether a value of this schema may be a string (then it is written as it is)."""
    schema = resolve(schema, defs)
    kinds = schema.get("type")
    if kinds == "string" or (isinstance(kinds, list) and "string" in kinds):
        return True
    if isinstance(schema.get("const"), str):
        return True
    enum = schema.get("enum")
    if isinstance(enum, list) and any(isinstance(v, str) for v in enum):
        return True
    options = [*(schema.get("anyOf") or []), *(schema.get("oneOf") or [])]
    return any(isinstance(o, Mapping) and is_text(o, defs) for o in options)


def value_rule(
    tokenizer: Any, rule: str, schema: Mapping[str, Any], defs: Mapping[str, Any], close: str
) -> str:
    """A Lark rule ``rule``: one value followed by its closing tag ``close``.

    A value that may be a string is written as it is: one of an ``enum`` of strings, or
    free text up to the first ``close`` within the schema's length bounds (a pattern or
    format is not enforced on raw text). Anything else is JSON.
    """
    end = lark.marker(tokenizer, close)
    schema = resolve(schema, defs)
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        return f"{rule}: ({' | '.join(lark.lit(v) for v in enum)}) {end}"
    if isinstance(schema.get("const"), str):
        return f"{rule}: {lark.lit(schema['const'])} {end}"
    if is_text(schema, defs):
        low = int(schema.get("minLength", 0))
        high = schema.get("maxLength")
        bounds = f"{{{low},{int(high)}}}" if high is not None else f"{{{low},}}"
        if isinstance(lark.marker_pieces(tokenizer, close)[0], int):
            # A special token closes it: text can never contain one.
            return f"{rule}: /(?s:.{bounds})/ {end}"
        # Lazy: the value ends at the first closing tag, as the parser reads it.
        return f"{rule}[lazy]: /(?s:.{bounds})/ {end}"
    return f"{rule}: {lark.json_value(schema, defs)} {end}"


def tagged_call_rules(
    tokenizer: Any,
    tool: ToolSpec,
    rule: str,
    head: str,
    argument: Callable[[str], tuple[str, str]],
    tail: str,
) -> str:
    """Rules for one call ``head (arguments) tail`` with tag-wrapped values.

    Args:
        tool: The tool.
        rule: Name of the rule to define.
        head: The literal text that opens the call (the name included).
        argument: ``argument(name) -> (opening, closing)`` literal texts around a value.
        tail: The literal text that closes the call.
    """
    parameters = tool.constrained_parameters
    defs = lark.schema_defs(parameters)
    props = parameters.get("properties") or {}
    helpers = []
    names = {}
    for i, (name, schema) in enumerate(props.items()):
        opening, closing = argument(name)
        names[name] = f"{rule}_a{i}"
        helpers.append(value_rule(tokenizer, f"{rule}_v{i}", schema, defs, closing))
        helpers.append(f"{rule}_a{i}: {lark.marker(tokenizer, opening)} {rule}_v{i}")
    args = lark.keyword_arguments(props, tool.required, lambda name, _: names[name], "")
    line = f"{rule}: {lark.marker(tokenizer, head)} {args} {lark.marker(tokenizer, tail)}"
    return "\n".join([line, *helpers])


def value_text(value: Any) -> str:
    """A value as tag-wrapped families write it: strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class TaggedArgsFormat(ToolFormat):
    """A family whose calls sit between ``start`` and ``end``, each argument in tags.

    Subclasses give :meth:`head` (what opens a call, its name included), :meth:`tags`
    (the texts around one argument's value) and :attr:`tail` (what closes a call).
    """

    tail = ""
    balanced: tuple[tuple[str, str], ...] = ()
    """Opening and closing tags that a whole call holds as many of each."""

    def parse(self, body: str, tools: list[dict[str, Any]] | None) -> Any:
        for opening, closing in self.balanced:
            if body.count(opening) != body.count(closing):
                raise ValueError(f"the call was cut: {opening!r} without {closing!r}")
        return self.parse_whole(body, tools)

    def parse_whole(self, body: str, tools: list[dict[str, Any]] | None) -> Any:
        """Parse a call whose tags are all closed."""
        raise NotImplementedError

    def head(self, name: str) -> str:
        raise NotImplementedError

    def tags(self, name: str) -> tuple[str, str]:
        raise NotImplementedError

    def call_rules(self, tokenizer: Any, tool: ToolSpec, rule: str) -> str:
        return tagged_call_rules(tokenizer, tool, rule, self.head(tool.name), self.tags, self.tail)

    def calls_grammar(self, tokenizer: Any, tools: Any, parallel: bool) -> str:
        # One call and the end marker, then more after a newline and the start marker.
        alternatives, rules = self._alternatives(tokenizer, tools)
        opening = lark.marker(tokenizer, self.start)
        end = lark.marker(tokenizer, self.end)
        more = f'("\\n" {opening} ({alternatives}) {end})*' if parallel else ""
        return f"calls: ({alternatives}) {end} {more}\n{rules}"

    def write_calls(self, calls: Any) -> str:
        out = []
        for name, args in calls:
            values = "".join(
                f"{self.tags(k)[0]}{value_text(v)}{self.tags(k)[1]}" for k, v in args.items()
            )
            out.append(f"{self.start}{self.head(name)}{values}{self.tail}{self.end}")
        return "\n".join(out)
