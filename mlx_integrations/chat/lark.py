"""Pieces of llguidance Lark grammars: literals, markers, embedded JSON schemas.

A call marker may be one special token in one vocabulary and
plain text in another; :func:`marker_pieces` splits it as the tokenizer reads it so a
grammar names special tokens by id (``<[id]>``) and text as literals.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from mlx_integrations.chat.grammar_processor import hf_tokenizer, llguidance_tokenizer
from mlx_integrations.chat.schemas import COMPACT_JSON

Pieces = list[int | str]


def marker_pieces(tokenizer: Any, marker: str) -> Pieces:
    """Split a marker into special-token ids and text, as the tokenizer reads it."""
    if not marker:
        return []
    ll = llguidance_tokenizer(tokenizer)
    hf = hf_tokenizer(tokenizer)
    ids = hf.encode(marker, add_special_tokens=False)
    pieces: Pieces = []
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


def seq(pieces: Sequence[int | str]) -> str:
    """A Lark sequence of special tokens (by id) and literals; ``""`` for none."""
    return " ".join(
        f"<[{p}]>" if isinstance(p, int) else json.dumps(p, ensure_ascii=False) for p in pieces
    )


def marker(tokenizer: Any, text: str) -> str:
    """The Lark sequence of one marker."""
    return seq(marker_pieces(tokenizer, text))


def lit(text: str) -> str:
    """A Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def json_value(schema: Mapping[str, Any], defs: Mapping[str, Any] | None = None) -> str:
    """An embedded JSON value valid against ``schema``, in compact JSON.

    Args:
        schema: The value's schema.
        defs: ``$defs``/``definitions`` of the document the schema came from, so its
            local references still resolve.
    """
    body = {**schema, **(defs or {}), "x-guidance": COMPACT_JSON}
    return f"%json {json.dumps(body, ensure_ascii=False)}"


def schema_defs(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The local definitions of a schema document."""
    return {k: schema[k] for k in ("$defs", "definitions") if k in schema}


def keyword_arguments(
    tool_properties: Mapping[str, Any],
    required: Sequence[str],
    argument: Any,
    separator: str,
) -> str:
    """Lark for a tool's arguments in schema order: required ones always, others optional.

    Args:
        tool_properties: The argument schemas by name.
        required: The required names.
        argument: ``argument(name, schema) -> str``, the Lark of one argument.
        separator: The Lark between two arguments.

    Returns:
        The Lark expression (``""`` when the tool takes no arguments).
    """
    items = [(argument(name, schema), name in required) for name, schema in tool_properties.items()]
    return _sequence(items, separator)


def _sequence(items: list[tuple[str, bool]], sep: str) -> str:
    # Optional items may be left out anywhere; a separator stands between two present ones.
    if not items:
        return ""
    (head, needed), rest = items[0], items[1:]
    tail_after = _sequence_after(rest, sep)
    with_head = f"{head} {tail_after}".strip()
    if needed:
        return with_head
    without = _sequence(rest, sep)
    if not without:
        return f"({with_head})?"
    if any(n for _, n in rest):
        return f"({with_head} | {without})"
    return f"({with_head} | {without})?"


def _sequence_after(items: list[tuple[str, bool]], sep: str) -> str:
    # What follows a present item: each later item, if present, comes after a separator.
    return " ".join(f"{sep} {item}" if needed else f"({sep} {item})?" for item, needed in items)
