"""Constrained decoding: JSON schema, JSON mode and tool choice, with llguidance.

A :class:`Constraint` describes what the output must look like; it is checked when it
is made (a bad schema or tool fails here, before any generation) and turned into a
logits processor per request with :meth:`Constraint.make_processor`. Processors are
stateful and single-use, so make a new one for every request.

Tool calls follow the Hermes/Qwen format: a start marker, a JSON body
``{"name": <tool name>, "arguments": <object valid against the tool's parameters>}``
and an end marker. The markers come from the tokenizer when mlx-lm knows them
(``TokenizerWrapper.tool_call_start``/``tool_call_end``), else ``<tool_call>`` and
``</tool_call>``.

Example:
    >>> import asyncio
    >>> from mlx_integrations.engine import SimpleEngine
    >>> from mlx_integrations.chat.constraints import (
    ...     JsonSchemaConstraint, validate_json_output)
    >>> schema = {"type": "object", "properties": {"city": {"type": "string"}},
    ...           "required": ["city"]}
    >>> constraint = JsonSchemaConstraint(schema)
    >>> async def main():
    ...     engine = SimpleEngine("path/to/mlx-model")
    ...     out = await engine.chat(
    ...         [{"role": "user", "content": "Where is the Louvre? Answer in JSON."}],
    ...         max_tokens=64,
    ...         logits_processors=[constraint.make_processor(engine.tokenizer)],
    ...     )
    ...     print(validate_json_output(out.text, schema, finish_reason=out.finish_reason))
    ...     await engine.stop()
    >>> asyncio.run(main())  # doctest: +SKIP
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, get_args

from mlx_integrations.chat.grammar_processor import (
    GrammarLogitsProcessor,
    TokenBanProcessor,
    check_grammar,
    hf_tokenizer,
    llguidance_tokenizer,
)
from mlx_integrations.chat.template import ToolCallLayout

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

LogitsProcessor = Callable[[Any, Any], Any]
"""``fn(tokens: mx.array, logits: mx.array) -> mx.array``, run on the model's owner thread."""

DEFAULT_TOOL_CALL_START = "<tool_call>"
DEFAULT_TOOL_CALL_END = "</tool_call>"

# Compact JSON with the separators json.dumps writes (what models see most in training);
# no free whitespace, which a small model can otherwise emit forever.
_COMPACT_JSON: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}


class StructuredOutputError(ValueError):
    """A constrained output did not come out complete and valid.

    Attributes:
        text: The generated text.
        finish_reason: Why generation ended, when known.
        truncated: True when the output was cut before it was complete (most often
            at ``max_tokens``); raising ``max_tokens`` fixes it.
    """

    def __init__(
        self, message: str, *, text: str, finish_reason: str | None, truncated: bool
    ) -> None:
        super().__init__(message)
        self.text = text
        self.finish_reason = finish_reason
        self.truncated = truncated


# --------------------------------------------------------------------------- inputs


def check_json_schema(schema: Any, what: str = "The JSON schema") -> dict[str, Any]:
    """Check that ``schema`` is a JSON schema llguidance can enforce; return it.

    Args:
        schema: The schema (a dict).
        what: How to name the schema in error messages.

    Raises:
        TypeError: ``schema`` is not a dict.
        ValueError: It is not a valid JSON schema, or llguidance cannot compile it.
    """
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for
    from llguidance import LLMatcher

    if not isinstance(schema, Mapping):
        raise TypeError(f"{what} must be a dict, got {type(schema).__name__}: {schema!r:.80}")
    schema = dict(schema)
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the top level"
        raise ValueError(f"{what} is not a valid JSON schema (at {where}): {exc.message}") from exc
    try:
        grammar = LLMatcher.grammar_from_json_schema(schema, overrides=_COMPACT_JSON)
        check_grammar(grammar)
    except ValueError as exc:
        raise ValueError(f"{what} cannot be enforced: {exc}") from exc
    return schema


