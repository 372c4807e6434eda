"""LangChain messages to neutral chat messages, and engine events back to LangChain."""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.tool import InvalidToolCall as LCInvalidToolCall
from langchain_core.messages.tool import ToolCall as LCToolCall
from langchain_core.messages.tool import ToolCallChunk
from langchain_core.messages.tool import tool_call_chunk as make_tool_call_chunk

from mlx_integrations.chat.media_parts import MediaKind, data_url, media_kind_of, media_part
from mlx_integrations.chat.tool_formats import InvalidToolCall, ParsedToolCall

_SKIPPED_BLOCKS = {
    "reasoning",
    "thinking",
    "tool_use",
    "tool_call",
    "tool_call_chunk",
    "invalid_tool_call",
    "function_call",
    "server_tool_call",
}
_MEDIA_BLOCKS = {"image", "image_url", "input_image", "video", "video_url"}

# Blocks of media that no engine here takes, with what to say about them.
_UNSUPPORTED_MEDIA = {
    "audio": "audio",
    "input_audio": "audio",
    "file": "files",
    "input_file": "files",
    "pdf": "PDF files",
}


def _url_field(value: Any) -> Any:
    """The URL of an OpenAI-style ``image_url`` / ``video_url`` value: a dict or a string."""
    return value.get("url") if isinstance(value, dict) else value


def _standard_source(block: dict[str, Any], kind: MediaKind, where: str) -> Any:
    """The source of a standard ``image`` / ``video`` block, in its v1 form
    (``base64`` / ``url`` / ``file_id``), its older ``source_type`` form, or Anthropic's
    ``source`` dict."""
    source = block.get("source")
    if isinstance(source, dict):
        block = {
            "source_type": "id" if source.get("type") == "file" else source.get("type"),
            "data": source.get("data"),
            "url": source.get("url"),
            "id": source.get("file_id"),
            "mime_type": source.get("media_type"),
        }
    source_type = block.get("source_type")
    mime = block.get("mime_type")
    if source_type is not None:
        if source_type == "base64":
            return data_url(kind, block.get("data"), mime, where)
        if source_type == "url":
            return block.get("url")
        if source_type == "id":
            raise ValueError(_file_id_error(kind, where, block.get("id")))
        raise ValueError(
            f"{where} has a {kind} block with source_type {source_type!r}; use 'base64' "
            "(with 'data') or 'url' (with 'url')"
        )
    if block.get("base64") is not None:
        return data_url(kind, block["base64"], mime, where)
    if block.get("url") is not None:
        return block["url"]
    if block.get("file_id") is not None:
        raise ValueError(_file_id_error(kind, where, block["file_id"]))
    raise ValueError(
        f"{where} has a {kind} block with neither 'base64' nor 'url'; give "
        f'{{"type": "{kind}", "url": ...}} (a path or URL) or '
        f'{{"type": "{kind}", "base64": ..., "mime_type": ...}}'
    )


def _file_id_error(kind: str, where: str, file_id: Any) -> str:
    return (
        f"{where} refers to a {kind} by provider file id {file_id!r}, which a local model "
        f"cannot look up; give the {kind} as a path, a URL or base64 data instead"
    )


def _media_block(block: dict[str, Any], where: str) -> dict[str, str]:
    """The neutral image / video part of a LangChain media block, in any documented form."""
    kind = block["type"]
    if kind == "image_url":
        return media_part("image", _url_field(block.get("image_url")), where)
    if kind == "video_url":
        return media_part("video", _url_field(block.get("video_url")), where)
    if kind == "input_image":  # OpenAI Responses
        if block.get("image_url") is None and block.get("file_id") is not None:
            raise ValueError(_file_id_error("image", where, block["file_id"]))
        return media_part("image", _url_field(block.get("image_url")), where)
    assert kind in ("image", "video")
    return media_part(kind, _standard_source(block, kind, where), where)


