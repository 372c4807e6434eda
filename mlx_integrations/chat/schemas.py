"""JSON schemas: checked once, enforced by llguidance, and outputs validated against them."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mlx_integrations.chat.grammar_processor import check_grammar

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# Compact JSON with the separators json.dumps writes (what models see most in training);
# no free whitespace, which a small model can otherwise emit forever.
COMPACT_JSON: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    # Keywords the grammar cannot express (propertyNames, if/then, not...) are left out
    # of it rather than refused: the grammar holds the output to the rest, and the
    # whole schema checks the result (see unenforced_keywords).
    "lenient": True,
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


def check_json_schema(schema: Any, what: str = "The JSON schema") -> dict[str, Any]:
    """Check that ``schema`` is a JSON schema a grammar can be made from; return it.

    Keywords the grammar cannot express do not refuse it: see
    :func:`unenforced_keywords`.

    Args:
        schema: The schema (a dict).
        what: How to name the schema in error messages.

    Raises:
        TypeError: ``schema`` is not a dict.
        ValueError: It is not a valid JSON schema, or llguidance cannot compile it.
    """
    if not isinstance(schema, Mapping):
        raise TypeError(f"{what} must be a dict, got {type(schema).__name__}: {schema!r:.80}")
    schema = dict(schema)
    try:
        key = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError):
        key = None  # not JSON: checked below, and refused there
    if key is not None and key in _checked:
        return schema
    _check_uncached(schema, what, key)
    return schema


def unenforced_keywords(schema: Any) -> tuple[str, ...]:
    """What of ``schema`` (checked with :func:`check_json_schema`) the grammar cannot
    enforce, as llguidance says it (``'Unimplemented keys: ["propertyNames"]'``); empty
    when the grammar holds an output to the whole schema.

    An output constrained by such a schema is checked against the whole schema
    afterwards (a tool call that fails it is an invalid call).
    """
    try:
        key = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError):
        return ()
    if key not in _checked:
        _check_uncached(dict(schema), "The JSON schema", key)
    return _checked.get(key) or ()


def _check_uncached(schema: dict[str, Any], what: str, key: str | None) -> None:
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for
    from llguidance import LLMatcher

    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the top level"
        raise ValueError(f"{what} is not a valid JSON schema (at {where}): {exc.message}") from exc
    try:
        grammar = LLMatcher.grammar_from_json_schema(schema, overrides=COMPACT_JSON)
        warnings = check_grammar(grammar)
    except ValueError as exc:
        raise ValueError(f"{what} cannot be enforced: {exc}") from exc
    if key is not None:
        with _checked_lock:
            _checked[key] = tuple(warnings)
            while len(_checked) > _CHECKED_SIZE:
                _checked.popitem(last=False)


# Schemas already checked, with what their grammar leaves out (compiling one takes
# milliseconds; the same tools come with every call of an agent).
_CHECKED_SIZE = 256
_checked: OrderedDict[str, tuple[str, ...]] = OrderedDict()
_checked_lock = threading.Lock()


def cut_message(text: str, finish_reason: str | None, what: str) -> str:
    """Why a constrained output is incomplete, and what to change."""
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
            cut_message(text, finish_reason, "the JSON value")
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
            cut_message(text, finish_reason, "the number"),
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


def shortest_instance(schema: Any, defs: Mapping[str, Any] | None = None, depth: int = 0) -> Any:
    """A small value valid against ``schema``: what a constrained output must at least
    write (the required properties, the shortest strings and arrays allowed, the first
    of an enum). Keywords it does not know are passed over: it is an estimate of a
    length, not a validator.
    """
    if not isinstance(schema, Mapping) or depth > 16:
        return None
    defs = {**(defs or {}), **schema.get("$defs", {}), **schema.get("definitions", {})}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target = defs.get(ref.rsplit("/", 1)[-1])
        if isinstance(target, Mapping):
            return shortest_instance(target, defs, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return min(schema["enum"], key=lambda v: len(json.dumps(v)))
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            values = [shortest_instance(o, defs, depth + 1) for o in options]
            return min(values, key=lambda v: len(json.dumps(v)))
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind is None and ("properties" in schema or "required" in schema):
        kind = "object"
    if kind == "object":
        props = schema.get("properties") or {}
        return {
            name: shortest_instance(props.get(name, {}), defs, depth + 1)
            for name in schema.get("required") or []
        }
    if kind == "array":
        items = schema.get("items") if isinstance(schema.get("items"), Mapping) else {}
        return [shortest_instance(items, defs, depth + 1)] * int(schema.get("minItems") or 0)
    if kind == "string":
        return "x" * int(schema.get("minLength") or 0)
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        return low if isinstance(low, (int, float)) and not isinstance(low, bool) else 0
    if kind == "boolean":
        return False
    return None