@dataclass(frozen=True)
class ToolSpec:
    """A function tool whose calls can be constrained.

    Attributes:
        name: The function name the model must write.
        parameters: JSON schema of the ``arguments`` object.
        description: Free text, not used by the constraint.
    """

    name: str
    parameters: dict[str, Any] = field(hash=False)
    description: str = ""

    @classmethod
    def from_openai(cls, tool: Any, index: int = 0) -> ToolSpec:
        """Read an OpenAI-style tool ``{"type": "function", "function": {...}}``.

        A bare function dict (``{"name", "description", "parameters"}``) is read too.

        Raises:
            TypeError: The tool or one of its fields has the wrong type.
            ValueError: The tool has no name, no parameters, or invalid parameters.
        """
        where = f"tools[{index}]"
        if not isinstance(tool, Mapping):
            raise TypeError(
                f"{where} must be a dict like "
                '{"type": "function", "function": {"name": ..., "parameters": {...}}}, '
                f"got {type(tool).__name__}"
            )
        kind = tool.get("type", "function")
        if kind != "function":
            raise ValueError(f"{where} has type {kind!r}; only 'function' tools can be called")
        function = tool.get("function", tool)
        if not isinstance(function, Mapping):
            raise TypeError(f"{where}['function'] must be a dict, got {type(function).__name__}")
        name = function.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{where} has no name; give the function a non-empty 'name'")
        if "parameters" not in function or function["parameters"] is None:
            raise ValueError(
                f"Tool {name!r} ({where}) has no 'parameters'; give a JSON schema, "
                '{"type": "object", "properties": {}} for a tool without arguments'
            )
        parameters = function["parameters"]
        if not isinstance(parameters, Mapping):
            raise TypeError(
                f"Tool {name!r} ({where}): 'parameters' must be a JSON schema dict, "
                f"got {type(parameters).__name__}"
            )
        if parameters.get("type", "object") != "object":
            raise ValueError(
                f"Tool {name!r} ({where}): 'parameters' must describe an object "
                f"(type 'object'), got type {parameters.get('type')!r}"
            )
        parameters = check_json_schema(parameters, f"The parameters of tool {name!r}")
        description = function.get("description") or ""
        return cls(name=name, parameters=parameters, description=str(description))

    def call_schema(self) -> dict[str, Any]:
        """JSON schema of one call body: ``{"name": <this name>, "arguments": {...}}``."""
        parameters = dict(self.parameters)
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {"name": {"const": self.name}, "arguments": parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        # Local references point at the root of the document: keep their targets there.
        for key in ("$defs", "definitions"):
            if key in parameters:
                schema[key] = parameters.pop(key)
        return schema


def read_tools(tools: Sequence[Any] | None) -> tuple[ToolSpec, ...]:
    """Check OpenAI-style tools and return them as :class:`ToolSpec`.

    Raises:
        TypeError: ``tools`` is not a list, or a tool has the wrong shape.
        ValueError: A tool is invalid (the message names it), or two share a name.
    """
    if tools is None:
        return ()
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise TypeError(f"tools must be a list of tool dicts, got {type(tools).__name__}")
    specs = tuple(
        tool if isinstance(tool, ToolSpec) else ToolSpec.from_openai(tool, i)
        for i, tool in enumerate(tools)
    )
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise ValueError(f"Two tools are named {spec.name!r}; tool names must be unique")
        seen.add(spec.name)
    return specs


@dataclass(frozen=True)
class ToolCallMarkers:
    """The strings around one tool call in the model's output, and how a call is written.

    Attributes:
        start: Opens a call (or, with ``layout="list"``, the list of calls).
        end: Closes a call (``""`` for none).
        layout: ``"object"``: ``{"name": ..., "arguments": {...}}`` between the markers
            (Hermes, Qwen, Llama 3.1); ``"list"``: one JSON list of such objects after
            ``start`` (Mistral v0.3); ``"header"``: ``name[ARGS]{...}`` after ``start``
            (newer Mistral tokenizers); ``"header_id"``: ``name[CALL_ID]id[ARGS]{...}``
            with a 9-character id.
    """

    start: str = DEFAULT_TOOL_CALL_START
    end: str = DEFAULT_TOOL_CALL_END
    layout: ToolCallLayout = "object"

    def __post_init__(self) -> None:
        if not isinstance(self.start, str) or not self.start:
            raise ValueError("The tool-call start marker must be a non-empty string")
        if not isinstance(self.end, str):
            raise TypeError("The tool-call end marker must be a string ('' for none)")
        if self.layout not in get_args(ToolCallLayout):
            raise ValueError(
                f"Unknown tool-call layout {self.layout!r}; "
                f"use one of {', '.join(get_args(ToolCallLayout))}"
            )


def tool_call_markers(tokenizer: Any) -> ToolCallMarkers:
    """The model's tool-call markers, as mlx-lm's ``TokenizerWrapper`` knows them.

    Falls back to ``<tool_call>``/``</tool_call>`` when the tokenizer does not say.
    """
    start = getattr(tokenizer, "tool_call_start", None)
    end = getattr(tokenizer, "tool_call_end", None)
    if isinstance(start, str) and start:
        return ToolCallMarkers(start, end if isinstance(end, str) else "")
    return ToolCallMarkers()


# --------------------------------------------------------------------------- constraints


class Constraint(ABC):
    """What a generation must look like; makes one logits processor per request."""

    @abstractmethod
    def grammar(self, tokenizer: Any) -> str:
        """The llguidance grammar of this constraint for the given tokenizer."""

    def make_processor(self, tokenizer: Any) -> LogitsProcessor:
        """A fresh, single-use logits processor for one request.

        Args:
            tokenizer: The model's tokenizer (mlx-lm ``TokenizerWrapper``), e.g.
                ``engine.tokenizer``.
        """
        return GrammarLogitsProcessor(tokenizer, self.grammar(tokenizer))


@dataclass(frozen=True)
class JsonSchemaConstraint(Constraint):
    """The output is one JSON value valid against ``schema``.

    Give strings a ``maxLength`` or ``enum`` where a small model may ramble: the
    grammar keeps the value valid, but only the model decides when a free string ends.

    Example:
        >>> c = JsonSchemaConstraint({"type": "object", "properties": {"n": {"type": "integer"}}})
        >>> processor = c.make_processor(engine.tokenizer)  # doctest: +SKIP

    Attributes:
        schema: The JSON schema.
        whitespace_flexible: Allow any JSON whitespace; by default the output is compact
            JSON with ``", "`` and ``": "`` separators.
    """

    schema: dict[str, Any] = field(hash=False)
    whitespace_flexible: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "schema", check_json_schema(self.schema))

    def grammar(self, tokenizer: Any = None) -> str:
        from llguidance import LLMatcher

        options: JsonCompileOptions = (
            {"whitespace_flexible": True} if self.whitespace_flexible else _COMPACT_JSON
        )
        return LLMatcher.grammar_from_json_schema(self.schema, overrides=options)


