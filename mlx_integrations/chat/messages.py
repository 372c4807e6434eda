"""Neutral chat messages: validation and the form chat templates take.

A message is a dict with ``role`` and ``content`` (a string, or a list of parts
``{"type": "text", "text": ...}``), and optionally ``tool_calls`` (assistant),
``tool_call_id`` and ``name`` (tool), ``reasoning_content`` (assistant).
"""

from __future__ import annotations

import json
from typing import Any

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


def _text_of(content: Any, index: int, model_name: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
                continue
            if not isinstance(part, dict) or "type" not in part:
                raise TypeError(
                    f"messages[{index}].content has a part {part!r}; parts must be strings or "
                    'dicts like {"type": "text", "text": "..."}'
                )
            kind = part["type"]
            if kind == "text":
                texts.append(str(part.get("text", "")))
            elif kind in MEDIA_PART_TYPES:
                raise ValueError(
                    f"messages[{index}] holds a {kind!r} part, but {model_name!r} is a "
                    "text-only model; remove the media or use a vision-language model"
                )
            else:
                raise ValueError(
                    f"messages[{index}].content has a part of unknown type {kind!r}; "
                    "only 'text' parts are supported by text models"
                )
        return "".join(texts)
    raise TypeError(
        f"messages[{index}].content must be a string or a list of parts, "
        f"got {type(content).__name__}: {content!r}"
    )


def _normalize_tool_call(call: Any, index: int) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise TypeError(f"messages[{index}].tool_calls holds {call!r}; expected a dict")
    fn = call.get("function", call)
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"messages[{index}].tool_calls entry {call!r} has no function name")
    args = fn.get("arguments", fn.get("args", {}))
    if isinstance(args, str):
        # Templates iterate arguments as a mapping, so decode JSON strings.
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            args = {"_raw": args}
    if args is None:
        args = {}
    return {
        "id": call.get("id") or "",
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


def normalize_messages(messages: Any, model_name: str = "this model") -> list[dict[str, Any]]:
    """Validate a message list and return plain dicts with string content.

    Raises:
        ValueError: Empty list, unknown role, media for a text model.
        TypeError: A message or its content has the wrong type.
    """
    if not isinstance(messages, (list, tuple)):
        raise TypeError(f"messages must be a list of dicts, got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages is empty; pass at least one message, e.g. a user message")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise TypeError(f"messages[{i}] must be a dict with 'role' and 'content', got {msg!r}")
        role = msg.get("role")
        if role not in ROLES:
            raise ValueError(
                f"messages[{i}] has unknown role {role!r}; use one of {', '.join(ROLES)}"
            )
        item: dict[str, Any] = {
            "role": role,
            "content": _text_of(msg.get("content"), i, model_name),
        }
        if role == "assistant":
            calls = msg.get("tool_calls")
            if calls:
                item["tool_calls"] = [_normalize_tool_call(c, i) for c in calls]
            if msg.get("reasoning_content"):
                item["reasoning_content"] = str(msg["reasoning_content"])
        if role == "tool":
            item["tool_call_id"] = str(msg.get("tool_call_id") or "")
            if msg.get("name"):
                item["name"] = str(msg["name"])
        elif msg.get("name") and role in ("user", "system"):
            item["name"] = str(msg["name"])
        out.append(item)
    return out


def tool_messages_as_text(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rewrite assistant tool calls and tool results as text, for templates without them.

    Calls keep the ``<tool_call>`` form the tool description asks for; a result becomes
    a user turn that names the tool and asks for an answer (small models otherwise
    repeat the call they see just before it).
    """
    out: list[dict[str, Any]] = []
    names_by_id: dict[str, str] = {}
    for msg in messages:
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            for c in msg["tool_calls"]:
                if c.get("id"):
                    names_by_id[c["id"]] = c["function"]["name"]
            calls = "\n".join(
                "<tool_call>"
                + json.dumps(
                    {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                    ensure_ascii=False,
                )
                + "</tool_call>"
                for c in msg["tool_calls"]
            )
            text = f"{msg['content']}\n{calls}" if msg["content"] else calls
            out.append({"role": "assistant", "content": text})
        elif msg["role"] == "tool":
            name = msg.get("name") or names_by_id.get(msg.get("tool_call_id") or "") or "tool"
            tool = name if name == "tool" else f"{name} tool"
            out.append(
                {
                    "role": "user",
                    "content": f"The {tool} returned: {msg['content']}\nUse this result to answer.",
                }
            )
        else:
            out.append({k: v for k, v in msg.items() if k != "tool_call_id"})
    return out
