"""``POST /v1/responses``: OpenAI's Responses API, for clients that speak only it.

Stateless: each request carries its whole conversation in ``input`` (messages,
``function_call`` and ``function_call_output`` items); ``previous_response_id`` and
``store=true`` are refused, since nothing is kept between requests. Text, images
(``input_image``), function tools with ``tool_choice`` enforced, ``text.format``
(JSON object or schema) and streaming are served; reasoning comes back as a
``reasoning`` item.
"""

from __future__ import annotations

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
from mlx_integrations.serve.errors import api_error, openai_error_body
from mlx_integrations.serve.openai_chat import reasoning_options, stream_response
from mlx_integrations.serve.sse import closing, prime, sse, until_disconnected
from mlx_integrations.serve.state import ChatParts, ServerState
from mlx_integrations.serve.wire import Body, new_id, now, parse_json, sampling_options

__all__ = ["responses"]


# ------------------------------------------------------------------ request


def _content(content: Any, where: str, body: Body) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise body.error(where, "must be a string or an array of content parts")
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise body.error(f"{where}[{i}]", "needs 'image_url' (a URL or data: URL)")
            parts.append({"type": "image", "image": url})
        else:
            raise body.error(
                f"{where}[{i}]",
                f"has type {kind!r}; use 'input_text' or 'input_image' (files are not supported)",
            )
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def read_input(body: Body) -> list[dict[str, Any]]:
    """``instructions`` and ``input`` as chat-core messages."""
    messages: list[dict[str, Any]] = []
    instructions = body.text("instructions")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    value = body.raw("input")
    if isinstance(value, str):
        return [*messages, {"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise body.error("input", "is required: a string or an array of input items")
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise body.error(where, "must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise body.error(
                    f"{where}.role", f"must be user, assistant, system or developer, got {role!r}"
                )
            role = "system" if role == "developer" else role
            messages.append(
                {"role": role, "content": _content(item.get("content"), f"{where}.content", body)}
            )
        elif kind == "function_call":
            call = {
                "id": str(item.get("call_id") or ""),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"},
            }
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            content = (
                output if isinstance(output, str) else _content(output, f"{where}.output", body)
            )
            messages.append(
                {"role": "tool", "tool_call_id": str(item.get("call_id") or ""), "content": content}
            )
        elif kind == "reasoning":
            continue  # the model's earlier reasoning is not shown to it again
        else:
            raise body.error(
                where,
                f"has type {kind!r}; use 'message', 'function_call' or 'function_call_output'",
            )
    return messages


def read_tools(body: Body) -> list[dict[str, Any]] | None:
    tools = body.array("tools")
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise body.error(
                f"tools[{i}]",
                f"has type {kind!r}; only 'function' tools are served (built-in tools are not)",
            )
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        out.append({"type": "function", "function": function})
    return out


def read_tool_choice(body: Body) -> Any:
    choice = body.raw("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") == "function" and isinstance(choice.get("name"), str):
            return choice["name"]
        raise body.error(
            "tool_choice", "must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}"
        )
    return choice


def read_format(body: Body) -> dict[str, Any] | None:
    text = body.obj("text") or {}
    fmt = text.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if not isinstance(fmt, dict):
        raise body.error("text.format", "must be an object")
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        return {
            "type": "json_schema",
            "json_schema": {"name": fmt.get("name"), "schema": fmt["schema"]},
        }
    raise body.error(
        "text.format",
        "must be {'type': 'text'}, {'type': 'json_object'} or {'type': 'json_schema', 'schema': {...}}",
    )


def read_parts(body: Body) -> tuple[ChatParts, bool]:
    body.refuse(
        "previous_response_id",
        "is not supported: this server keeps no responses; send the whole conversation in 'input'",
        (),
    )
    body.refuse("store", "must be false or absent: this server keeps no responses")
    options = sampling_options(body)
    reasoning = body.obj("reasoning") or {}
    options.update(reasoning_options(body, "reasoning.effort", reasoning.get("effort")))
    tools = read_tools(body)
    choice = read_tool_choice(body)
    parts = ChatParts(
        model=body.raw("model"),
        messages=read_input(body),
        tools=tools,
        tool_choice=choice if tools else None,
        parallel_tool_calls=body.flag("parallel_tool_calls"),
        response_format=read_format(body),
        max_tokens=body.integer("max_output_tokens", low=1),
        temperature=body.number("temperature"),
        top_p=body.number("top_p"),
        options=options,
    )
    return parts, bool(body.flag("stream", False))


# ----------------------------------------------------------------- response


class _Builder:
    """The response object and its output items, built from the turn's events."""

    def __init__(self, response_id: str, parts: ChatParts, body: Body):
        self.response: dict[str, Any] = {
            "id": response_id,
            "object": "response",
            "created_at": now(),
            "status": "in_progress",
            "model": parts.model,
            "output": [],
            "parallel_tool_calls": parts.parallel_tool_calls is not False,
            "tool_choice": body.raw("tool_choice", "auto"),
            "tools": body.raw("tools", []),
            "temperature": parts.temperature,
            "top_p": parts.top_p,
            "max_output_tokens": parts.max_tokens,
            "instructions": body.raw("instructions"),
            "text": body.raw("text", {"format": {"type": "text"}}),
            "error": None,
            "incomplete_details": None,
            "metadata": body.raw("metadata", {}),
            "usage": None,
        }
        self.sequence = 0

    @property
    def output(self) -> list[dict[str, Any]]:
        return self.response["output"]

    def event(self, kind: str, **fields: Any) -> bytes:
        frame = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse(frame, kind)

    def snapshot(self) -> dict[str, Any]:
        return json.loads(json.dumps(self.response))

    def finish(self, finished: Finished) -> None:
        truncated = finished.finish_reason == "length"
        self.response["status"] = "incomplete" if truncated else "completed"
        if truncated:
            self.response["incomplete_details"] = {"reason": "max_output_tokens"}
        self.response["usage"] = {
            "input_tokens": finished.prompt_tokens,
            "input_tokens_details": {"cached_tokens": finished.cached_tokens},
            "output_tokens": finished.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": finished.prompt_tokens + finished.completion_tokens,
        }


def _message_item() -> dict[str, Any]:
    return {
        "type": "message",
        "id": new_id("msg_"),
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }


def _text_part(text: str = "") -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _reasoning_item() -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": new_id("rs_"),
        "summary": [],
        "content": [],
        "status": "in_progress",
    }


def _call_item(call: ParsedToolCall) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": new_id("fc_"),
        "call_id": call.id,
        "name": call.name,
        "arguments": json.dumps(call.arguments, ensure_ascii=False),
        "status": "completed",
    }


