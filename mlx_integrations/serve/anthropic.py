"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: Anthropic's Messages API.

Content blocks become chat-core messages: ``tool_use`` blocks an assistant's tool
calls, each ``tool_result`` a tool message, ``thinking`` the assistant's reasoning,
``image`` blocks image parts (base64 or URL, under the server's media policy). The
reply comes back as blocks in the order the model wrote them; a stream sends the
event sequence strict clients check: ``message_start``, per block
``content_block_start``/``_delta``/``_stop``, ``message_delta`` (stop reason, usage),
``message_stop``. ``thinking`` turns thinking on or off where the chat template
allows, and ``budget_tokens`` caps it on a model that thinks (the model writes its end
of thinking after that many tokens); a model that does not think ignores it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlx_integrations.chat.completion import (
    Finished,
    InvalidToolCall,
    ParsedToolCall,
    ReasoningDelta,
    TextDelta,
)
from mlx_integrations.chat.output_parser import Event
from mlx_integrations.chat.reasoning import reasoning_switch
from mlx_integrations.serve.errors import APIError, anthropic_error_body, api_error
from mlx_integrations.serve.openai_chat import stream_response
from mlx_integrations.serve.sse import closing, prime, sse, until_disconnected
from mlx_integrations.serve.state import ChatParts, ServerState
from mlx_integrations.serve.wire import Body, new_id, parse_json, sampling_options

__all__ = ["count_tokens", "messages"]


# ------------------------------------------------------------------ request


def _image_source(block: dict[str, Any], where: str) -> str:
    source = block.get("source")
    if not isinstance(source, dict):
        raise APIError(400, f"{where}.source must be an object", param=f"{where}.source")
    kind = source.get("type")
    if kind == "base64":
        media_type, data = source.get("media_type"), source.get("data")
        if not isinstance(media_type, str) or not isinstance(data, str) or not data:
            raise APIError(
                400,
                f"{where}.source of type 'base64' needs 'media_type' and 'data'",
                param=f"{where}.source",
            )
        return f"data:{media_type};base64,{data}"
    if kind == "url" and isinstance(source.get("url"), str):
        return str(source["url"])
    raise APIError(
        400,
        f"{where}.source has type {kind!r}; use 'base64' (with media_type and data) or 'url'",
        param=f"{where}.source",
    )


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise APIError(400, f"{where} must be a string or an array of blocks", param=where)
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise APIError(400, f"{where}[{i}] must be a block with a 'type'", param=where)
    return content


def _parts(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """Text and image blocks as neutral parts."""
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        kind = block["type"]
        if kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            parts.append({"type": "image", "image": _image_source(block, f"{where}[{i}]")})
        else:
            raise APIError(
                400,
                f"{where}[{i}] has type {kind!r}; here only 'text' and 'image' blocks are taken",
                param=where,
            )
    return parts


def _content(parts: list[dict[str, Any]]) -> Any:
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def read_messages(body: Body) -> list[dict[str, Any]]:
    """Anthropic's system and messages as chat-core messages."""
    out: list[dict[str, Any]] = []
    system = body.raw("system")
    if system is not None:
        text = _content(_parts(_blocks(system, "system"), "system"))
        if not isinstance(text, str):
            raise body.error("system", "must hold text blocks only")
        if text:
            out.append({"role": "system", "content": text})
    for m, message in enumerate(body.required("messages", list)):
        where = f"messages[{m}]"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise APIError(
                400, f"{where} must have role 'user' or 'assistant'", param=f"{where}.role"
            )
        blocks = _blocks(message.get("content"), f"{where}.content")
        if message["role"] == "user":
            out += _user_messages(blocks, f"{where}.content")
        else:
            out.append(_assistant_message(blocks, f"{where}.content"))
    return out


def _user_messages(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        if block["type"] != "tool_result":
            rest.append(block)
            continue
        content = block.get("content", "")
        parts = _parts(_blocks(content, f"{where}[{i}].content"), f"{where}[{i}].content")
        value = _content(parts)
        if block.get("is_error") and isinstance(value, str):
            value = f"Error: {value}"
        out.append(
            {"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""), "content": value}
        )
    if rest:
        out.append({"role": "user", "content": _content(_parts(rest, where))})
    return out


def _assistant_message(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    text, reasoning, calls = [], [], []
    for i, block in enumerate(blocks):
        kind = block["type"]
        if kind == "text":
            text.append(str(block.get("text", "")))
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking", "")))
        elif kind == "redacted_thinking":
            continue  # nothing a local model can read
        elif kind == "tool_use":
            arguments = block.get("input") or {}
            if not isinstance(arguments, dict):
                raise APIError(400, f"{where}[{i}].input must be an object", param=where)
            calls.append(
                {
                    "id": str(block.get("id") or ""),
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": arguments},
                }
            )
        else:
            raise APIError(
                400,
                f"{where}[{i}] has type {kind!r}; assistant turns hold 'text', 'thinking' "
                "and 'tool_use' blocks",
                param=where,
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    return message


def read_tools(body: Body) -> list[dict[str, Any]] | None:
    tools = body.array("tools")
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise body.error(f"tools[{i}]", "must be an object with a 'name'")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise body.error(
                f"tools[{i}]",
                f"has type {kind!r}: server tools are not run here; give client tools "
                "(name, description, input_schema)",
            )
        function = {
            "name": tool["name"],
            "description": tool.get("description") or "",
            "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
        }
        out.append({"type": "function", "function": function})
    return out


def read_tool_choice(body: Body) -> tuple[Any, bool | None]:
    """Anthropic's tool choice as the chat core's, and whether calls may be parallel."""
    choice = body.obj("tool_choice")
    if choice is None:
        return None, None
    kind = choice.get("type")
    parallel = (
        None
        if "disable_parallel_tool_use" not in choice
        else not choice["disable_parallel_tool_use"]
    )
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return choice["name"], parallel
    raise body.error(
        "tool_choice",
        "must be {'type': 'auto'}, {'type': 'any'}, {'type': 'none'} or "
        "{'type': 'tool', 'name': ...}",
    )


def read_parts(body: Body) -> tuple[ChatParts, bool]:
    model = body.raw("model")
    stream = bool(body.flag("stream", False))
    options = sampling_options(body)
    thinking = body.obj("thinking")
    if thinking is not None:
        options["enable_thinking"] = thinking.get("type") in ("enabled", "adaptive")
        budget = thinking.get("budget_tokens")
        if thinking.get("type") == "enabled" and budget is not None:
            if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
                raise body.error(
                    "thinking.budget_tokens",
                    f"must be an integer number of tokens >= 1, got {budget!r}",
                )
            options["thinking_budget"] = budget
    output = body.obj("output_config") or {}
    response_format = None
    fmt = output.get("format")
    if fmt is not None:
        if (
            not isinstance(fmt, dict)
            or fmt.get("type") != "json_schema"
            or not isinstance(fmt.get("schema"), dict)
        ):
            raise body.error(
                "output_config.format", "must be {'type': 'json_schema', 'schema': {...}}"
            )
        response_format = {"type": "json_schema", "json_schema": {"schema": fmt["schema"]}}
    if output.get("effort") is not None:  # templates that take it read it
        options["chat_template_kwargs"] = {
            **options.get("chat_template_kwargs", {}),
            "reasoning_effort": output["effort"],
        }
    tools = read_tools(body)
    tool_choice, parallel = read_tool_choice(body)
    stops = body.array("stop_sequences")
    if stops is not None and not all(isinstance(s, str) and s for s in stops):
        raise body.error("stop_sequences", "must be an array of non-empty strings")
    parts = ChatParts(
        model=model,
        messages=read_messages(body),
        tools=tools,
        tool_choice=tool_choice if tools else None,
        parallel_tool_calls=parallel,
        response_format=response_format,
        max_tokens=body.integer("max_tokens", low=1),
        temperature=body.number("temperature"),
        top_p=body.number("top_p"),
        stop=stops or None,
        options=options,
    )
    return parts, stream


# ----------------------------------------------------------------- response


def stop_reason(finished: Finished) -> str:
    if finished.finish_reason == "tool_calls":
        return "tool_use"
    if finished.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if finished.stop_sequence else "end_turn"


def anthropic_usage(finished: Finished) -> dict[str, Any]:
    # Anthropic's input_tokens leaves out the tokens read from the cache.
    return {
        "input_tokens": finished.prompt_tokens - finished.cached_tokens,
        "output_tokens": finished.completion_tokens,
        "cache_read_input_tokens": finished.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def _tool_use(call: ParsedToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}


def _message(message_id: str, model: str) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }


async def whole_message(
    events: AsyncIterator[Event | Finished], message_id: str, model: str
) -> dict[str, Any]:
    """The non-streamed message: its blocks in the order the model wrote them."""
    body = _message(message_id, model)
    blocks: list[dict[str, Any]] = body["content"]
    async with closing(events):
        async for event in events:
            if isinstance(event, (TextDelta, InvalidToolCall)):
                text = event.text if isinstance(event, TextDelta) else event.raw
                if blocks and blocks[-1]["type"] == "text":
                    blocks[-1]["text"] += text
                else:
                    blocks.append({"type": "text", "text": text})
            elif isinstance(event, ReasoningDelta):
                if blocks and blocks[-1]["type"] == "thinking":
                    blocks[-1]["thinking"] += event.text
                else:
                    blocks.append({"type": "thinking", "thinking": event.text, "signature": ""})
            elif isinstance(event, ParsedToolCall):
                blocks.append(_tool_use(event))
            elif isinstance(event, Finished):
                body["stop_reason"] = stop_reason(event)
                body["stop_sequence"] = event.stop_sequence
                body["usage"] = anthropic_usage(event)
    return body


async def message_frames(
    events: AsyncIterator[Event | Finished], message_id: str, model: str
) -> AsyncIterator[bytes]:
    """The streamed message, event by event."""
    yield sse({"type": "message_start", "message": _message(message_id, model)}, "message_start")
    yield sse({"type": "ping"}, "ping")
    index = -1
    open_kind: str | None = None

    def start(kind: str, block: dict[str, Any]) -> bytes:
        nonlocal index, open_kind
        index += 1
        open_kind = kind
        return sse(
            {"type": "content_block_start", "index": index, "content_block": block},
            "content_block_start",
        )

    def delta(delta: dict[str, Any]) -> bytes:
        return sse(
            {"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta"
        )

    def stop() -> bytes:
        nonlocal open_kind
        open_kind = None
        return sse({"type": "content_block_stop", "index": index}, "content_block_stop")

    async with closing(events):
        async for event in events:
            if isinstance(event, (TextDelta, InvalidToolCall)):
                if open_kind != "text":
                    if open_kind is not None:
                        yield stop()
                    yield start("text", {"type": "text", "text": ""})
                text = event.text if isinstance(event, TextDelta) else event.raw
                yield delta({"type": "text_delta", "text": text})
            elif isinstance(event, ReasoningDelta):
                if open_kind != "thinking":
                    if open_kind is not None:
                        yield stop()
                    yield start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                yield delta({"type": "thinking_delta", "thinking": event.text})
            elif isinstance(event, ParsedToolCall):
                if open_kind is not None:
                    yield stop()
                yield start("tool_use", {**_tool_use(event), "input": {}})
                arguments = json.dumps(event.arguments, ensure_ascii=False)
                yield delta({"type": "input_json_delta", "partial_json": arguments})
                yield stop()
            elif isinstance(event, Finished):
                if open_kind is not None:
                    yield stop()
                yield sse(
                    {
                        "type": "message_delta",
                        "delta": {
                            "stop_reason": stop_reason(event),
                            "stop_sequence": event.stop_sequence,
                        },
                        "usage": anthropic_usage(event),
                    },
                    "message_delta",
                )
    yield sse({"type": "message_stop"}, "message_stop")


def anthropic_error_frame(exc: BaseException) -> bytes:
    return sse(anthropic_error_body(api_error(exc)), "error")


# ----------------------------------------------------------------- handlers


async def messages(state: ServerState, request: Request) -> Response:
    """Answer ``POST /v1/messages``."""
    body = Body(parse_json(await request.body()))
    parts, stream = read_parts(body)
    served = await state.served(parts.model)
    chat = state.chat_request(served, parts)
    if "thinking_budget" in chat.options and not await asyncio.to_thread(thinks, served.engine):
        del chat.options["thinking_budget"]  # nothing to cap (Anthropic's clients send it)
    message_id = new_id("msg_")
    chat.options["request_id"] = message_id
    events = state.turn(served, chat, stream)
    if not stream:
        reply = await until_disconnected(
            request.receive, whole_message(events, message_id, parts.model)
        )
        return JSONResponse(reply)
    _, events = await until_disconnected(request.receive, prime(events))
    frames = message_frames(events, message_id, parts.model)
    return stream_response(state, frames, anthropic_error_frame, request)


def thinks(engine: Any) -> bool:
    """Whether the engine's model thinks (reading the tokenizer may load it)."""
    return reasoning_switch(engine.tokenizer).thinks


async def count_tokens(state: ServerState, request: Request) -> Response:
    """Answer ``POST /v1/messages/count_tokens``: the prompt's tokens through the model's
    chat template, tools included (what ``usage.input_tokens`` of a call reports,
    cached tokens included)."""
    body = Body(parse_json(await request.body()))
    parts, _ = read_parts(body)
    served = await state.served(parts.model)
    engine = served.engine
    render = getattr(engine, "render_prompt", None)
    if render is None:
        raise APIError(
            400, f"The engine of {parts.model!r} cannot render prompts to count them", param="model"
        )
    chat = state.chat_request(served, parts)
    template_kwargs = dict(chat.options.get("chat_template_kwargs") or {})
    if "enable_thinking" in chat.options:
        template_kwargs["enable_thinking"] = chat.options["enable_thinking"]

    def count() -> int:
        prompt = render(chat.messages, tools=chat.tool_request.openai_tools(), **template_kwargs)
        return len(engine.tokenizer.encode(prompt, add_special_tokens=False))

    try:
        tokens = await asyncio.to_thread(count)
    except (TypeError, ValueError) as exc:
        raise api_error(exc) from None
    return JSONResponse({"input_tokens": tokens})
