"""LlamaIndex chat messages to neutral chat messages."""

from __future__ import annotations

from collections.abc import Sequence
from io import IOBase
from typing import Any

from llama_index.core.base.llms.types import (
    AudioBlock,
    ChatMessage,
    DocumentBlock,
    ImageBlock,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    VideoBlock,
)
from llama_index.core.utils import resolve_binary

from mlx_integrations.chat.media_parts import MediaKind, data_url, media_part
from mlx_integrations.engine.vision.media import MediaLimits, MiB

_ROLES = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
    MessageRole.TOOL: "tool",
    MessageRole.FUNCTION: "tool",
}


def _parts(
    message: ChatMessage, where: str, max_bytes: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning = ""
    for block in message.blocks:
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolCallBlock):
            # A JSON string is decoded later; a malformed one is kept as raw text.
            args = block.tool_kwargs
            calls.append(
                {
                    "id": block.tool_call_id or "",
                    "type": "function",
                    "function": {"name": block.tool_name, "arguments": args},
                }
            )
        elif isinstance(block, ThinkingBlock):
            # Earlier thinking goes as reasoning_content: a template that renders it
            # (Qwen3's, for the turns since the last question) shows it, others drop it.
            reasoning += block.content or ""
        elif isinstance(block, ImageBlock):
            source = block.path or block.url
            image, mime = block.image, block.image_mimetype
            parts.append(_media(where, "image", image, source, mime, max_bytes))
        elif isinstance(block, VideoBlock):
            source = block.path or block.url
            video, mime = block.video, block.video_mimetype
            parts.append(_media(where, "video", video, source, mime, max_bytes))
        elif isinstance(block, (AudioBlock, DocumentBlock)):
            raise ValueError(
                f"{where} holds a {type(block).__name__}, but MLXLLM sends models text, "
                "images and video only; remove it (or give its text as a TextBlock)"
            )
        else:
            raise ValueError(
                f"{where} holds a {type(block).__name__}, which MLXLLM cannot send to a "
                "model; use TextBlock, ImageBlock or VideoBlock content"
            )
    return parts, calls, reasoning


def _media(
    where: str, kind: MediaKind, data: Any, source: Any, mime_type: str | None, max_bytes: int
) -> dict[str, str]:
    """The neutral part of an ``ImageBlock`` / ``VideoBlock``: its bytes as a ``data:``
    URL, else its path or URL as given (the engine reads or fetches it). A stream is
    read to at most ``max_bytes``."""
    where = f"{where} ({kind} block)"
    if isinstance(data, IOBase):
        if data.seekable():
            data.seek(0)
        data = data.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise ValueError(
                f"{where} holds a stream of more than {max_bytes / MiB:.3g} MiB, the "
                f"engine's limit for one {kind}; shrink it or raise the engine option "
                "max_media_mb"
            )
    if data:
        # The block keeps bytes given to it as base64 (and any stream as it came).
        encoded = resolve_binary(raw_bytes=bytes(data), as_base64=True).read()
        return media_part(kind, data_url(kind, encoded.decode("ascii"), mime_type, where), where)
    if source is None:
        raise ValueError(f"{where} has no data, path or url; give one of them")
    return media_part(kind, str(source), where)


def to_neutral_messages(
    messages: Sequence[ChatMessage], max_media_bytes: int = MediaLimits.max_bytes
) -> list[dict[str, Any]]:
    """Convert LlamaIndex messages for ``engine.stream_chat``.

    Args:
        messages: The conversation.
        max_media_bytes: Most bytes read from an image or video block's stream (the
            engine's ``max_media_mb``).

    Raises:
        ValueError: an unknown role or an unsupported block, naming it.
    """
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = _ROLES.get(message.role)
        if role is None:
            raise ValueError(
                f"{where} has role {message.role!r}, which MLXLLM does not know; use "
                "system, user, assistant or tool"
            )
        parts, calls, reasoning = _parts(message, where, max_media_bytes)
        extra = message.additional_kwargs or {}
        # OpenAI-style calls kept in kwargs, when the message has no ToolCallBlocks.
        for call in [] if calls else extra.get("tool_calls") or []:
            fn = call.get("function", call) if isinstance(call, dict) else None
            if fn:
                calls.append({"id": call.get("id", ""), "type": "function", "function": fn})
        item: dict[str, Any] = {"role": role, "content": parts}
        if role == "assistant" and calls:
            item["tool_calls"] = calls
        if role == "assistant" and reasoning:
            item["reasoning_content"] = reasoning
        if role == "tool":
            item["tool_call_id"] = str(extra.get("tool_call_id") or "")
            if extra.get("name"):
                item["name"] = str(extra["name"])
        out.append(item)
    return out
