"""Structured output helpers of ChatMLX: plain JSON schemas, wrapped non-object values,
and the check that a reply was not cut off at max_tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.exceptions import OutputParserException
from langchain_core.messages import BaseMessage

_JSON_SCHEMA_KEYS = ("type", "anyOf", "oneOf", "allOf", "enum", "const", "$ref", "properties")


def plain_schema(schema: Any) -> dict[str, Any] | None:
    """A JSON schema dict taken as it is (any top-level type), or None for other forms.

    OpenAI tool dicts, pydantic classes and TypedDicts go through LangChain's converters;
    a plain schema such as ``{"title": "Flag", "type": "boolean"}`` must keep its type.
    """
    if not isinstance(schema, dict) or "function" in schema or "parameters" in schema:
        return None
    return dict(schema) if any(k in schema for k in _JSON_SCHEMA_KEYS) else None


_WRAPPED = "value"


def wrapping_tool(schema: dict[str, Any]) -> dict[str, Any]:
    """A tool whose one argument ``value`` holds a value of a non-object schema."""
    inner = {k: v for k, v in schema.items() if k not in ("title", "description")}
    return {
        "type": "function",
        "function": {
            "name": str(schema.get("title") or "answer"),
            "description": str(schema.get("description") or "Give the answer."),
            "parameters": {
                "type": "object",
                "properties": {_WRAPPED: inner},
                "required": [_WRAPPED],
            },
        },
    }


def unwrap(arguments: Any) -> Any:
    return arguments.get(_WRAPPED) if isinstance(arguments, dict) else arguments


def reject_truncated(messages: Iterator[BaseMessage]) -> Iterator[BaseMessage]:
    """Pass the reply (or its chunks) on; raise where it ended at max_tokens."""
    text = ""
    for message in messages:
        text = _check_complete(message, text)
        yield message


async def areject_truncated(messages: AsyncIterator[BaseMessage]) -> AsyncIterator[BaseMessage]:
    text = ""
    async for message in messages:
        text = _check_complete(message, text)
        yield message


def _check_complete(message: BaseMessage, text: str) -> str:
    """The reply's text so far; an OutputParserException if it was cut off."""
    if isinstance(message.content, str):
        text += message.content
    if message.response_metadata.get("finish_reason") == "length":
        raise OutputParserException(
            "The structured output was cut off at max_tokens before it was complete; "
            "raise max_tokens",
            llm_output=text,
        )
    return text
