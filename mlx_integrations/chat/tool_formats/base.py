"""The protocol every tool-call family implements, and what the families share.

A family is one object: how it is recognised (:meth:`ToolFormat.recognise`), its
markers, how the text of a call becomes calls (:meth:`ToolFormat.parse`), the grammar
that forces calls in its own layout (:meth:`ToolFormat.calls_grammar`), and how calls
are written into a prompt whose template cannot take them (:meth:`ToolFormat.write_calls`).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mlx_integrations.chat import lark
from mlx_integrations.chat.tools import ToolSpec


@dataclass
class ParsedToolCall:
    """A complete tool call: ``arguments`` is always a dict."""

    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: new_call_id())


@dataclass
class InvalidToolCall:
    """A call the model opened but wrote wrongly; kept with its raw text and the error."""

    raw: str
    error: str
    name: str | None = None
    id: str = field(default_factory=lambda: new_call_id())


def new_call_id() -> str:
    """A unique call id in the OpenAI style."""
    return f"call_{uuid.uuid4().hex[:24]}"


# After a call without end marker: a JSON object or list starts the next one.
_JSON_START = re.compile(r"[\[{]")


class ToolFormat:
    """One tool-call family.

    Attributes:
        name: Registry name (``hermes``, ``mistral``, ``pythonic``...).
        aliases: Other names that pick it (mlx-lm's parser module names among them).
        start: Marker that opens a call (or a list of calls); ``""`` for none.
        end: Marker that closes it; ``""`` when the call runs to the end of the turn.
        clues: Texts whose presence in a chat template marks the family.
        bare_prefixes: How a reply may begin with a call that has no start marker.
        next_call: After a call without end marker, what starts another call.
        maybe_next_call: What may still grow into ``next_call`` (held back meanwhile).
    """

    name: str = ""
    aliases: tuple[str, ...] = ()
    start: str = ""
    end: str = ""
    clues: tuple[str, ...] = ()
    bare_prefixes: tuple[str, ...] = ()
    next_call: re.Pattern[str] = _JSON_START
    maybe_next_call: re.Pattern[str] | None = None

    @classmethod
    def recognise(cls, template: str, tokenizer: Any) -> ToolFormat | None:
        """This family, set up for the model, when its chat template is of the family."""
        return cls() if any(clue in template for clue in cls.clues) else None

    def parse(self, body: str, tools: list[dict[str, Any]] | None) -> Any:
        """Turn the text of a call (between the markers) into a call dict or a list."""
        raise NotImplementedError

    def is_answer(self, body: str, tools: list[dict[str, Any]] | None) -> bool:
        """Whether a reply that began like a bare call is whole and no call: the answer."""
        return False

    def bare_start(self, text: str) -> bool | None:
        """Whether a reply beginning with ``text`` begins with a call without marker.

        Returns:
            True or False, or None while ``text`` is too short to tell.
        """
        if any(text.startswith(p) for p in self.bare_prefixes):
            return True
        return None if any(p.startswith(text) for p in self.bare_prefixes) else False

    # ------------------------------------------------------------------ forcing

    @property
    def forced_start(self) -> str:
        """The marker a forced reply begins with (``""``: the call itself begins it)."""
        return self.start

    def call_lark(self, tokenizer: Any, tool: ToolSpec) -> str:
        """Lark for one call of ``tool``, without markers."""
        raise NotImplementedError

    def call_rules(self, tokenizer: Any, tool: ToolSpec, rule: str) -> str:
        """Lark rules defining ``rule`` as one call of ``tool`` (helper rules may follow)."""
        return f"{rule}: {self.call_lark(tokenizer, tool)}"

    def calls_grammar(self, tokenizer: Any, tools: Sequence[ToolSpec], parallel: bool) -> str:
        """The grammar of tool calls in this family's own layout.

        Returns:
            Lark rules defining ``calls``: everything after :attr:`forced_start`.
        """
        alternatives, rules = self._alternatives(tokenizer, tools)
        end = lark.marker(tokenizer, self.end)
        one = f'"\\n"? ({alternatives}) "\\n"? {end}'
        opening = lark.marker(tokenizer, self.forced_start)
        more = f'("\\n"? {opening} {one})*' if parallel else ""
        return f"calls: {one} {more}\n{rules}"

    def _alternatives(self, tokenizer: Any, tools: Sequence[ToolSpec]) -> tuple[str, str]:
        rules = "\n".join(self.call_rules(tokenizer, t, f"tool_{i}") for i, t in enumerate(tools))
        return " | ".join(f"tool_{i}" for i in range(len(tools))), rules

    # ---------------------------------------------------------------- history as text

    def write_calls(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
        """Calls as this family writes them, for templates that cannot render them."""
        return "\n".join(f"{self.start}{json_call(name, args)}{self.end}" for name, args in calls)


def written_call(tokenizer: Any, marker: str) -> str | None:
    """What a chat template writes after ``marker`` for one assistant call, or None.

    Families whose templates write calls in more than one layout look here once.
    """
    call = {
        "id": "abcDEF123",  # 9 alphanumerics: the strictest templates take it
        "type": "function",
        "function": {"name": "zq_probe_tool", "arguments": {"x": 1}},
    }
    convo = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    try:
        text = tokenizer.apply_chat_template(convo, tokenize=False, add_generation_prompt=False)
    except Exception:
        return None
    if marker not in text:
        return None
    return str(text.rsplit(marker, 1)[1].lstrip())


class JsonBodyFormat(ToolFormat):
    """A family whose call is one JSON object ``{"name": ..., "<arguments_key>": {...}}``."""

    arguments_key = "arguments"

    def parse(self, body: str, tools: list[dict[str, Any]] | None) -> Any:
        return parse_json_calls(body, tools)

    def call_lark(self, tokenizer: Any, tool: ToolSpec) -> str:
        return json_call_lark(tool, key=self.arguments_key)


def json_call(name: str, arguments: Any, key: str = "arguments") -> str:
    """``{"name": ..., "arguments": ...}`` in compact JSON."""
    return json.dumps({"name": name, key: arguments}, ensure_ascii=False)


def json_call_lark(tool: ToolSpec, key: str = "arguments") -> str:
    """Lark for ``{"name": <tool>, "<key>": {...}}``, valid against the tool's schema."""
    parameters = dict(tool.constrained_parameters)
    defs = lark.schema_defs(parameters)
    for k in defs:
        parameters.pop(k)
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"name": {"const": tool.name}, key: parameters},
        "required": ["name", key],
        "additionalProperties": False,
    }
    return lark.json_value(schema, defs)


def loads_args(value: Any) -> Any:
    """Arguments as a dict: JSON strings decoded, None as no arguments."""
    if isinstance(value, str):
        value = value.strip()
        return json.loads(value) if value else {}
    return {} if value is None else value


def call_from_json(obj: Any) -> dict[str, Any]:
    """A decoded JSON call (``name`` with ``arguments``, ``parameters`` or ``function``)."""
    if not isinstance(obj, dict):
        raise ValueError(f"a tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if name is None and isinstance(obj.get("function"), dict):
        return call_from_json(obj["function"])
    if not isinstance(name, str) or not name:
        raise ValueError("the tool call has no 'name'")
    args = obj.get("arguments", obj.get("parameters", {}))
    return {"name": name, "arguments": loads_args(args)}


def json_objects(body: str) -> list[Any]:
    """The JSON values of ``body``: one, a list (flattened), or several separated by ``;``."""
    text = body.strip()
    if not text:
        raise ValueError("the tool call is empty")
    decoder = json.JSONDecoder()
    values: list[Any] = []
    pos = 0
    while pos < len(text):
        obj, end = decoder.raw_decode(text, pos)
        values.extend(obj if isinstance(obj, list) else [obj])
        pos = end
        while pos < len(text) and text[pos] in " \t\r\n;,":
            pos += 1
    return values


def parse_json_calls(body: str, tools: Any = None) -> list[dict[str, Any]]:
    """One JSON call, a JSON list of calls, or calls separated by ``;`` or newlines."""
    return [call_from_json(item) for item in json_objects(body)]


def _as_list(parsed: Any) -> list[dict[str, Any]]:
    items = parsed if isinstance(parsed, list) else [parsed]
    out = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ValueError(f"parser returned {item!r}, not a call with a name")
        args = loads_args(item.get("arguments", {}))
        if not isinstance(args, dict):
            raise ValueError(f"arguments of {item['name']!r} must be an object, got {args!r}")
        out.append({"name": item["name"], "arguments": args})
    return out


_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "array": list,
    "object": dict,
    "null": type(None),
}


def _declared_types(schema: Any) -> tuple[type, ...]:
    if not isinstance(schema, dict):
        return ()
    kinds = schema.get("type")
    names = kinds if isinstance(kinds, list) else [kinds]
    found: list[type] = []
    for name in names:
        wanted = _JSON_TYPES.get(name) if isinstance(name, str) else None
        found += list(wanted) if isinstance(wanted, tuple) else [wanted] if wanted else []
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or []:
            found += _declared_types(option)
    if isinstance(schema.get("enum"), list):
        found += [type(v) for v in schema["enum"]]
    return tuple(found)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def coerce_to_schema(calls: list[dict[str, Any]], tools: Any) -> list[dict[str, Any]]:
    """String values read back as the non-string type the tool declares for them.

    Templates that write values as text (Llama 4 quotes every value, ``days="3"``;
    XML families write ``3``) and models that copy them give strings for numbers.
    """
    schemas = {
        t["function"]["name"]: (t["function"].get("parameters") or {}).get("properties") or {}
        for t in tools or []
        if isinstance(t, dict) and isinstance(t.get("function"), dict)
    }
    for call in calls:
        props = schemas.get(call["name"], {})
        for key, value in call["arguments"].items():
            wanted = _declared_types(props.get(key))
            if not isinstance(value, str) or not wanted or str in wanted:
                continue
            text = value.strip()
            try:
                parsed = {"True": True, "False": False}.get(text)
                if parsed is None:
                    parsed = json.loads(text, parse_constant=_no_constant)
            except ValueError:
                continue
            if isinstance(parsed, wanted) and (bool in wanted or not isinstance(parsed, bool)):
                call["arguments"][key] = parsed
    return calls


_NAME_CLUES = (
    re.compile(r'"name"\s*:\s*"([^"]+)"'),
    re.compile(r"<function=([\w.-]+)>"),
    re.compile(r"^\s*\[?\s*([A-Za-z_][\w.-]*)\s*[\(\[<]"),
)


def parse_calls(
    fmt: ToolFormat, body: str, tools: list[dict[str, Any]] | None = None
) -> list[ParsedToolCall | InvalidToolCall]:
    """Parse the text of a call with ``fmt``; never raises (errors become invalid calls)."""
    try:
        calls = coerce_to_schema(_as_list(fmt.parse(body, tools)), tools)
    except Exception as exc:  # any parser error becomes an invalid call, never a crash
        name = next((m.group(1) for p in _NAME_CLUES if (m := p.search(body))), None)
        return [InvalidToolCall(raw=body, error=f"{type(exc).__name__}: {exc}", name=name)]
    if not calls:
        return [InvalidToolCall(raw=body, error="no tool call found", name=None)]
    return [ParsedToolCall(c["name"], c["arguments"]) for c in calls]
