"""Rendering neutral messages through a model's own chat template, once per turn.

The template decides what a model sees. We probe once what it can render (tools, and
under which argument; assistant tool calls with dict or string arguments; the tool
role; call ids) and adapt: native tool messages when it takes them, the family's own
text layout otherwise; tools described in the system message when it ignores them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from mlx_integrations.chat.tool_formats import ToolFormat

_PROBE_TOOL = "zq_probe_tool"
_PROBE_RESULT = "zq_probe_result_4417"
_PROBE = {
    "type": "function",
    "function": {
        "name": _PROBE_TOOL,
        "description": "probe",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
    },
}


@dataclass(frozen=True)
class TemplateCapabilities:
    """What a chat template renders, found by rendering probes."""

    has_template: bool
    renders_tools: bool
    """Tool definitions show up in the prompt (through :attr:`tools_argument`)."""
    renders_tool_messages: bool
    """Assistant ``tool_calls`` and ``role="tool"`` messages render natively."""
    short_call_ids: bool = False
    """The template takes only 9-character alphanumeric tool-call ids (Mistral v0.3,
    Nemo, Small 3.x raise on others); ids are shortened when rendering."""
    tools_argument: Literal["tools", "custom_tools"] = "tools"
    """The template variable that takes tools (Llama 4's official template reads
    ``custom_tools``)."""
    string_arguments: bool = False
    """Call arguments must reach the template as a JSON string (DeepSeek templates
    concatenate them into the prompt)."""


NO_TEMPLATE = TemplateCapabilities(False, False, False)


def _render(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **kwargs
    )


def probe_template(tokenizer: Any) -> TemplateCapabilities:
    """Render probe conversations to learn what the template supports."""
    if not getattr(tokenizer, "chat_template", None) and not getattr(
        tokenizer, "has_chat_template", False
    ):
        return NO_TEMPLATE
    tools_argument: Literal["tools", "custom_tools"] = "tools"
    renders_tools = _renders_tools(tokenizer, "tools")
    if not renders_tools and _renders_tools(tokenizer, "custom_tools"):
        renders_tools, tools_argument = True, "custom_tools"
    kwargs: dict[str, Any] = {tools_argument: [_PROBE]}
    string_args = short_ids = False
    native = _renders_tool_messages(tokenizer, "call_probe_1", {"x": 1}, kwargs)
    if not native and _renders_tool_messages(tokenizer, "callprobe", {"x": 1}, kwargs):
        native = short_ids = True
    if not native and _renders_tool_messages(tokenizer, "call_probe_1", '{"x": 1}', kwargs):
        native = string_args = True
    return TemplateCapabilities(True, renders_tools, native, short_ids, tools_argument, string_args)


def _renders_tools(tokenizer: Any, argument: str) -> bool:
    try:
        text = _render(tokenizer, [{"role": "user", "content": "hi"}], **{argument: [_PROBE]})
    except Exception:
        return False
    return _PROBE_TOOL in text


def _renders_tool_messages(
    tokenizer: Any, call_id: str, arguments: Any, kwargs: dict[str, Any]
) -> bool:
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
                    "function": {"name": _PROBE_TOOL, "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "name": _PROBE_TOOL, "content": _PROBE_RESULT},
    ]
    try:
        text = _render(tokenizer, convo, **kwargs)
    except Exception:
        return False
    return _PROBE_TOOL in text.split("hi", 1)[-1] and _PROBE_RESULT in text


def short_call_id(call_id: str) -> str:
    """A 9-character alphanumeric id standing for ``call_id`` (the same one each time).

    Examples:
        >>> short_call_id("call_0123456789abcdef"), short_call_id("abcDEF123")
        ('aff2e571f', 'abcDEF123')
    """
    if len(call_id) == 9 and call_id.isascii() and call_id.isalnum():
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


def _native_messages(
    messages: list[dict[str, Any]], capabilities: TemplateCapabilities
) -> list[dict[str, Any]]:
    """Tool calls and results as this template takes them (ids, argument form)."""
    if not (capabilities.short_call_ids or capabilities.string_arguments):
        return messages
    ids = short_call_id if capabilities.short_call_ids else str
    out = []
    for msg in messages:
        if msg.get("tool_calls"):
            calls = []
            for call in msg["tool_calls"]:
                function = call["function"]
                if capabilities.string_arguments:
                    arguments = json.dumps(function["arguments"], ensure_ascii=False)
                    function = {**function, "arguments": arguments}
                calls.append({**call, "id": ids(str(call.get("id") or "")), "function": function})
            msg = {**msg, "tool_calls": calls}
        elif msg.get("role") == "tool" and "tool_call_id" in msg:
            msg = {**msg, "tool_call_id": ids(str(msg.get("tool_call_id") or ""))}
        out.append(msg)
    return out


def tool_messages_as_text(
    messages: list[dict[str, Any]], tool_format: ToolFormat
) -> list[dict[str, Any]]:
    """Rewrite assistant tool calls and tool results as text, for templates without them.

    Calls are written in the family's own layout (what the model would write); a result
    becomes a user turn that names the tool and asks for an answer (small models
    otherwise repeat the call they see just before it).
    """
    out: list[dict[str, Any]] = []
    for msg in messages:
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            calls = tool_format.write_calls(
                [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]]
            )
            text = f"{msg['content']}\n{calls}" if msg["content"] else calls
            out.append({"role": "assistant", "content": text})
        elif msg["role"] == "tool":
            name = msg.get("name") or "tool"
            tool = name if name == "tool" else f"{name} tool"
            content: Any = f"The {tool} returned: {msg['content']}\nUse this result to answer."
            if isinstance(msg["content"], list):  # a result with images (vision models)
                content = [
                    {"type": "text", "text": f"The {tool} returned: "},
                    *msg["content"],
                    {"type": "text", "text": "\nUse this result to answer."},
                ]
            out.append({"role": "user", "content": content})
        else:
            out.append({k: v for k, v in msg.items() if k != "tool_call_id"})
    return out


def _signature(fn: dict[str, Any]) -> str:
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    args = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in props.items())
    described = f"{fn['name']}({args})"
    return f"{described}: {fn['description']}" if fn.get("description") else described


def describe_tools(tools: list[dict[str, Any]], tool_format: ToolFormat) -> str:
    """A system-prompt description of tools for templates that cannot render them.

    One line per function and one concrete example call in the family's own layout:
    small models copy placeholders such as ``<tool name>`` literally, so none are used.
    """
    functions = [t.get("function", t) for t in tools]
    lines = ["You can call these functions:"]
    lines += [f"- {_signature(fn)}" for fn in functions]
    first = functions[0]
    props = list((first.get("parameters") or {}).get("properties") or {})
    example = tool_format.write_calls([(first["name"], {props[0]: "..."} if props else {})])
    lines.append(f"To call one, reply with {example}")
    return "\n".join(lines)


def render_chat_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None,
    native_tool_format: bool,
    capabilities: TemplateCapabilities,
    tool_format: ToolFormat,
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
        tool_format: The model's tool-call family (for text-form calls and examples).
        add_generation_prompt: Open an assistant turn at the end.
        **template_kwargs: Extra variables for the template (``enable_thinking``...).
    """
    if native_tool_format:
        messages = _native_messages(messages, capabilities)
    else:
        messages = tool_messages_as_text(messages, tool_format)
    if tools and not capabilities.renders_tools:
        description = describe_tools(tools, tool_format)
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
        kwargs[capabilities.tools_argument] = tools
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )
