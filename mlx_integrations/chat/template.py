"""Rendering neutral messages through a model's own chat template.

The template decides what a model sees. We probe once what it can render (tools,
assistant tool calls, the tool role) and adapt: native tool messages when it takes
them, text otherwise; tools described in the system message when it ignores them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from mlx_integrations.chat.messages import tool_messages_as_text

# How a tool call is written (see ``constraints.ToolCallMarkers``): a JSON object between
# markers, one JSON list after the marker (Mistral v0.3), ``name[ARGS]{...}`` or
# ``name[CALL_ID]id[ARGS]{...}`` (newer Mistral tokenizers).
ToolCallLayout = Literal["object", "list", "header", "header_id"]

_PROBE_TOOL = "zq_probe_tool"
_PROBE_RESULT = "zq_probe_result_4417"


@dataclass(frozen=True)
class TemplateCapabilities:
    """What a chat template renders, found by rendering probes."""

    has_template: bool
    renders_tools: bool
    """The ``tools`` argument shows up in the prompt."""
    renders_tool_messages: bool
    """Assistant ``tool_calls`` and ``role="tool"`` messages render natively."""
    short_call_ids: bool = False
    """The template takes only 9-character alphanumeric tool-call ids (Mistral v0.3,
    Nemo, Small 3.x raise on others); ids are shortened when rendering."""
    mistral_layout: ToolCallLayout | None = None
    """How the template writes a call after ``[TOOL_CALLS]`` (see
    :func:`mistral_call_layout`); None for other templates."""


def _render(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **kwargs
    )


def probe_template(tokenizer: Any) -> TemplateCapabilities:
    """Render probe conversations to learn what the template supports."""
    if not getattr(tokenizer, "chat_template", None) and not getattr(
        tokenizer, "has_chat_template", False
    ):
        return TemplateCapabilities(False, False, False)
    tool = {
        "type": "function",
        "function": {
            "name": _PROBE_TOOL,
            "description": "probe",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
        },
    }
    try:
        renders_tools = _PROBE_TOOL in _render(
            tokenizer, [{"role": "user", "content": "hi"}], tools=[tool]
        )
    except Exception:
        renders_tools = False
    renders_tool_messages = _renders_tool_messages(tokenizer, tool, "call_probe_1")
    short_ids = False
    if not renders_tool_messages and _renders_tool_messages(tokenizer, tool, "callprobe"):
        renders_tool_messages = short_ids = True
    template = getattr(tokenizer, "chat_template", None)
    layout = (
        mistral_call_layout(tokenizer)
        if isinstance(template, str) and "[TOOL_CALLS]" in template
        else None
    )
    return TemplateCapabilities(True, renders_tools, renders_tool_messages, short_ids, layout)


def _renders_tool_messages(tokenizer: Any, tool: dict[str, Any], call_id: str) -> bool:
    """True when a tool call and its result, with this id, both show in the prompt."""
    convo: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": _PROBE_TOOL, "arguments": {"x": 1}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "name": _PROBE_TOOL, "content": _PROBE_RESULT},
    ]
    try:
        text = _render(tokenizer, convo, tools=[tool])
    except Exception:
        return False
    return _PROBE_TOOL in text.split("hi", 1)[-1] and _PROBE_RESULT in text


def mistral_call_layout(tokenizer: Any) -> ToolCallLayout | None:
    """How a Mistral template writes a tool call after ``[TOOL_CALLS]``.

    Returns:
        ``"list"`` (``[{"name": ..., "arguments": ...}]``, v0.3), ``"header"``
        (``name[ARGS]{...}``), ``"header_id"`` (``name[CALL_ID]id[ARGS]{...}``), or None
        when the template writes no ``[TOOL_CALLS]`` call.
    """
    call = {
        "id": "abcDEF123",  # 9 alphanumerics: the strictest templates take it
        "type": "function",
        "function": {"name": _PROBE_TOOL, "arguments": {"x": 1}},
    }
    convo = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    try:
        text = tokenizer.apply_chat_template(convo, tokenize=False, add_generation_prompt=False)
    except Exception:
        return None
    if "[TOOL_CALLS]" not in text:
        return None
    after = text.rsplit("[TOOL_CALLS]", 1)[1].lstrip()
    if after.startswith("["):
        return "list"
    if after.startswith(_PROBE_TOOL):
        return "header_id" if "[CALL_ID]" in after.split("[ARGS]", 1)[0] else "header"
    return None


def short_call_id(call_id: str) -> str:
    """A 9-character alphanumeric id standing for ``call_id`` (the same one each time).

    Example:
        >>> short_call_id("call_0123456789abcdef"), short_call_id("abcDEF123")
        ('aff2e571f', 'abcDEF123')
    """
    if len(call_id) == 9 and call_id.isascii() and call_id.isalnum():
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


def shorten_call_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages whose tool-call ids (calls and results alike) are :func:`short_call_id`."""
    out = []
    for msg in messages:
        if msg.get("tool_calls"):
            msg = dict(msg)
            msg["tool_calls"] = [
                {**call, "id": short_call_id(str(call.get("id") or ""))}
                for call in msg["tool_calls"]
            ]
        elif msg.get("role") == "tool" and "tool_call_id" in msg:
            msg = {**msg, "tool_call_id": short_call_id(str(msg.get("tool_call_id") or ""))}
        out.append(msg)
    return out


