"""Pythonic calls: ``[get_weather(city="Paris"), get_time()]``.

Llama 3.2 / Llama 4 pythonic templates and Gemma 3 ask for a Python list of calls with
keyword arguments. Values are Python or JSON literals (``true`` and ``null`` are read
too); a forced call writes each value as JSON, which is also a Python literal.
"""

from __future__ import annotations

import ast
import json
import keyword
import re
from typing import Any

from mlx_integrations.chat import lark
from mlx_integrations.chat.tool_formats.base import (
    ToolFormat,
    json_call_lark,
    parse_json_calls,
    written_call,
)
from mlx_integrations.chat.tools import ToolSpec


class _BareNames(ast.NodeTransformer):
    # JSON spellings (true/false/null) are accepted beside Python's, at any depth. Any
    # other bare name is a string: Llama 3.2's template writes earlier calls' strings
    # unquoted (``city=Paris``), and models copy what they see.
    def visit_Name(self, node: ast.Name) -> ast.Constant:
        value = {"true": True, "false": False, "null": None}.get(node.id, node.id)
        return ast.copy_location(ast.Constant(value), node)


def _literal(node: ast.expr) -> Any:
    return ast.literal_eval(_BareNames().visit(node))


_CALL_START = re.compile(r"\[\s*[A-Za-z_][\w.-]*\s*\(")
_MAYBE_CALL_START = re.compile(r"\[\s*(?:[A-Za-z_][\w.-]*\s*)?")


def _python_names(text: str, tools: Any) -> tuple[str, dict[str, str]]:
    """``text`` with tool and argument names Python cannot read (``from``, ``user-id``,
    ``send-mail``) replaced by stand-ins, and the stand-ins' real names."""
    names: set[str] = set()
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict):
            names.add(str(function.get("name", "")))
            names.update((function.get("parameters") or {}).get("properties") or {})
    real: dict[str, str] = {}
    for i, name in enumerate(sorted(n for n in names if n)):
        if name.isidentifier() and not keyword.iskeyword(name):
            continue
        stand_in = f"_zq{i}_"
        # A tool name before "(", an argument name before "=", where a call puts them.
        pattern = rf"(?<=[\[(,\s]){re.escape(name)}(?=\s*[(=])"
        text, count = re.subn(pattern, stand_in, text)
        if count:
            real[stand_in] = name
    return text, real


def parse_pythonic_calls(body: str, tools: Any = None) -> list[dict[str, Any]]:
    """``[get_weather(city="Paris"), now()]`` as a list of call dicts."""
    text = body.strip()
    if not text.startswith("["):
        text = f"[{text}]"
    text, real = _python_names(text, tools)
    tree = ast.parse(text, mode="eval").body
    if not isinstance(tree, ast.List) or not tree.elts:
        raise ValueError("expected a list of calls like [name(arg=value)]")
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or node.args:
            raise ValueError("each call must look like name(arg=value, ...)")
        func = node.func
        name = func.id if isinstance(func, ast.Name) else ast.unparse(func)
        name = real.get(name, name)
        args = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise ValueError("**kwargs are not allowed in a tool call")
            args[real.get(kw.arg, kw.arg)] = _literal(kw.value)
        calls.append({"name": name, "arguments": args})
    return calls


def pythonic_call_lark(tool: ToolSpec) -> str:
    """Lark for ``name(arg=<json>, ...)`` with the tool's arguments in schema order."""
    parameters = tool.constrained_parameters
    defs = lark.schema_defs(parameters)
    props = parameters.get("properties") or {}
    args = lark.keyword_arguments(
        props,
        tool.required,
        lambda name, schema: f"{lark.lit(name + '=')} {lark.json_value(schema, defs)}",
        '", "',
    )
    return f"{lark.lit(tool.name + '(')} {args} {lark.lit(')')}"


def write_pythonic(calls: Any) -> str:
    """``[a(x=1), b()]`` with JSON-literal values."""
    items = (
        f"{name}({', '.join(f'{k}={json.dumps(v, ensure_ascii=False)}' for k, v in args.items())})"
        for name, args in calls
    )
    return f"[{', '.join(items)}]"


class PythonicFormat(ToolFormat):
    """A bare Python list of calls at the start of the reply."""

    name = "pythonic"
    aliases: tuple[str, ...] = (
        "llama3.2_pythonic",
        "llama4_pythonic",
        "gemma3",
        "gemma3_pythonic",
        "llama4",
    )
    clues = ("[func_name1(", "func_name1(params_name1")
    bare_prefixes: tuple[str, ...] = ("[",)

    def parse(self, body: str, tools: list[dict[str, Any]] | None) -> Any:
        return parse_pythonic_calls(body, tools)

    def bare_start(self, text: str) -> bool | None:
        # ``[name(`` begins a call; ``[1] Smith`` or ``[Paris](...)`` is text.
        if _CALL_START.match(text):
            return True
        return None if _MAYBE_CALL_START.fullmatch(text) else False

    def call_lark(self, tokenizer: Any, tool: ToolSpec) -> str:
        return pythonic_call_lark(tool)

    def calls_grammar(self, tokenizer: Any, tools: Any, parallel: bool) -> str:
        alternatives, rules = self._alternatives(tokenizer, tools)
        more = f'(", " ({alternatives}))*' if parallel else ""
        end = lark.marker(tokenizer, self.end)
        return f'calls: "[" ({alternatives}) {more} "]" {end}\n{rules}'

    def write_calls(self, calls: Any) -> str:
        return f"{self.start}{write_pythonic(calls)}{self.end}"


class LfmFormat(PythonicFormat):
    """LFM2: a pythonic list between ``<|tool_call_start|>`` and ``<|tool_call_end|>``."""

    name = "lfm"
    aliases = ("lfm2", "lfm_pythonic")
    start = "<|tool_call_start|>"
    end = "<|tool_call_end|>"
    bare_prefixes = ()

    def __init__(self, json_list: bool = False) -> None:
        self.json_list = json_list
        """The template writes calls as a JSON list (llama.cpp's LFM2 template)."""

    @classmethod
    def recognise(cls, template: str, tokenizer: Any) -> ToolFormat | None:
        if "<|tool_call_start|>" not in template:
            return None
        written = written_call(tokenizer, cls.start)
        return cls(json_list=written is not None and written.startswith("[{"))

    def parse(self, body: str, tools: list[dict[str, Any]] | None) -> Any:
        if body.lstrip().startswith(("[{", "{")):
            return parse_json_calls(body, tools)
        return super().parse(body, tools)

    def call_lark(self, tokenizer: Any, tool: ToolSpec) -> str:
        return json_call_lark(tool) if self.json_list else pythonic_call_lark(tool)

    def write_calls(self, calls: Any) -> str:
        if not self.json_list:
            return super().write_calls(calls)
        body = json.dumps([{"name": n, "arguments": a} for n, a in calls], ensure_ascii=False)
        return f"{self.start}{body}{self.end}"
