"""Constrained decoding: JSON schema, JSON mode, grammars and tool choice, with llguidance.

A :class:`Constraint` describes what the output must look like; it is checked when it
is made (a bad schema or tool fails here, before any generation) and turned into a
logits processor per request with :meth:`Constraint.make_processor`. Processors are
stateful and single-use, so make a new one for every request.

Tool calls are forced in the layout of the model's own family (its
:class:`~mlx_integrations.chat.tool_formats.ToolFormat` writes the grammar).

Examples:
    >>> import asyncio
    >>> from mlx_integrations.engine import SimpleEngine
    >>> from mlx_integrations.chat.constraints import JsonSchemaConstraint
    >>> from mlx_integrations.chat.schemas import validate_json_output
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mlx_integrations.chat import lark
from mlx_integrations.chat.grammar_processor import GrammarLogitsProcessor, TokenBanProcessor
from mlx_integrations.chat.schemas import COMPACT_JSON, check_json_schema
from mlx_integrations.chat.tool_formats import ToolFormat, detect_format
from mlx_integrations.chat.tools import ToolChoiceMode, ToolRequest, closed_schema

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

LogitsProcessor = Callable[[Any, Any], Any]
"""``fn(tokens: mx.array, logits: mx.array) -> mx.array``, run on the model's owner thread."""


class Constraint(ABC):
    """What a generation must look like; makes one logits processor per request."""

    @abstractmethod
    def grammar(self, tokenizer: Any) -> str:
        """The llguidance grammar of this constraint for the given tokenizer."""

    def lark_body(self, tokenizer: Any) -> str | None:
        """Lark rules defining ``body``, the constrained output, or None when there are none."""
        return None

    def make_processor(
        self, tokenizer: Any, reasoning_end: str | None = None, reasoning_start: str | None = None
    ) -> LogitsProcessor:
        """A fresh, single-use logits processor for one request.

        Args:
            tokenizer: The model's tokenizer (mlx-lm ``TokenizerWrapper``), e.g.
                ``engine.tokenizer``.
            reasoning_end: The prompt opened a thinking block that this marker closes:
                the model thinks freely first, and the constraint holds after the marker.
            reasoning_start: With ``reasoning_end``: the prompt opened no block, but the
                model may open one with this marker first (a template that thinks
                when asked, such as Qwen3's); the constraint holds after it closes.
        """
        return GrammarLogitsProcessor(
            tokenizer, self._grammar(tokenizer, reasoning_end, reasoning_start)
        )

    def _grammar(
        self, tokenizer: Any, reasoning_end: str | None, reasoning_start: str | None = None
    ) -> str:
        from llguidance import LLMatcher

        body = self.lark_body(tokenizer) if reasoning_end else None
        if body is None or reasoning_end is None:
            return self.grammar(tokenizer)
        return LLMatcher.grammar_from_lark(
            f"{thinking_rules(tokenizer, reasoning_end, reasoning_start, 'body')}\n{body}"
        )


def thinking_rules(tokenizer: Any, end_marker: str, start_marker: str | None, then: str) -> str:
    """Lark rules of a ``start`` that thinks first, then goes on with the rule ``then``.

    Without ``start_marker`` the prompt opened the thinking block; with it the block is
    optional and opens with that marker.
    """
    end = lark.marker_pieces(tokenizer, end_marker)
    lazy = "[lazy]" if isinstance(end[0], str) else ""
    thinking = f"thinking{lazy}: /(?s:.*)/ {lark.seq(end)}"
    # A few blank characters between the thinking and the answer (templates write
    # "\n\n"), not a free run: a model must not spend its tokens there.
    gap = "/[ \\t\\n]{0,6}/"
    if start_marker is None:
        return f"start: thinking {gap} {then}\n{thinking}"
    opening = lark.seq(lark.marker_pieces(tokenizer, start_marker))
    return f"start: (opening {gap})? {then}\nopening: {opening} thinking\n{thinking}"


