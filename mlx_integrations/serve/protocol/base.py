"""What every protocol model shares: lenient requests, reported fields, error paths.

A request model types strictly the fields the server uses (a wrong type is a 400
naming the field's path) and keeps every other field it is sent, so that real clients,
which send many fields a local server has no use for, are never refused. Those fields,
and the declared ones marked :func:`unused`, are listed by :func:`ignored_fields`
(the server logs them and sends them in the ``x-mlxi-ignored-fields`` header).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Discriminator, Field

__all__ = [
    "IGNORED_HEADER",
    "Fallback",
    "FieldError",
    "ReplyModel",
    "WireModel",
    "field_errors",
    "ignored_fields",
    "other_than",
    "path_of",
    "tagged",
    "unused",
]

IGNORED_HEADER = "x-mlxi-ignored-fields"
"""The response header that lists the request fields the server accepted but did not use."""

_UNUSED = "x-mlxi-unused"
_TAG_ERROR = "invalid_tag:"  # then the name of the field that picks a union's member


class WireModel(BaseModel):
    """A request object: its declared fields strict, any other field kept and reported."""

    model_config = ConfigDict(
        extra="allow", strict=True, populate_by_name=True, use_attribute_docstrings=True
    )


class Fallback(WireModel):
    """A union's member for any other type (a part, block, item or tool): the
    translator refuses it or leaves it out whole, naming it, so nothing inside it is
    reported field by field."""


class ReplyModel(BaseModel):
    """An object the server sends; built by the server, so never validated twice."""

    model_config = ConfigDict(populate_by_name=True, use_attribute_docstrings=True)


def unused(default: Any = None) -> Any:
    """A declared field that the server accepts and does not act on (reported as
    ignored when sent); declared so that the schema shows clients it is welcome."""
    return Field(default=default, json_schema_extra={_UNUSED: True})


def other_than(*taken: str) -> ConfigDict:
    """The config of a union's fallback member (a part, item or tool "of another
    type"): its schema's ``type`` excludes the types the other members take, so a body
    matches exactly one member of the schema's ``oneOf``."""

    def exclude(schema: dict[str, Any]) -> None:
        schema["properties"]["type"]["not"] = {"enum": list(taken)}

    return ConfigDict(
        extra="allow",
        strict=True,
        populate_by_name=True,
        use_attribute_docstrings=True,
        json_schema_extra=exclude,
    )


def tagged(field: str, tags: dict[str | None, str], *, other: str | None = None) -> Any:
    """A discriminator that picks a union's member by the value of ``field``
    (``role``, ``type``): ``tags`` maps each value to its member's tag, ``other`` is
    the member for any other value (None refuses it, naming the values taken).

    The tags hold ``=`` (``type=text``) so that they never read as a key of the data
    in an error's location (see :func:`path_of`).
    """
    first = next(iter(tags.values()))
    taken = ", ".join(repr(k) for k in tags)

    def pick(value: Any) -> str | None:
        if isinstance(value, BaseModel):
            value = {field: getattr(value, field, None)}
        if not isinstance(value, dict):
            return first  # the member says "must be an object"
        return tags.get(value.get(field), other)

    return Discriminator(
        pick,
        custom_error_type=f"{_TAG_ERROR}{field}",
        custom_error_message=f"must be one of {taken}",
    )


def _unused_names(cls: type[BaseModel]) -> dict[str, str]:
    """The model's unused fields: attribute name to the name on the wire."""
    cached = cls.__dict__.get("_mlxi_unused")
    if cached is None:
        cached = {
            name: info.alias or name
            for name, info in cls.model_fields.items()
            if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get(_UNUSED)
        }
        type.__setattr__(cls, "_mlxi_unused", cached)
    return cached


def ignored_fields(model: BaseModel) -> list[str]:
    """The paths of the fields sent that the server does not use, nested ones too
    (``metadata``, ``thinking.display``, ``tools[3].cache_control``): an object's
    declared fields in their order, then the others as sent."""
    return list(_walk(model, ""))


def _walk(value: Any, path: str) -> Iterator[str]:
    if isinstance(value, Fallback):
        return
    if isinstance(value, WireModel):
        cls = type(value)
        unused_names = _unused_names(cls)
        sent = value.model_fields_set
        for name, info in cls.model_fields.items():
            if name not in sent:
                continue
            wire = unused_names.get(name)
            if wire is not None:
                yield _join(path, wire)
            else:
                yield from _walk(getattr(value, name), _join(path, info.alias or name))
        for name in value.model_extra or ():
            yield _join(path, name)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, (WireModel, list)):
                yield from _walk(item, f"{path}[{i}]")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


