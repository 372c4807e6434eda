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

from mlx_integrations.chat.tool_formats import InvalidToolCall, ParsedToolCall

_SKIPPED_BLOCKS = {
    "reasoning",
    "thinking",
    "tool_use",
    "tool_call",
    "function_call",
    "server_tool_call",
}
_MEDIA_BLOCKS = {
    "image",
    "image_url",
    "input_image",
    "audio",
    "input_audio",
    "video",
    "file",
    "pdf",
}


def _content_parts(content: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TypeError(f"{where}.content must be a string or a list of blocks, got {content!r}")
    parts: list[dict[str, Any]] = []
    for block in content:
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
            parts.append({"type": "image" if "image" in str(kind) else str(kind)})
        else:
            raise ValueError(
                f"{where} has a content block of unsupported type {kind!r}; "
                "use text blocks (images need a vision-language model)"
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
            content = msg.content
            if not isinstance(content, str):
                parts = _content_parts(content, where)
                content = (
                    parts
                    if isinstance(parts, str)
                    else "".join(p.get("text", "") for p in parts if p["type"] == "text")
                )
            if getattr(msg, "status", "success") == "error":
                content = f"Error: {content}"
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