@dataclass(frozen=True)
class JsonSchemaConstraint(Constraint):
    """The output is one JSON value valid against ``schema``.

    Give strings a ``maxLength`` or ``enum`` where a small model may ramble: the
    grammar keeps the value valid, but only the model decides when a free string ends.

    Examples:
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

        return LLMatcher.grammar_from_json_schema(self.schema, overrides=self._options)

    @property
    def _options(self) -> JsonCompileOptions:
        return {"whitespace_flexible": True} if self.whitespace_flexible else COMPACT_JSON

    def lark_body(self, tokenizer: Any) -> str | None:
        return f"body: %json {json.dumps({**self.schema, 'x-guidance': self._options})}"


@dataclass(frozen=True)
class JsonObjectConstraint(Constraint):
    """The output is one JSON object (OpenAI's ``response_format={"type": "json_object"}``)."""

    whitespace_flexible: bool = False

    def grammar(self, tokenizer: Any = None) -> str:
        return self._as_schema().grammar()

    def lark_body(self, tokenizer: Any) -> str | None:
        return self._as_schema().lark_body(tokenizer)

    def _as_schema(self) -> JsonSchemaConstraint:
        return JsonSchemaConstraint({"type": "object"}, self.whitespace_flexible)


@dataclass(frozen=True)
class LarkConstraint(Constraint):
    """The output follows a grammar in llguidance's Lark dialect.

    For formats that are neither JSON nor tool calls, e.g. the ``Thought:/Action:``
    lines a ReAct agent parses. ``%json {...}`` inside the grammar embeds a JSON schema.

    Examples:
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

    def _grammar(
        self, tokenizer: Any, reasoning_end: str | None, reasoning_start: str | None = None
    ) -> str:
        if reasoning_end is None:
            return self.grammar(tokenizer)
        # The user's grammar has its own ``start``: it becomes a named sub-grammar that
        # follows the thinking block, so its rule names never clash with ours.
        thinking = thinking_rules(tokenizer, reasoning_end, reasoning_start, "@user_grammar")
        return json.dumps(
            {
                "grammars": [
                    {"lark_grammar": thinking},
                    {"name": "user_grammar", "lark_grammar": self.lark},
                ]
            }
        )


@dataclass(frozen=True)
class ToolChoiceConstraint(Constraint):
    """Tool calls as the request's ``tool_choice`` asks, in the family's own layout.

    Each call is valid against its tool's schema (closed objects, non-empty required
    strings). ``auto`` leaves text free and holds a call, once opened, to the layout;
    ``required`` and a named tool make the reply calls only; ``none`` bans the start
    marker.

    Examples:
        >>> from mlx_integrations.chat.tools import read_tool_request
        >>> tools = [{"type": "function", "function": {
        ...     "name": "get_weather",
        ...     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
        ...                    "required": ["city"]}}}]
        >>> request = read_tool_request(tools, "required", parallel=False)
        >>> constraint = ToolChoiceConstraint(request)
        >>> out = await engine.chat(messages, tools=tools, logits_processors=[
        ...     constraint.make_processor(engine.tokenizer)])  # doctest: +SKIP

    Attributes:
        request: The tools and the choice, checked.
        format: The tool-call family; None detects it from the tokenizer.
    """

    request: ToolRequest
    format: ToolFormat | None = field(default=None, compare=False)

    def resolved_format(self, tokenizer: Any) -> ToolFormat:
        """The family in use with this tokenizer."""
        return self.format if self.format is not None else detect_format(tokenizer)

    def make_processor(  # type: ignore[override]
        self, tokenizer: Any, reasoning_end: str | None = None, reasoning_start: str | None = None
    ) -> LogitsProcessor | None:
        """A fresh processor, or None when nothing needs enforcing.

        None comes for ``auto`` and ``none`` on families whose calls have no start
        marker (a pythonic list or bare JSON at the start of the reply).
        """
        fmt = self.resolved_format(tokenizer)
        mode = self.request.mode
        if mode is ToolChoiceMode.NONE:
            pieces = lark.marker_pieces(tokenizer, fmt.start)
            if not pieces:
                return None
            if isinstance(pieces[0], int):
                # The marker opens with a special token: banning it is enough, and cheap.
                return TokenBanProcessor([pieces[0]])
        elif mode is ToolChoiceMode.AUTO and not fmt.forced_start:
            return None
        return GrammarLogitsProcessor(
            tokenizer, self._grammar(tokenizer, reasoning_end, reasoning_start)
        )

    def lark_body(self, tokenizer: Any) -> str | None:
        if not self.request.forced:
            return None  # free text: nothing to hold after the thinking
        fmt = self.resolved_format(tokenizer)
        calls = fmt.calls_grammar(tokenizer, self.request.callable_tools, self.request.parallel)
        start = lark.seq(lark.marker_pieces(tokenizer, fmt.forced_start))
        return f"body: {start} calls\n{calls}"

    def grammar(self, tokenizer: Any) -> str:
        from llguidance import LLMatcher

        fmt = self.resolved_format(tokenizer)
        mode = self.request.mode
        if mode is ToolChoiceMode.NONE:
            first = lark.marker_pieces(tokenizer, fmt.start)[:1]
            text = r"/(.|\n)*/"
            if first and isinstance(first[0], str):
                text = f"/(?s:.*)/ & ~(/(?s:.*)/ {lark.lit(first[0])} /(?s:.*)/)"
            return LLMatcher.grammar_from_lark(f"start: TEXT\nTEXT: {text}")
        body = self.lark_body(tokenizer)
        if body is not None:
            return LLMatcher.grammar_from_lark(f"start: body\n{body}")
        calls = fmt.calls_grammar(tokenizer, self.request.callable_tools, self.request.parallel)
        start = lark.marker_pieces(tokenizer, fmt.forced_start)
        if not start:  # calls without a marker cannot be told from text as they begin
            return LLMatcher.grammar_from_lark("start: TEXT\nTEXT: /(.|\\n)*/")
        if isinstance(start[0], int):
            rules = f"start: TEXT | TEXT {lark.seq(start)} calls\nTEXT: /(.|\\n)*/\n"
        else:
            # A text marker: free text ends at the first occurrence of the marker.
            rules = (
                f"start: TEXT | opening {lark.seq(start[1:])} calls\n"
                f"opening[lazy]: TEXT {lark.seq(start[:1])}\n"
                "TEXT: /(.|\\n)*/\n"
            )
        return LLMatcher.grammar_from_lark(rules + calls)


@dataclass(frozen=True)
class ToolOrAnswerConstraint(Constraint):
    """Tool calls in the family's own layout, or the JSON answer of a response format.

    A request may offer tools (``tool_choice`` auto) and ask for a structured answer at
    once, as an agent with tools and a ``response_format`` does: each turn the model
    either calls tools (valid against their schemas) or writes the answer, never text
    between the two.

    Attributes:
        request: The tools and the choice, checked.
        answer: The answer's constraint (:class:`JsonSchemaConstraint` or
            :class:`JsonObjectConstraint`).
        format: The tool-call family; None detects it from the tokenizer.
    """

    request: ToolRequest
    answer: JsonSchemaConstraint | JsonObjectConstraint
    format: ToolFormat | None = field(default=None, compare=False)

    def lark_body(self, tokenizer: Any) -> str | None:
        fmt = self.format if self.format is not None else detect_format(tokenizer)
        calls = fmt.calls_grammar(tokenizer, self.request.callable_tools, self.request.parallel)
        start = lark.seq(lark.marker_pieces(tokenizer, fmt.forced_start))
        answer = self.answer.lark_body(tokenizer)
        assert answer is not None and answer.startswith("body:")
        return (
            f"body: called_tools | json_answer\ncalled_tools: {start} calls\n"
            f"json_answer:{answer[len('body:') :]}\n{calls}"
        )

    def grammar(self, tokenizer: Any) -> str:
        from llguidance import LLMatcher

        return LLMatcher.grammar_from_lark(f"start: body\n{self.lark_body(tokenizer)}")


def constraint_processors(
    tokenizer: Any,
    tool_format: ToolFormat,
    tools: ToolRequest,
    answer: Constraint | None,
    reasoning_end: str | None = None,
    reasoning_start: str | None = None,
) -> list[LogitsProcessor]:
    """The logits processors that enforce a response format or the tool choice.

    A JSON response format beside tools the model may call (``auto``) admits either
    tool calls or the answer (:class:`ToolOrAnswerConstraint`); a forced call wins
    over a response format (the answer comes on a later turn).

    Args:
        tokenizer: The model's tokenizer (``engine.tokenizer``).
        tool_format: The model's tool-call family.
        tools: The request's tools and tool choice.
        answer: The constraint of the request's response format
            (:func:`format_constraint`), or None.
        reasoning_end: The rendered prompt opened a thinking block that this marker
            closes: the constraint holds after it.
        reasoning_start: With ``reasoning_end``: no block is open, but the model may
            open one with this marker first.

    Raises:
        ValueError: A constraint is asked for but the tokenizer cannot take one.
    """
    constraint = answer
    if tools.tools and tools.forced:
        constraint = ToolChoiceConstraint(tools, tool_format)
    elif (
        isinstance(constraint, (JsonSchemaConstraint, JsonObjectConstraint))
        and tools.tools
        and tools.mode is ToolChoiceMode.AUTO
    ):
        constraint = ToolOrAnswerConstraint(tools, constraint, tool_format)
    # Otherwise calls in auto mode are not constrained: the model writes them as it
    # learnt to (key order, spacing), and the family's parser reads them.
    if constraint is None:
        return []
    if not can_constrain(tokenizer):
        raise ValueError(
            "tool_choice / response_format need constrained decoding, which needs the "
            "model's tokenizer with an end-of-sequence token; this engine exposes none"
        )
    processor = constraint.make_processor(tokenizer, reasoning_end, reasoning_start)
    return [processor] if processor is not None else []


def can_constrain(tokenizer: Any) -> bool:
    """A grammar needs a real tokenizer with an end-of-sequence token."""
    if tokenizer is None or not hasattr(tokenizer, "encode"):
        return False
    return bool(getattr(tokenizer, "eos_token_ids", None)) or (
        getattr(tokenizer, "eos_token_id", None) is not None
    )


def format_constraint(response_format: Any) -> Constraint | None:
    """The constraint an OpenAI-style ``response_format`` asks for, its objects closed
    (no properties beyond those listed, as OpenAI's strict mode); None for free text.

    Raises:
        TypeError / ValueError: As :func:`response_format_constraint`.
    """
    return response_format_constraint(_closed_response_format(response_format))


def _closed_response_format(response_format: Any) -> Any:
    if not isinstance(response_format, Mapping):
        return response_format
    spec = response_format.get("json_schema")
    if response_format.get("type") == "json_schema" and isinstance(spec, Mapping):
        return {
            **response_format,
            "json_schema": {**spec, "schema": closed_schema(spec.get("schema"))},
        }
    return response_format


def format_instructions(response_format: Any, tools: bool = False) -> str | None:
    """What to tell the model about the JSON it must write (None: nothing).

    With ``tools`` the model may call them first: the JSON is its final answer.
    """
    if not isinstance(response_format, Mapping):
        return None
    kind = response_format.get("type")
    first = "Call a tool if you need one. " if tools else ""
    if kind == "json_object":
        return f"{first}Answer with a single JSON object and nothing else."
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema") or {}
        return (
            f"{first}Answer with a single JSON object and nothing else. It must follow "
            f"this JSON schema:\n{json.dumps(schema, ensure_ascii=False)}"
        )
    return None


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
        raise TypeError(
            f"response_format must be a dict such as {{'type': 'json_object'}} or "
            "{'type': 'json_schema', 'json_schema': {'schema': {...}}}, got "
            f"{type(response_format).__name__}: {response_format!r:.80}"
        )
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


__all__ = [
    "Constraint",
    "JsonObjectConstraint",
    "JsonSchemaConstraint",
    "LarkConstraint",
    "LogitsProcessor",
    "ToolChoiceConstraint",
    "ToolOrAnswerConstraint",
    "check_json_schema",
    "constraint_processors",
    "format_constraint",
    "format_instructions",
    "response_format_constraint",
]