@dataclass(frozen=True)
class JsonObjectConstraint(Constraint):
    """The output is one JSON object (OpenAI's ``response_format={"type": "json_object"}``)."""

    whitespace_flexible: bool = False

    def grammar(self, tokenizer: Any = None) -> str:
        return JsonSchemaConstraint({"type": "object"}, self.whitespace_flexible).grammar()


@dataclass(frozen=True)
class LarkConstraint(Constraint):
    """The output follows a grammar in llguidance's Lark dialect.

    For formats that are neither JSON nor tool calls, e.g. the ``Thought:/Action:``
    lines a ReAct agent parses. ``%json {...}`` inside the grammar embeds a JSON schema.

    Example:
        >>> c = LarkConstraint('start: "yes" | "no"')
        >>> processor = c.make_processor(engine.tokenizer)  # doctest: +SKIP
    """

    lark: str

    def __post_init__(self) -> None:
        from llguidance import LLMatcher

        if not isinstance(self.lark, str) or not self.lark.strip():
            raise ValueError("The grammar must be a non-empty Lark string")
        error = LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(self.lark))
        if error:  # llguidance returns an empty string for a valid grammar
            raise ValueError(f"The grammar is not valid: {error}")

    def grammar(self, tokenizer: Any = None) -> str:
        from llguidance import LLMatcher

        return LLMatcher.grammar_from_lark(self.lark)


class ToolChoiceMode(StrEnum):
    """How a generation may call tools."""

    AUTO = "auto"
    """Free text; a tool call, once opened, must be valid."""
    REQUIRED = "required"
    """One or more valid calls of any of the tools, and nothing else."""
    NAMED = "named"
    """One or more valid calls of one named tool, and nothing else."""
    NONE = "none"
    """Text only: the tool-call start marker can never be written."""