def _signature(fn: dict[str, Any]) -> str:
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    args = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in props.items())
    described = f"{fn['name']}({args})"
    return f"{described}: {fn['description']}" if fn.get("description") else described


def describe_tools(tools: list[dict[str, Any]]) -> str:
    """A system-prompt description of tools for templates that cannot render them.

    One line per function and one concrete example call: small models copy
    placeholders such as ``<tool name>`` literally, so none are used.
    """
    functions = [t.get("function", t) for t in tools]
    lines = ["You can call these functions:"]
    lines += [f"- {_signature(fn)}" for fn in functions]
    first = functions[0]
    props = list((first.get("parameters") or {}).get("properties") or {})
    example_args = json.dumps({props[0]: "..."} if props else {})
    lines.append(
        'To call one, reply with <tool_call>{"name": "'
        + first["name"]
        + '", "arguments": '
        + example_args
        + "}</tool_call>"
    )
    return "\n".join(lines)


def render_chat_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None,
    native_tool_format: bool,
    capabilities: TemplateCapabilities,
    add_generation_prompt: bool = True,
    **template_kwargs: Any,
) -> str:
    """Render normalized messages to the prompt string the model continues.

    Args:
        tokenizer: The model's tokenizer (mlx-lm ``TokenizerWrapper`` or HF tokenizer).
        messages: Output of :func:`~mlx_integrations.chat.messages.normalize_messages`.
        tools: OpenAI-style tool definitions, or None.
        native_tool_format: Keep tool calls and tool results as structured messages.
        capabilities: Result of :func:`probe_template` for this tokenizer.
        add_generation_prompt: Open an assistant turn at the end.
        **template_kwargs: Extra variables for the template (``enable_thinking``...).
    """
    if not native_tool_format:
        messages = tool_messages_as_text(messages)
    elif capabilities.short_call_ids:
        messages = shorten_call_ids(messages)
    if tools and not capabilities.renders_tools:
        description = describe_tools(tools)
        if messages and messages[0]["role"] == "system":
            first = dict(messages[0])
            first["content"] = f"{first['content']}\n\n{description}"
            messages = [first, *messages[1:]]
        else:
            messages = [{"role": "system", "content": description}, *messages]
        tools = None
    if not capabilities.has_template:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + ("assistant: " if add_generation_prompt else "")
    kwargs = dict(template_kwargs)
    if tools:
        kwargs["tools"] = tools
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )
