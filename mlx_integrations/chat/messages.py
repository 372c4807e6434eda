"""Neutral chat messages: validation and the form chat templates take.

A message is a dict with ``role`` and ``content`` (a string, or a list of parts
``{"type": "text", "text": ...}``, and for vision-language models
``{"type": "image", "image": source}`` / ``{"type": "video", "video": source}``), and optionally ``tool_calls`` (assistant),
``tool_call_id`` and ``name`` (tool), ``reasoning_content`` (assistant).
"""

from __future__ import annotations

import json
from typing import Any

from mlx_integrations.chat.fields import RequestError, RequestTypeError, checking
from mlx_integrations.chat.media_parts import VISION_MODELS

ROLES = ("system", "developer", "user", "assistant", "tool")
MEDIA_PART_TYPES = {
    "image",
    "image_url",
    "input_image",
    "video",
    "video_url",
    "audio",
    "input_audio",
}


def text_only_error(model_name: str, kind: str = "images") -> str:
    """The message for media sent to a text-only model, naming models that take them."""
    return f"{model_name!r} is a text-only model and does not take {kind}; use {VISION_MODELS}"


def _media_part(part: dict[str, Any], kind: str, index: int) -> dict[str, Any]:
    """A neutral ``{"type": "image", "image": source}`` part (or video) from a part."""
    base = "image" if kind in ("image", "image_url", "input_image") else "video"
    source = part.get(base, part.get(f"{base}_url", part.get("url")))
    if isinstance(source, dict):  # OpenAI's {"image_url": {"url": ...}}
        source = source.get("url")
    if not isinstance(source, str) or not source.strip():
        raise ValueError(
            f"messages[{index}] holds a {kind!r} part without a source: give it as "
            f'{{"type": "{base}", "{base}": "<path, URL, data: URL or base64>"}}'
        )
    return {"type": base, base: source}


def _content_of(content: Any, index: int, model_name: str, role: str, media: bool) -> Any:
    """The message's text, or (media models, media present) its parts in order."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[dict[str, Any]] = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                parts.append({"type": "text", "text": part})
                continue
            with checking(f"messages[{index}].content[{j}]"):
                parts.append(_part(part, index, model_name, role, media))
        if any(p["type"] != "text" for p in parts):
            return [p for p in parts if p["type"] != "text" or p["text"]]
        return "".join(p["text"] for p in parts)
    raise RequestTypeError(
        f"messages[{index}].content must be a string or a list of parts, "
        f"got {type(content).__name__}: {content!r:.100}",
        f"messages[{index}].content",
    )


def _part(part: Any, index: int, model_name: str, role: str, media: bool) -> dict[str, Any]:
    """One content part, neutral; refused where the model or the role cannot take it."""
    if not isinstance(part, dict) or "type" not in part:
        raise TypeError(
            f"messages[{index}].content has a part {part!r:.100}; parts must be strings or "
            'dicts like {"type": "text", "text": "..."}'
        )
    kind = part["type"]
    if kind == "text":
        return {"type": "text", "text": str(part.get("text", ""))}
    if kind not in MEDIA_PART_TYPES:
        raise ValueError(
            f"messages[{index}].content has a part of unknown type {kind!r}; "
            "only 'text', 'image' and 'video' parts are supported"
        )
    if not media:
        what = "videos" if "video" in kind else "images"
        raise ValueError(
            f"messages[{index}] holds a {kind!r} part, but " + (text_only_error(model_name, what))
        )
    if kind in ("audio", "input_audio"):
        raise ValueError(
            f"messages[{index}] holds an {kind!r} part; audio input is not "
            "supported, only images and videos"
        )
    if role not in ("user", "tool"):
        raise ValueError(
            f"messages[{index}] ({role}) holds a {kind!r} part; images and videos "
            "go in user messages (or tool results)"
        )
    return _media_part(part, kind, index)


def media_sources(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The ``(kind, source)`` of every image and video part, in message order."""
    found = []
    for msg in messages:
        if isinstance(msg["content"], list):
            found += [(p["type"], p[p["type"]]) for p in msg["content"] if p["type"] != "text"]
    return found


def message_text(content: Any) -> str:
    """The text of a normalized message's content (media parts left out)."""
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content if p["type"] == "text")