@dataclass(frozen=True)
class ToolChoiceConstraint(Constraint):
    """Tool calls as the ``tool_choice`` asks, each valid against its tool's schema.

    Build it with :func:`tool_choice_constraint` from OpenAI-style tools and tool choice.

    Example:
        >>> tools = [{"type": "function", "function": {
        ...     "name": "get_weather",
        ...     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
        ...                    "required": ["city"]}}}]
        >>> constraint = tool_choice_constraint(tools, "required", parallel=False)
        >>> constraint.mode
        <ToolChoiceMode.REQUIRED: 'required'>
        >>> out = await engine.chat(messages, tools=tools, logits_processors=[
        ...     constraint.make_processor(engine.tokenizer)])  # doctest: +SKIP
        >>> validate_tool_call_output(out.text, tools, finish_reason=out.finish_reason,
        ...                           require_call=True).tool_calls  # doctest: +SKIP
        [ConstrainedToolCall(name='get_weather', arguments={'city': 'Paris'})]

    Attributes:
        tools: The tools that may be called.
        mode: See :class:`ToolChoiceMode`.
        tool_name: The tool to call in ``NAMED`` mode.
        parallel: Allow several calls in a row (else exactly one in ``REQUIRED`` and
            ``NAMED`` mode, at most one in ``AUTO`` mode).
        markers: The tool-call markers; ``None`` reads them from the tokenizer.
    """

    tools: tuple[ToolSpec, ...]
    mode: ToolChoiceMode = ToolChoiceMode.AUTO
    tool_name: str | None = None
    parallel: bool = True
    markers: ToolCallMarkers | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tools", read_tools(self.tools))
        object.__setattr__(self, "mode", ToolChoiceMode(self.mode))
        names = [t.name for t in self.tools]
        if self.mode is ToolChoiceMode.NAMED:
            if self.tool_name not in names:
                raise ValueError(
                    f"tool_choice names tool {self.tool_name!r}, which is not among the "
                    f"tools given: {names}"
                )
        elif self.tool_name is not None:
            raise ValueError(f"tool_name is only used with mode 'named', not {self.mode.value!r}")
        if self.mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.AUTO) and not self.tools:
            raise ValueError(
                f"tool_choice={self.mode.value!r} needs at least one tool; pass tools "
                "or use tool_choice='none'"
            )

    def resolved_markers(self, tokenizer: Any) -> ToolCallMarkers:
        """The markers in use with this tokenizer."""
        return self.markers if self.markers is not None else tool_call_markers(tokenizer)

    @property
    def callable_tools(self) -> tuple[ToolSpec, ...]:
        """The tools a call may name under this mode."""
        if self.mode is ToolChoiceMode.NAMED:
            return tuple(t for t in self.tools if t.name == self.tool_name)
        return self.tools

    def make_processor(self, tokenizer: Any) -> LogitsProcessor:
        if self.mode is ToolChoiceMode.NONE:
            pieces = _marker_pieces(tokenizer, self.resolved_markers(tokenizer).start)
            if isinstance(pieces[0], int):
                # The marker opens with a special token: banning it is enough, and cheap.
                return TokenBanProcessor([pieces[0]])
        return super().make_processor(tokenizer)

    def grammar(self, tokenizer: Any) -> str:
        from llguidance import LLMatcher

        markers = self.resolved_markers(tokenizer)
        start = _marker_pieces(tokenizer, markers.start)
        text = _free_text_lark(self.mode, start)
        if self.mode is ToolChoiceMode.NONE:
            return LLMatcher.grammar_from_lark(f"start: TEXT\n{text}")
        end = _lark_seq(_marker_pieces(tokenizer, markers.end)) if markers.end else ""
        bodies = "\n".join(
            f"tool_{i}: {_call_lark(tokenizer, tool, markers.layout)}"
            for i, tool in enumerate(self.callable_tools)
        )
        alternatives = " | ".join(f"tool_{i}" for i in range(len(self.callable_tools)))
        if markers.layout == "list":
            # One JSON list after the marker: ``[call, call]``.
            items = f'(", " ({alternatives}))*' if self.parallel else ""
            body = f'" "? "[" ({alternatives}) {items} "]" {end}'
            more = ""
        else:
            body = f'"\\n"? ({alternatives}) "\\n"? {end}'
            more = f'("\\n"? {_lark_seq(start)} {body})*' if self.parallel else ""
        if self.mode is ToolChoiceMode.AUTO:
            if isinstance(start[0], int):
                rules = f"start: TEXT | TEXT {_lark_seq(start)} call_rest\n"
            else:
                # A text marker: free text ends at the first occurrence of the marker.
                rules = (
                    f"start: TEXT | opening {_lark_seq(start[1:])} call_rest\n"
                    f"opening[lazy]: TEXT {_lark_seq(start[:1])}\n"
                )
        else:
            rules = f"start: {_lark_seq(start)} call_rest\n"
        return LLMatcher.grammar_from_lark(f"{rules}call_rest: {body} {more}\n{text}\n{bodies}")


