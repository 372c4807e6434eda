"""Reading request bodies: each field checked for its type, errors naming the field.

Shared by the OpenAI and Anthropic translators, with the sampling fields both speak
and the chat-core request they end in.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Mapping
from typing import Any

from mlx_integrations.serve.errors import APIError

__all__ = ["Body", "new_id", "now"]


def new_id(prefix: str) -> str:
    """A unique id such as ``chatcmpl-1f3a...``."""
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def now() -> int:
    """Seconds since the epoch, as the APIs' ``created`` fields."""
    return int(time.time())


def parse_json(raw: bytes) -> dict[str, Any]:
    """A request's JSON object.

    Raises:
        APIError: 400 for a body that is not a JSON object.
    """
    if not raw.strip():
        raise APIError(400, "The request body is empty; send a JSON object")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"The request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise APIError(400, f"The request body must be a JSON object, got {type(data).__name__}")
    return data


_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    list: "an array",
    dict: "an object",
}


class Body:
    """A request's JSON object, read field by field.

    Every getter returns the field's value (or ``default`` when absent or null) and
    raises ``APIError(400, param=name)`` for a value of the wrong type, so a bad field
    is named in the answer. :meth:`unknown` lists the fields no getter read.
    """

    def __init__(self, data: Mapping[str, Any], prefix: str = ""):
        self.data = dict(data)
        self._prefix = prefix
        self._read: set[str] = set()

    def _name(self, name: str) -> str:
        return f"{self._prefix}{name}"

    def has(self, name: str) -> bool:
        self._read.add(name)
        return self.data.get(name) is not None

    def raw(self, name: str, default: Any = None) -> Any:
        """The value as sent."""
        self._read.add(name)
        value = self.data.get(name)
        return default if value is None else value

    def get(self, name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        value = self.raw(name)
        if value is None:
            return default
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if not ok:
            wanted = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
            raise self.error(name, f"must be {wanted}, got {json.dumps(value)[:80]}")
        if isinstance(value, float) and not math.isfinite(value):
            raise self.error(name, f"must be a finite number, got {value}")
        return value

    def text(self, name: str, default: str | None = None) -> Any:
        return self.get(name, str, default)

    def integer(self, name: str, default: int | None = None, *, low: int | None = None) -> Any:
        value = self.get(name, int, default)
        if value is not None and low is not None and value < low:
            raise self.error(name, f"must be >= {low}, got {value}")
        return value

    def number(self, name: str, default: float | None = None) -> Any:
        return self.get(name, float, default)

    def flag(self, name: str, default: bool | None = None) -> Any:
        return self.get(name, bool, default)

    def array(self, name: str, default: list[Any] | None = None) -> Any:
        return self.get(name, list, default)

    def obj(self, name: str, default: dict[str, Any] | None = None) -> Any:
        return self.get(name, dict, default)

    def required(self, name: str, kind: type | tuple[type, ...]) -> Any:
        value = self.get(name, kind)
        if value is None:
            raise self.error(name, "is required")
        return value

    def error(self, name: str, what: str) -> APIError:
        """A 400 naming the field: ``"'temperature' must be a number, got "hot""``."""
        full = self._name(name)
        return APIError(400, f"{full!r} {what}", param=full)

    def refuse(self, name: str, why: str, allowed: tuple[Any, ...] = (False,)) -> None:
        """Refuse a field set to anything but absent, null or one of ``allowed``."""
        value = self.raw(name)
        if value is not None and not any(
            value is a or (value == a and type(value) is type(a)) for a in allowed
        ):
            raise self.error(name, why)

    def unknown(self) -> list[str]:
        """Fields sent that no getter read."""
        return sorted(set(self.data) - self._read)


def stop_list(body: Body, name: str) -> list[str] | None:
    """``stop`` as one string or a list of strings."""
    value = body.raw(name)
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise body.error(name, "must be a string or an array of strings")
    if any(s == "" for s in value):
        raise body.error(name, "must not hold empty strings")
    return value or None


def sampling_options(body: Body) -> dict[str, Any]:
    """The engine options a request may set beside temperature and top_p: ``seed``,
    ``top_k``, ``min_p``, penalties, ``logit_bias`` (extensions that vLLM also takes),
    ``chat_template_kwargs``."""
    options: dict[str, Any] = {}
    for name in ("seed", "top_k"):
        value = body.integer(name)
        if value is not None:
            options[name] = value
    for name in ("min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
        value = body.number(name)
        if value is not None:
            options[name] = value
    bias = body.obj("logit_bias")
    if bias:
        options["logit_bias"] = bias
    template_kwargs = body.obj("chat_template_kwargs")
    if template_kwargs:
        options["chat_template_kwargs"] = template_kwargs
        if "enable_thinking" in template_kwargs:
            options["enable_thinking"] = bool(template_kwargs["enable_thinking"])
    return options