async def response_frames(
    events: AsyncIterator[Event | Finished], built: _Builder
) -> AsyncIterator[bytes]:
    """The streamed response: created, items added, deltas, items done, completed."""
    yield built.event("response.created", response=built.snapshot())
    yield built.event("response.in_progress", response=built.snapshot())
    open_item: dict[str, Any] | None = None

    def close() -> list[bytes]:
        nonlocal open_item
        item, open_item = open_item, None
        if item is None:
            return []
        index = len(built.output) - 1
        item["status"] = "completed"
        frames = []
        if item["type"] == "message":
            text = item["content"][0]["text"]
            frames.append(
                built.event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
            )
            frames.append(
                built.event(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=item["content"][0],
                )
            )
        else:
            text = item["content"][0]["text"]
            frames.append(
                built.event(
                    "response.reasoning_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=text,
                )
            )
        frames.append(built.event("response.output_item.done", output_index=index, item=item))
        return frames

    def open_(item: dict[str, Any]) -> list[bytes]:
        nonlocal open_item
        frames = close()
        open_item = item
        built.output.append(item)
        index = len(built.output) - 1
        shown = {**item, "content": []}
        frames.append(built.event("response.output_item.added", output_index=index, item=shown))
        if item["type"] == "message":
            item["content"].append(_text_part())
            frames.append(
                built.event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=_text_part(),
                )
            )
        else:
            item["content"].append({"type": "reasoning_text", "text": ""})
        return frames

    async with closing(events):
        async for event in events:
            index = len(built.output) - 1
            if isinstance(event, (TextDelta, InvalidToolCall)):
                text = event.text if isinstance(event, TextDelta) else event.raw
                if open_item is None or open_item["type"] != "message":
                    for frame in open_(_message_item()):
                        yield frame
                    index = len(built.output) - 1
                assert open_item is not None
                open_item["content"][0]["text"] += text
                yield built.event(
                    "response.output_text.delta",
                    item_id=open_item["id"],
                    output_index=index,
                    content_index=0,
                    delta=text,
                    logprobs=[],
                )
            elif isinstance(event, ReasoningDelta):
                if open_item is None or open_item["type"] != "reasoning":
                    for frame in open_(_reasoning_item()):
                        yield frame
                    index = len(built.output) - 1
                assert open_item is not None
                open_item["content"][0]["text"] += event.text
                yield built.event(
                    "response.reasoning_text.delta",
                    item_id=open_item["id"],
                    output_index=index,
                    content_index=0,
                    delta=event.text,
                )
            elif isinstance(event, ParsedToolCall):
                for frame in close():
                    yield frame
                item = _call_item(event)
                built.output.append(item)
                index = len(built.output) - 1
                yield built.event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "arguments": "", "status": "in_progress"},
                )
                yield built.event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=item["arguments"],
                )
                yield built.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
                yield built.event("response.output_item.done", output_index=index, item=item)
            elif isinstance(event, Finished):
                for frame in close():
                    yield frame
                built.finish(event)
                # Cut at max_output_tokens too: the status says "incomplete", and the
                # SDK's stream helper, which waits for this event, gets its response.
                yield built.event("response.completed", response=built.snapshot())


async def whole_response(
    events: AsyncIterator[Event | Finished], built: _Builder
) -> dict[str, Any]:
    """The non-streamed response (the same items the stream builds)."""
    async for _ in response_frames(events, built):
        pass
    return built.response


def responses_error_frame(exc: BaseException) -> bytes:
    error = openai_error_body(api_error(exc))["error"]
    return sse(
        {
            "type": "error",
            "code": error["code"],
            "message": error["message"],
            "param": error["param"],
        },
        "error",
    )


async def responses(state: ServerState, request: Request) -> Response:
    """Answer ``POST /v1/responses``."""
    body = Body(parse_json(await request.body()))
    parts, stream = read_parts(body)
    served = await state.served(parts.model)
    chat = state.chat_request(served, parts)
    built = _Builder(new_id("resp_"), parts, body)
    chat.options["request_id"] = built.response["id"]
    events = state.turn(served, chat, stream)
    if not stream:
        reply = await until_disconnected(request.receive, whole_response(events, built))
        return JSONResponse(reply)
    _, events = await until_disconnected(request.receive, prime(events))
    return stream_response(state, response_frames(events, built), responses_error_frame, request)