def _call_lark(tokenizer: Any, tool: ToolSpec, layout: ToolCallLayout) -> str:
    """The Lark rule body of one call of ``tool`` in the given layout."""
    if layout in ("object", "list"):
        return f"%json {json.dumps({**tool.call_schema(), 'x-guidance': _COMPACT_JSON})}"
    # The arguments are the whole JSON value here: their own schema, local refs included.
    args = f"%json {json.dumps({**tool.parameters, 'x-guidance': _COMPACT_JSON})}"
    name = json.dumps(tool.name)
    call_id = ""
    if layout == "header_id":
        call_id = f"{_lark_seq(_marker_pieces(tokenizer, '[CALL_ID]'))} /[A-Za-z0-9]{{9}}/ "
    return f"{name} {call_id}{_lark_seq(_marker_pieces(tokenizer, '[ARGS]'))} {args}"


def _marker_pieces(tokenizer: Any, marker: str) -> list[int | str]:
    """Split a marker into special-token ids and text, as the tokenizer reads it."""
    ll = llguidance_tokenizer(tokenizer)
    hf = hf_tokenizer(tokenizer)
    ids = hf.encode(marker, add_special_tokens=False)
    pieces: list[int | str] = []
    pos = 0
    for token in ids:
        if not ll.is_special_token(token):
            continue
        content = hf.convert_ids_to_tokens(token)
        at = marker.find(content, pos) if isinstance(content, str) else -1
        if at < 0:
            return [marker]
        if at > pos:
            pieces.append(marker[pos:at])
        pieces.append(int(token))
        pos = at + len(content)
    if pos < len(marker):
        pieces.append(marker[pos:])
    return pieces


def _lark_seq(pieces: Sequence[int | str]) -> str:
    return " ".join(
        f"<[{p}]>" if isinstance(p, int) else json.dumps(p, ensure_ascii=False) for p in pieces
    )


def _free_text_lark(mode: ToolChoiceMode, start: list[int | str]) -> str:
    """The TEXT terminal: any text, and in ``none`` mode never the start marker."""
    if mode is ToolChoiceMode.NONE and isinstance(start[0], str):
        first = json.dumps(start[0], ensure_ascii=False)
        return f"TEXT: /(?s:.*)/ & ~(/(?s:.*)/ {first} /(?s:.*)/)"
    return r"TEXT: /(.|\n)*/"


# --------------------------------------------------------------------------- factories


def tool_choice_constraint(
    tools: Sequence[Any] | None,
    tool_choice: Any = "auto",
    *,
    parallel: bool = True,
    markers: ToolCallMarkers | None = None,
) -> ToolChoiceConstraint:
    """The constraint for OpenAI-style ``tools`` and ``tool_choice``.

    Args:
        tools: ``[{"type": "function", "function": {"name", "description", "parameters"}}]``.
        tool_choice: ``"auto"`` (or None), ``"required"``/``"any"``, ``"none"``, a tool
            name, or ``{"type": "function", "function": {"name": ...}}``.
        parallel: Allow several calls in one turn.
        markers: Tool-call markers; by default read from the tokenizer at use.

    Raises:
        TypeError: ``tool_choice`` or a tool has the wrong type.
        ValueError: A tool is invalid, or ``tool_choice`` names a tool not given.
    """
    specs = read_tools(tools)
    name: str | None = None
    if tool_choice is None or tool_choice == "auto":
        mode = ToolChoiceMode.AUTO
    elif tool_choice in ("required", "any"):
        mode = ToolChoiceMode.REQUIRED
    elif tool_choice == "none":
        mode = ToolChoiceMode.NONE
    elif isinstance(tool_choice, str):
        mode, name = ToolChoiceMode.NAMED, tool_choice
    elif isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else tool_choice.get("name")
        if not isinstance(name, str):
            raise ValueError(
                'tool_choice as a dict must be {"type": "function", "function": {"name": ...}}'
                f", got {dict(tool_choice)!r}"
            )
        mode = ToolChoiceMode.NAMED
    else:
        raise TypeError(
            "tool_choice must be 'auto', 'required', 'any', 'none', a tool name or "
            f'{{"type": "function", "function": {{"name": ...}}}}, got {tool_choice!r}'
        )
    return ToolChoiceConstraint(specs, mode, name, parallel, markers)