def _normalize_tool_call(call: Any, index: int) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise TypeError(f"messages[{index}].tool_calls holds {call!r:.100}; expected a dict")
    fn = call.get("function", call)
    if not isinstance(fn, dict):
        raise TypeError(
            f"messages[{index}].tool_calls entry {call!r:.120} has 'function' "
            f"{fn!r:.60}; it must be a dict like {{'name': ..., 'arguments': {{...}}}}"
        )
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"messages[{index}].tool_calls entry {call!r:.100} has no function name")
    args = fn.get("arguments", fn.get("args", {}))
    if isinstance(args, str):
        # Templates iterate arguments as a mapping, so decode JSON strings.
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            args = {"_raw": args}
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise TypeError(
            f"messages[{index}].tool_calls entry for {name!r} has arguments {args!r:.80}; "
            "they must be a dict (or a JSON object string)"
        )
    return {
        "id": call.get("id") or "",
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


def normalize_messages(
    messages: Any, model_name: str = "this model", *, media: bool = False
) -> list[dict[str, Any]]:
    """Validate a message list and return plain dicts with string content.

    Args:
        messages: The conversation.
        model_name: Named in error messages.
        media: The model takes images and videos (a vision-language model): a user
            message holding them keeps its content as a list of parts, in order:
            ``{"type": "text", "text": ...}``, ``{"type": "image", "image": source}``,
            ``{"type": "video", "video": source}``. ``image_url`` parts
            (``{"image_url": {"url": ...}}``) become image parts. Other messages keep
            string content.

    Raises:
        ValueError: Empty list, unknown role, media for a text model.
        TypeError: A message or its content has the wrong type.
    """
    if not isinstance(messages, (list, tuple)):
        raise RequestTypeError(
            f"messages must be a list of dicts, got {type(messages).__name__}", "messages"
        )
    if not messages:
        raise RequestError(
            "messages is empty; pass at least one message, e.g. a user message", "messages"
        )
    out = []
    names_by_id: dict[str, str] = {}
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise RequestTypeError(
                f"messages[{i}] must be a dict with 'role' and 'content', got {msg!r:.100}",
                f"messages[{i}]",
            )
        role = msg.get("role")
        if role not in ROLES:
            raise RequestError(
                f"messages[{i}] has unknown role {role!r}; use one of {', '.join(ROLES)}",
                f"messages[{i}].role",
            )
        with checking(f"messages[{i}].content"):
            content = _content_of(msg.get("content"), i, model_name, role, media)
        item: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant":
            calls = msg.get("tool_calls")
            if calls:
                if not isinstance(calls, (list, tuple)):
                    raise RequestTypeError(
                        f"messages[{i}].tool_calls must be a list of calls, got {calls!r:.80}",
                        f"messages[{i}].tool_calls",
                    )
                item["tool_calls"] = []
                for j, call in enumerate(calls):
                    with checking(f"messages[{i}].tool_calls[{j}]"):
                        item["tool_calls"].append(_normalize_tool_call(call, i))
                names_by_id.update(
                    (c["id"], c["function"]["name"]) for c in item["tool_calls"] if c["id"]
                )
            if msg.get("reasoning_content"):
                item["reasoning_content"] = str(msg["reasoning_content"])
        if role == "tool":
            item["tool_call_id"] = str(msg.get("tool_call_id") or "")
            # Templates (Hermes, Qwen) need the tool's name: the call it answers names it.
            name = msg.get("name") or names_by_id.get(item["tool_call_id"])
            if name:
                item["name"] = str(name)
        elif msg.get("name") and role in ("user", "system"):
            item["name"] = str(msg["name"])
        with checking(f"messages[{i}].content"):
            check_text(message_text(item["content"]), f"messages[{i}].content")
        out.append(item)
    return out


def check_text(text: str, where: str) -> str:
    """Reject text the tokenizer cannot encode (a lone surrogate), naming the position.

    Raises:
        ValueError: ``text`` holds a lone UTF-16 surrogate (often a broken decode).
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{where} holds a lone surrogate {text[exc.start]!r} at character {exc.start}, "
            "which is not valid Unicode text; decode the input with errors='replace' or "
            "remove the character"
        ) from None
    return text
