"""Ollama's ``/api/chat`` and ``/api/generate`` bodies as the chat core's request.

Each body becomes :class:`~mlx_integrations.serve.state.ChatParts`, which the server
state turns into the checked :class:`~mlx_integrations.chat.request.ChatRequest`
(``ChatRequest.build``), as every other API does:

- ``messages`` keep their roles; ``images`` (base64) become image parts before the
  text; an assistant's ``tool_calls`` (arguments as an object) and ``thinking``, and a
  ``tool`` message's answer, carry a tool loop (a ``tool`` message without
  ``tool_call_id`` answers the earlier calls in order, or the one its ``tool_name``
  names);
- ``/api/generate``'s ``system`` and ``prompt`` (with its ``images``) are a system and
  a user message, through the chat template;
- ``format`` is ``json_object`` (``"json"``) or a JSON schema, enforced token by token;
- ``options`` are the sampling fields (``num_predict`` is ``max_tokens``,
  ``repeat_penalty`` is ``repetition_penalty``);
- ``think`` is the template's switch (true/false) or a ``reasoning_effort`` level.

A bad value is a 400 whose path is the field's in Ollama's names
(``options.num_predict``, ``messages[1].images[0]``, ``prompt``).
"""

from __future__ import annotations

import re
from typing import Any

from mlx_integrations.serve.errors import APIError
from mlx_integrations.serve.ollama import protocol as wire
from mlx_integrations.serve.paths import WirePaths
from mlx_integrations.serve.state import ChatParts

__all__ = ["OllamaPaths", "chat_parts", "generate_parts", "max_tokens_of"]

_OPTION_FIELDS = {
    "max_tokens": "options.num_predict",
    "temperature": "options.temperature",
    "top_p": "options.top_p",
    "top_k": "options.top_k",
    "min_p": "options.min_p",
    "seed": "options.seed",
    "stop": "options.stop",
    "repetition_penalty": "options.repeat_penalty",
    "presence_penalty": "options.presence_penalty",
    "frequency_penalty": "options.frequency_penalty",
    "response_format": "format",
    "reasoning_effort": "think",
    "enable_thinking": "think",
}
_MESSAGE = re.compile(r"^messages\[(\d+)\]")
_PART = re.compile(r"^\.content\[(\d+)\]")


class OllamaPaths(WirePaths):
    """The chat core's paths in Ollama's names: the options, ``system`` and ``prompt``
    of ``/api/generate``, and where a message's parts came from (its ``images``, then
    its text)."""

    def __init__(self, messages: list[str], images: list[int]):
        super().__init__(fields=dict(_OPTION_FIELDS), messages=messages)
        self.images = images
        """How many images each chat-core message holds before its text."""

    def __call__(self, path: str) -> str:
        head = _MESSAGE.match(path)
        if head is None or self.messages is None or int(head.group(1)) >= len(self.messages):
            return super().__call__(path)
        index = int(head.group(1))
        base, rest = self.messages[index], path[head.end() :]
        part = _PART.match(rest)
        if part is not None:
            k = int(part.group(1))
            if k < self.images[index]:
                where = ("images" if base == "prompt" else f"{base}.images") + f"[{k}]"
            else:
                where = base if base in ("prompt", "system") else f"{base}.content"
            return where + rest[part.end() :]
        if base in ("prompt", "system"):
            return base + rest.removeprefix(".content")
        return super().__call__(path)


def max_tokens_of(options: wire.Options | None) -> int | None:
    """``num_predict``: None (up to the context window) for unset, -1 and -2."""
    value = options.num_predict if options is not None else None
    return None if value in (None, -1, -2) else value


def _format(value: wire.Format | None) -> dict[str, Any] | None:
    if value is None or value == "":
        return None
    if value == "json":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "format", "schema": value}}


def _reasoning(think: wire.Think | None) -> dict[str, Any]:
    if isinstance(think, bool):
        return {"enable_thinking": think}
    return {"reasoning_effort": think}