def response_format_constraint(response_format: Any) -> Constraint | None:
    """The constraint for an OpenAI-style ``response_format``.

    Accepts ``{"type": "text"}`` (None: no constraint), ``{"type": "json_object"}``,
    ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}`` and a bare
    JSON schema dict.

    Raises:
        TypeError: ``response_format`` is not a dict.
        ValueError: An unknown type, or an invalid schema.
    """
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise TypeError(f"response_format must be a dict, got {type(response_format).__name__}")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return JsonObjectConstraint()
    if kind == "grammar":
        grammar = response_format.get("grammar")
        if not isinstance(grammar, str):
            raise ValueError('response_format type "grammar" needs {"grammar": "<lark grammar>"}')
        return LarkConstraint(grammar)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if schema is None:
            raise ValueError(
                'response_format type "json_schema" needs {"json_schema": {"schema": {...}}}'
            )
        return JsonSchemaConstraint(schema)
    if kind is None or kind in ("object", "array", "string", "number", "integer", "boolean"):
        return JsonSchemaConstraint(dict(response_format))
    raise ValueError(
        f"response_format type {kind!r} is unknown; use 'text', 'json_object', 'json_schema' "
        "or 'grammar'"
    )


def json_schema_processor(tokenizer: Any, schema: dict[str, Any]) -> LogitsProcessor:
    """A single-use logits processor that makes the output valid JSON for ``schema``."""
    return JsonSchemaConstraint(schema).make_processor(tokenizer)


def json_object_processor(tokenizer: Any) -> LogitsProcessor:
    """A single-use logits processor that makes the output one JSON object."""
    return JsonObjectConstraint().make_processor(tokenizer)


def tool_choice_processor(
    tokenizer: Any,
    tools: Sequence[Any] | None,
    tool_choice: Any = "required",
    *,
    parallel: bool = True,
    markers: ToolCallMarkers | None = None,
) -> LogitsProcessor:
    """A single-use logits processor for ``tool_choice`` (see :func:`tool_choice_constraint`)."""
    constraint = tool_choice_constraint(tools, tool_choice, parallel=parallel, markers=markers)
    return constraint.make_processor(tokenizer)


# --------------------------------------------------------------------------- outputs


def _cut_message(text: str, finish_reason: str | None, what: str) -> str:
    if finish_reason == "length":
        return (
            f"The output was cut at max_tokens before {what} was complete "
            f"({len(text)} characters generated); raise max_tokens and retry"
        )
    return (
        f"The output ends before {what} is complete (finish_reason={finish_reason!r}); "
        "if a stop sequence or max_tokens cut it, remove the stop sequence or raise max_tokens"
    )


def validate_json_output(
    text: str, schema: dict[str, Any] | None = None, *, finish_reason: str | None = None
) -> Any:
    """Parse a constrained JSON output and check it against ``schema``.

    Args:
        text: The generated text.
        schema: The JSON schema it was constrained to (None: any JSON).
        finish_reason: The engine's finish reason; ``"length"`` marks a possible cut.

    Returns:
        The parsed JSON value.

    Raises:
        StructuredOutputError: The output is truncated (``truncated=True``: raise
            ``max_tokens``), not JSON, or not valid against the schema.
    """
    from jsonschema import ValidationError, validate

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        cut = finish_reason == "length" or _ends_incomplete(text, exc)
        message = (
            _cut_message(text, finish_reason, "the JSON value")
            if cut
            else f"The output is not valid JSON ({exc.msg} at character {exc.pos}): {text!r:.200}"
        )
        raise StructuredOutputError(
            message, text=text, finish_reason=finish_reason, truncated=cut
        ) from exc
    if (
        finish_reason == "length"
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
    ):
        # A number cut between two digits is still a number: it cannot be trusted.
        raise StructuredOutputError(
            _cut_message(text, finish_reason, "the number"),
            text=text,
            finish_reason=finish_reason,
            truncated=True,
        )
    if schema is not None:
        try:
            validate(value, schema)
        except ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "the top level"
            raise StructuredOutputError(
                f"The output does not match the schema at {where}: {exc.message}",
                text=text,
                finish_reason=finish_reason,
                truncated=False,
            ) from exc
    return value