# --------------------------------------------------------------- error paths


def path_of(loc: Sequence[int | str], data: Any, missing: bool = False) -> str:
    """The field path (``tools[2].function.parameters``) of a validation error's
    location, read against the data that was validated.

    Pydantic's locations also hold the member a union tried (``str``,
    ``list[...]``, a tag such as ``user``); a step is kept only where the data has
    it, so those drop out. ``missing`` keeps a last key the data lacks (a required
    field that was left out).
    """
    parts: list[str] = []
    current = data
    for i, key in enumerate(loc):
        if isinstance(key, int) and isinstance(current, list) and 0 <= key < len(current):
            parts.append(f"[{key}]")
            current = current[key]
        elif isinstance(key, str) and isinstance(current, dict) and key in current:
            parts.append(f".{key}" if parts else key)
            current = current[key]
        elif missing and i == len(loc) - 1 and isinstance(key, str) and isinstance(current, dict):
            parts.append(f".{key}" if parts else key)
    return "".join(parts)


class FieldError:
    """One bad field of a request: its path and what is wrong with it."""

    def __init__(self, path: str, message: str):
        self.path = path
        self.message = message

    def __repr__(self) -> str:
        return f"FieldError({self.path!r}, {self.message!r})"


_TYPE_WORDS = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}


def _phrase(error: dict[str, Any]) -> str:
    """What one pydantic error says, in the words of this server's messages (chosen
    by the error's type, never by its text)."""
    kind = error.get("type", "")
    ctx = error.get("ctx") or {}
    if kind == "missing":
        return "is required"
    if kind in _TYPE_WORDS:
        return f"must be {_TYPE_WORDS[kind]}"
    if kind == "literal_error":
        return f"must be {ctx.get('expected', 'one of the listed values')}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        sign = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<="}
        bound = next(iter(ctx.values()), "")
        return f"must be {sign.get(kind, '<')} {bound}"
    if kind == "finite_number":
        return "must be a finite number"
    if kind == "too_short":
        return "must not be empty"
    if kind.startswith(_TAG_ERROR):
        return str(error.get("msg"))
    if kind == "value_error":
        return str(ctx.get("error") or error.get("msg", "is invalid"))
    return str(error.get("msg", "is invalid")).replace("Input should be", "should be")


def field_errors(errors: Sequence[dict[str, Any]], data: Any) -> list[FieldError]:
    """Pydantic's errors as one :class:`FieldError` per path, in order: the tries of a
    union at one path (a string, or an array of parts) join in one message."""
    by_path: dict[str, list[str]] = {}
    values: dict[str, Any] = {}
    for error in errors:
        path = path_of(error.get("loc", ()), data, missing=error.get("type") == "missing")
        value = error.get("input")
        kind = str(error.get("type", ""))
        if kind.startswith(_TAG_ERROR):  # the field that picks the member
            field = kind.removeprefix(_TAG_ERROR)
            path = f"{path}.{field}" if path else field
            value = value.get(field) if isinstance(value, dict) else value
        phrases = by_path.setdefault(path, [])
        phrase = _phrase(error)
        if phrase not in phrases:
            phrases.append(phrase)
        values.setdefault(path, value)
    # A union's member that got further (an array whose part is bad) says more than
    # the members that failed at the top (not a string): keep the deepest paths.
    deeper = [p for p in by_path if not any(_within(q, p) for q in by_path if q != p)]
    out = []
    for path in deeper:
        phrases = by_path[path]
        words = [p.removeprefix("must be ") for p in phrases]
        if len(phrases) > 1 and all(p.startswith("must be ") for p in phrases):
            what = "must be " + " or ".join(dict.fromkeys(words))
        else:
            what = "; ".join(phrases)
        name = repr(path) if path else "The request body"
        message = f"{name} {what}"
        if phrases != ["is required"] and path:
            message += f", got {_shown(values[path])}"
        out.append(FieldError(path, message))
    return out


def _within(inner: str, outer: str) -> bool:
    """``inner`` is a field inside ``outer`` (``a.b[1]`` inside ``a.b``)."""
    return not outer or (inner.startswith(outer) and inner[len(outer)] in ".[")


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