def _content_parts(content: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TypeError(f"{where}.content must be a string or a list of blocks, got {content!r}")
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        if isinstance(block, str):
            parts.append({"type": "text", "text": block})
            continue
        if not isinstance(block, dict):
            raise TypeError(f"{where} has a content block {block!r}; expected a dict or a string")
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind in _SKIPPED_BLOCKS:
            continue  # carried by tool_calls / not shown to the model again
        elif kind in _MEDIA_BLOCKS:
            parts.append(_media_block(block, f"{where}.content[{j}]"))
        elif kind in _UNSUPPORTED_MEDIA:
            raise ValueError(
                f"{where}.content[{j}] is a {kind!r} block, but ChatMLX sends models text, "
                f"images and video, not {_UNSUPPORTED_MEDIA[kind]}; remove it (or give its "
                "text content as a text block)"
            )
        else:
            raise ValueError(
                f"{where} has a content block of unsupported type {kind!r}; "
                "use text, image or video blocks"
            )
    return parts


def to_neutral_messages(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    """Convert LangChain messages for ``engine.stream_chat``.

    Raises:
        TypeError / ValueError: an unsupported message or content type, naming it.
    """
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}] ({type(msg).__name__})"
        if isinstance(msg, SystemMessage):
            out.append({"role": "system", "content": _content_parts(msg.content, where)})
        elif isinstance(msg, HumanMessage):
            item: dict[str, Any] = {"role": "user", "content": _content_parts(msg.content, where)}
            if msg.name:
                item["name"] = msg.name
            out.append(item)
        elif isinstance(msg, AIMessage):
            item = {"role": "assistant", "content": _content_parts(msg.content, where)}
            reasoning = _reasoning_of(msg)
            if reasoning:  # a template that renders it shows it; others drop it
                item["reasoning_content"] = reasoning
            if msg.tool_calls:
                item["tool_calls"] = [
                    {
                        "id": call.get("id") or "",
                        "type": "function",
                        "function": {"name": call["name"], "arguments": call.get("args") or {}},
                    }
                    for call in msg.tool_calls
                ]
            out.append(item)
        elif isinstance(msg, ToolMessage):
            content: Any = msg.content
            if not isinstance(content, str):
                parts = _content_parts(content, where)
                # Text alone goes as one string (templates print tool results as text);
                # a result with images keeps its parts, in order, for a vision model.
                if isinstance(parts, str) or not any(media_kind_of(p) for p in parts):
                    content = (
                        parts
                        if isinstance(parts, str)
                        else "".join(p.get("text", "") for p in parts if p["type"] == "text")
                    )
                else:
                    content = parts
            if getattr(msg, "status", "success") == "error":
                content = (
                    f"Error: {content}"
                    if isinstance(content, str)
                    else [{"type": "text", "text": "Error: "}, *content]
                )
            item = {"role": "tool", "tool_call_id": msg.tool_call_id, "content": content}
            if msg.name:
                item["name"] = msg.name
            out.append(item)
        elif isinstance(msg, ChatMessage):
            role = {"human": "user", "ai": "assistant"}.get(msg.role, msg.role)
            out.append({"role": role, "content": _content_parts(msg.content, where)})
        elif isinstance(msg, FunctionMessage):
            out.append(
                {"role": "tool", "tool_call_id": "", "name": msg.name, "content": str(msg.content)}
            )
        else:
            raise TypeError(
                f"{where}: unsupported message type {type(msg).__name__}; use System, Human, "
                "AI, Tool or Chat messages"
            )
    return out


def _reasoning_of(message: AIMessage) -> str:
    """An earlier reply's thinking: v1 ``reasoning`` blocks, else ChatMLX's
    ``additional_kwargs["reasoning_content"]``."""
    if isinstance(message.content, list):
        parts = [
            str(b.get("reasoning") or "")
            for b in message.content
            if isinstance(b, dict) and b.get("type") == "reasoning"
        ]
        if any(parts):
            return "".join(parts)
    reasoning = message.additional_kwargs.get("reasoning_content")
    return reasoning if isinstance(reasoning, str) else ""


def to_lc_tool_call(call: ParsedToolCall) -> LCToolCall:
    return LCToolCall(name=call.name, args=call.arguments, id=call.id, type="tool_call")


def to_lc_invalid_tool_call(call: InvalidToolCall) -> LCInvalidToolCall:
    return LCInvalidToolCall(
        name=call.name, args=call.raw, id=call.id, error=call.error, type="invalid_tool_call"
    )


def tool_call_chunk(call: ParsedToolCall | InvalidToolCall, index: int) -> ToolCallChunk:
    """A streamed ``tool_call_chunk`` carrying a whole call (args as a JSON string).

    A malformed call's raw text goes as a JSON *string*: LangChain parses chunk args
    leniently, and the raw text of a cut-off call would otherwise pass for a valid call
    with the wrong arguments. A string is never a dict, so it stays an invalid call.
    """
    if isinstance(call, ParsedToolCall):
        args = json.dumps(call.arguments, ensure_ascii=False)
    else:
        args = json.dumps(call.raw, ensure_ascii=False)
    return make_tool_call_chunk(name=call.name, args=args, id=call.id, index=index)