def _ends_incomplete(text: str, exc: json.JSONDecodeError) -> bool:
    """True when the JSON error is that the text ran out, not a wrong character."""
    stripped = text.rstrip()
    if not stripped:
        return True
    return exc.pos >= len(stripped) or exc.msg.startswith("Unterminated string")


@dataclass(frozen=True)
class ConstrainedToolCall:
    """One tool call read from a constrained output."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolCallOutput:
    """A constrained output split into its text and its tool calls."""

    content: str
    tool_calls: list[ConstrainedToolCall]


def validate_tool_call_output(
    text: str,
    tools: Sequence[Any],
    *,
    markers: ToolCallMarkers | None = None,
    finish_reason: str | None = None,
    require_call: bool = False,
) -> ToolCallOutput:
    """Read the tool calls of an output made under a :class:`ToolChoiceConstraint`.

    Every call must be complete, name one of ``tools`` and have arguments valid
    against that tool's parameters.

    Args:
        text: The generated text.
        tools: The tools (OpenAI-style dicts or :class:`ToolSpec`).
        markers: The tool-call markers (default ``<tool_call>``/``</tool_call>``).
        finish_reason: The engine's finish reason; ``"length"`` marks a possible cut.
        require_call: Raise when the output holds no call (``required`` tool choice).

    Raises:
        StructuredOutputError: A call was cut (``truncated=True``: raise ``max_tokens``),
            is not JSON, names an unknown tool, or has invalid arguments.
    """
    from jsonschema import ValidationError, validate

    specs = {spec.name: spec for spec in read_tools(tools)}
    markers = markers or ToolCallMarkers()
    first = text.find(markers.start)
    content = text if first < 0 else text[:first]
    calls: list[ConstrainedToolCall] = []

    def fail(message: str, truncated: bool = False) -> StructuredOutputError:
        return StructuredOutputError(
            message, text=text, finish_reason=finish_reason, truncated=truncated
        )

    segments = text[first:].split(markers.start)[1:] if first >= 0 else []
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if markers.end:
            body, closed, _ = segment.partition(markers.end)
        else:
            body, closed = segment, "" if last and finish_reason == "length" else "yes"
        if not closed:
            raise fail(_cut_message(text, finish_reason, f"tool call {i + 1}"), truncated=True)
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as exc:
            raise fail(f"Tool call {i + 1} is not valid JSON ({exc.msg}): {body!r:.200}") from exc
        if not isinstance(payload, dict) or set(payload) != {"name", "arguments"}:
            raise fail(
                f'Tool call {i + 1} must be {{"name": ..., "arguments": {{...}}}}, got {body!r:.200}'
            )
        spec = specs.get(payload["name"])
        if spec is None:
            raise fail(f"Tool call {i + 1} names {payload['name']!r}, not one of {list(specs)}")
        try:
            validate(payload["arguments"], spec.parameters)
        except ValidationError as exc:
            raise fail(
                f"The arguments of tool call {i + 1} ({spec.name!r}) do not match its "
                f"parameters: {exc.message}"
            ) from exc
        calls.append(ConstrainedToolCall(spec.name, payload["arguments"]))
    if require_call and not calls:
        cut = finish_reason == "length"
        raise fail(
            _cut_message(text, finish_reason, "a tool call")
            if cut
            else f"The output holds no tool call: {text!r:.200}",
            truncated=cut,
        )
    return ToolCallOutput(content=content, tool_calls=calls)


__all__ = [
    "DEFAULT_TOOL_CALL_END",
    "DEFAULT_TOOL_CALL_START",
    "ConstrainedToolCall",
    "Constraint",
    "JsonObjectConstraint",
    "JsonSchemaConstraint",
    "LogitsProcessor",
    "StructuredOutputError",
    "ToolCallMarkers",
    "ToolCallOutput",
    "ToolChoiceConstraint",
    "ToolChoiceMode",
    "ToolSpec",
    "check_json_schema",
    "json_object_processor",
    "json_schema_processor",
    "read_tools",
    "response_format_constraint",
    "tool_call_markers",
    "tool_choice_constraint",
    "tool_choice_processor",
    "validate_json_output",
    "validate_tool_call_output",
]