def _sampling(options: wire.Options | None) -> dict[str, Any]:
    if options is None:
        return {}
    stop = [options.stop] if isinstance(options.stop, str) else options.stop
    return {
        "max_tokens": max_tokens_of(options),
        "temperature": options.temperature,
        "top_p": options.top_p,
        "top_k": options.top_k,
        "min_p": options.min_p,
        "seed": options.seed,
        "stop": stop or None,
        "repetition_penalty": options.repeat_penalty,
        "presence_penalty": options.presence_penalty,
        "frequency_penalty": options.frequency_penalty,
    }


def _user(text: str, images: list[str] | None) -> dict[str, Any]:
    if not images:
        return {"role": "user", "content": text}
    parts: list[dict[str, Any]] = [{"type": "image", "image": data} for data in images]
    if text:
        parts.append({"type": "text", "text": text})
    return {"role": "user", "content": parts}


def _tool(tool: wire.Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.function.name}
    if tool.function.description is not None:
        function["description"] = tool.function.description
    if tool.function.parameters is not None:
        function["parameters"] = tool.function.parameters
    return {"type": tool.type, "function": function}


def _messages(body: wire.ChatRequest) -> tuple[list[dict[str, Any]], list[int]]:
    """The chat core's messages, and the images each holds before its text."""
    out: list[dict[str, Any]] = []
    images: list[int] = []
    pending: list[tuple[str, str]] = []  # calls of the last assistant turn not yet answered
    for i, message in enumerate(body.messages):
        text = message.content or ""
        held = 0
        if message.role == "user":
            item = _user(text, message.images)
            held = len(message.images or ())
        elif message.images:
            raise APIError(
                400,
                f"'messages[{i}].images': images go in user messages, not in a "
                f"{message.role} message",
                param=f"messages[{i}].images",
            )
        else:
            item = {"role": message.role, "content": text}
        if message.role == "assistant":
            calls: list[dict[str, Any]] = []
            pending = []
            for j, call in enumerate(message.tool_calls or ()):
                call_id = call.id or f"call_{i}_{j}"
                pending.append((call_id, call.function.name))
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": call.function.name,
                            "arguments": call.function.arguments,
                        },
                    }
                )
            if calls:
                item["tool_calls"] = calls
            if message.thinking:
                item["reasoning_content"] = message.thinking
        elif message.role == "tool":
            answered = _answered(pending, message.tool_call_id, message.tool_name)
            item["tool_call_id"] = message.tool_call_id or (answered[0] if answered else "")
            name = message.tool_name or (answered[1] if answered else None)
            if name:
                item["name"] = name
        out.append(item)
        images.append(held)
    return out, images


def _answered(
    pending: list[tuple[str, str]], call_id: str | None, name: str | None
) -> tuple[str, str] | None:
    """The earlier call a tool message answers (taken off ``pending``): by id, by the
    tool's name, else the first one not yet answered."""
    for k, (pending_id, pending_name) in enumerate(pending):
        if (call_id and pending_id == call_id) or (
            not call_id and (name is None or pending_name == name)
        ):
            return pending.pop(k)
    return None


def chat_parts(body: wire.ChatRequest, model: str) -> ChatParts:
    """The chat-core pieces of an ``/api/chat`` body (``model``: the served name)."""
    messages, images = _messages(body)
    return ChatParts(
        model=model,
        messages=messages,
        paths=OllamaPaths([f"messages[{i}]" for i in range(len(messages))], images),
        tools=[_tool(t) for t in body.tools] if body.tools else None,
        response_format=_format(body.format),
        **_sampling(body.options),
        **_reasoning(body.think),
    )


def generate_parts(body: wire.GenerateRequest, model: str) -> ChatParts:
    """The chat-core pieces of an ``/api/generate`` body that goes through the chat
    template (``raw`` false): its ``system`` and ``prompt`` as two messages."""
    messages: list[dict[str, Any]] = []
    paths: list[str] = []
    images: list[int] = []
    if body.system:
        messages.append({"role": "system", "content": body.system})
        paths.append("system")
        images.append(0)
    messages.append(_user(body.prompt, body.images))
    paths.append("prompt")
    images.append(len(body.images or ()))
    return ChatParts(
        model=model,
        messages=messages,
        paths=OllamaPaths(paths, images),
        response_format=_format(body.format),
        **_sampling(body.options),
        **_reasoning(body.think),
    )
