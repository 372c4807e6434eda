"""Tool-call formats of the model families people run on MLX, and their parsers.

A format is the markup a model writes around a call (``<tool_call>...</tool_call>``,
``[TOOL_CALLS]...``, ``<|python_tag|>...``) and a function that turns the body into
calls. Where mlx-lm knows a family (its ``TokenizerWrapper`` exposes the markers and
a parser), we use mlx-lm's parser; we add only the families it lacks.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BodyParser = Callable[[str, Any], Any]


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


@dataclass(frozen=True)
class ToolCallFormat:
    """How one model family writes tool calls.

    Attributes:
        name: Registry name (``hermes``, ``mistral``, ``llama3_json``...).
        start: Marker that opens a call (or a list of calls).
        end: Marker that closes it; empty when the call runs to the end of the turn.
        parse_body: Turns the text between the markers into one call or a list.
        bare_prefixes: For formats that may also appear without a start marker at the
            very beginning of a reply (Llama's bare JSON, pythonic lists).
    """

    name: str
    start: str
    end: str
    parse_body: BodyParser
    bare_prefixes: tuple[str, ...] = ()


def _loads_args(value: Any) -> Any:
    if isinstance(value, str):
        value = value.strip()
        return json.loads(value) if value else {}
    return {} if value is None else value


def _json_call(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ValueError(f"a tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if name is None and isinstance(obj.get("function"), dict):
        return _json_call(obj["function"])
    if not isinstance(name, str) or not name:
        raise ValueError("the tool call has no 'name'")
    args = obj.get("arguments", obj.get("parameters", {}))
    return {"name": name, "arguments": _loads_args(args)}


def parse_json_calls(body: str, tools: Any = None) -> list[dict[str, Any]]:
    """One JSON call, a JSON list of calls, or calls separated by ``;`` or newlines."""
    text = body.strip()
    if not text:
        raise ValueError("the tool call is empty")
    decoder = json.JSONDecoder()
    calls: list[dict[str, Any]] = []
    pos = 0
    while pos < len(text):
        obj, end = decoder.raw_decode(text, pos)
        items = obj if isinstance(obj, list) else [obj]
        calls.extend(_json_call(item) for item in items)
        pos = end
        while pos < len(text) and text[pos] in " \t\r\n;,":
            pos += 1
    return calls


def parse_pythonic_calls(body: str, tools: Any = None) -> list[dict[str, Any]]:
    """``[get_weather(city="Paris"), now()]`` as Llama 3.2/4 pythonic templates ask."""
    text = body.strip()
    if not text.startswith("["):
        text = f"[{text}]"
    tree = ast.parse(text, mode="eval").body
    if not isinstance(tree, ast.List) or not tree.elts:
        raise ValueError("expected a list of calls like [name(arg=value)]")
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or node.args:
            raise ValueError("each call must look like name(arg=value, ...)")
        func = node.func
        name = func.id if isinstance(func, ast.Name) else ast.unparse(func)
        args = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise ValueError("**kwargs are not allowed in a tool call")
            args[kw.arg] = _literal(kw.value)
        calls.append({"name": name, "arguments": args})
    return calls


class _BareNames(ast.NodeTransformer):
    # JSON spellings (true/false/null) are accepted beside Python's, at any depth. Any
    # other bare name is a string: Llama 3.2's template writes earlier calls' strings
    # unquoted (``city=Paris``), and models copy what they see.
    def visit_Name(self, node: ast.Name) -> ast.Constant:
        value = {"true": True, "false": False, "null": None}.get(node.id, node.id)
        return ast.copy_location(ast.Constant(value), node)


def _literal(node: ast.expr) -> Any:
    return ast.literal_eval(_BareNames().visit(node))


# Mistral's newer tokenizers put a call id between the name and the arguments:
# ``[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{...}``.
_MISTRAL_HEADER = re.compile(r"[\s,;]*([\w.-]+)\s*(?:\[CALL_ID\]\s*[\w-]*\s*)?\[ARGS\]\s*")


def parse_mistral_calls(body: str, tools: Any = None) -> Any:
    """Mistral calls: a JSON list, ``name[ARGS]{...}``, or ``name[CALL_ID]id[ARGS]{...}``.

    Calls with an id are read one after the other from the start (the arguments as one
    JSON value each), so ``[CALL_ID]`` inside an argument string is left alone. The
    model's own ids are dropped: every call gets a fresh id, as in all formats.
    """
    if "[CALL_ID]" not in body or body.lstrip().startswith(("[", "{")):
        return _mlx_lm_parser("mistral")(body, tools)
    decoder = json.JSONDecoder()
    text = body.rstrip()
    calls, pos = [], 0
    while pos < len(text):
        header = _MISTRAL_HEADER.match(text, pos)
        if header is None:
            raise ValueError(f"Could not parse tool call from: {body}")
        arguments, pos = decoder.raw_decode(text, header.end())
        if not isinstance(arguments, dict):
            raise ValueError(f"Tool call arguments must be a JSON object: {body}")
        calls.append({"name": header.group(1), "arguments": arguments})
    return calls[0] if len(calls) == 1 else calls


def _mlx_lm_parser(module: str) -> BodyParser:
    def parse(body: str, tools: Any = None) -> Any:
        import importlib

        parser = importlib.import_module(f"mlx_lm.tool_parsers.{module}").parse_tool_call
        return parser(body, tools)

    parse.__name__ = f"mlx_lm_{module}"
    return parse


def _mlx_lm_markers(module: str) -> tuple[str, str]:
    import importlib

    mod = importlib.import_module(f"mlx_lm.tool_parsers.{module}")
    return mod.tool_call_start, mod.tool_call_end


def _registry() -> dict[str, ToolCallFormat]:
    formats = [
        ToolCallFormat("hermes", "<tool_call>", "</tool_call>", parse_json_calls),
        ToolCallFormat(
            "llama3_json",
            "<|python_tag|>",
            "",
            parse_json_calls,
            bare_prefixes=('{"name"', '{"type"', '{ "name"'),
        ),
        ToolCallFormat("mistral", "[TOOL_CALLS]", "", parse_mistral_calls),
        ToolCallFormat("qwen3_coder", "<tool_call>", "</tool_call>", _mlx_lm_parser("qwen3_coder")),
        ToolCallFormat("pythonic", "", "", parse_pythonic_calls, bare_prefixes=("[",)),
        ToolCallFormat(
            "lfm_pythonic", "<|tool_call_start|>", "<|tool_call_end|>", parse_pythonic_calls
        ),
    ]
    return {f.name: f for f in formats}


FORMATS: dict[str, ToolCallFormat] = _registry()
# Names mlx-lm uses for the same families.
_ALIASES = {"json_tools": "hermes", "qwen": "hermes", "qwen2_5": "hermes", "llama": "llama3_json"}
# mlx-lm parser modules whose markers differ from our format of the same name: its
# ``pythonic`` module reads LFM2's ``<|tool_call_start|>[...]<|tool_call_end|>``.
_FROM_MLX_LM = {"pythonic": "lfm_pythonic"}


def get_format(name: str) -> ToolCallFormat:
    """Look up a format by name; mlx-lm parser module names work too."""
    key = _ALIASES.get(name, name)
    if key in FORMATS:
        return FORMATS[key]
    try:
        start, end = _mlx_lm_markers(name)
    except ImportError:
        known = ", ".join(sorted(FORMATS))
        raise ValueError(f"Unknown tool-call format {name!r}; use one of {known}") from None
    return ToolCallFormat(name, start, end, _mlx_lm_parser(name))


def detect_format(tokenizer: Any, override: str | None = None) -> ToolCallFormat:
    """Pick the tool-call format of a model.

    Order: the user's ``override``; the markers and parser mlx-lm inferred for the
    tokenizer; clues in the chat template; Hermes ``<tool_call>`` (which is also what
    tool descriptions for template-less models ask for).
    """
    if override:
        return get_format(override)
    parser = getattr(tokenizer, "tool_parser", None)
    if parser is not None:
        module = getattr(parser, "__module__", "").rsplit(".", 1)[-1]
        return get_format(_FROM_MLX_LM.get(module, module))
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        if "<tool_call>\\n<function=" in template or "<tool_call>\n<function=" in template:
            return FORMATS["qwen3_coder"]
        if "<|tool_call_start|>" in template:
            return FORMATS["lfm_pythonic"]
        if "<|python_tag|>" in template or '"parameters": dictionary of argument' in template:
            return FORMATS["llama3_json"]
        if "[func_name1(" in template or "func_name1(params_name1" in template:
            return FORMATS["pythonic"]
        if "[TOOL_CALLS]" in template:
            return FORMATS["mistral"]
    return FORMATS["hermes"]


def _as_list(parsed: Any) -> list[dict[str, Any]]:
    items = parsed if isinstance(parsed, list) else [parsed]
    out = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ValueError(f"parser returned {item!r}, not a call with a name")
        args = item.get("arguments", {})
        args = _loads_args(args)
        if not isinstance(args, dict):
            raise ValueError(f"arguments of {item['name']!r} must be an object, got {args!r}")
        out.append({"name": item["name"], "arguments": args})
    return out


def parse_body(
    fmt: ToolCallFormat, body: str, tools: Any = None
) -> list[ParsedToolCall | InvalidToolCall]:
    """Parse the text between a format's markers; never raises."""
    try:
        calls = _as_list(fmt.parse_body(body, tools))
    except Exception as exc:  # any parser error becomes an invalid call, never a crash
        return [
            InvalidToolCall(raw=body, error=f"{type(exc).__name__}: {exc}", name=_guess_name(body))
        ]
    if not calls:
        return [InvalidToolCall(raw=body, error="no tool call found", name=None)]
    return [ParsedToolCall(c["name"], c["arguments"]) for c in calls]


def _guess_name(body: str) -> str | None:
    import re

    match = re.search(r'"name"\s*:\s*"([^"]+)"', body) or re.search(r"<function=([\w.-]+)>", body)
    return match.group(1) if match else None
