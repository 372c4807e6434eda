"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: Anthropic's Messages API.

Content blocks become chat-core messages: ``tool_use`` blocks an assistant's tool
calls, each ``tool_result`` a tool message, ``thinking`` the assistant's reasoning,
``image`` blocks image parts (base64 or URL, under the server's media policy). The
reply comes back as blocks in the order the model wrote them; a stream sends the
event sequence strict clients check: ``message_start``, per block
``content_block_start``/``_delta``/``_stop``, ``message_delta`` (stop reason, usage),
``message_stop``. ``thinking`` (``enabled``, ``adaptive``, ``disabled``) turns thinking
on or off where the chat template allows, ``enabled``'s ``budget_tokens`` caps it on a
model that thinks (the model writes its end of thinking after that many tokens), and
``output_config.effort`` is the template's ``reasoning_effort``; a model that does not
think leaves them out. Tools of another type than a client's (the server tools
``web_search_...``, ``code_execution_...``) are left out of the prompt and reported.
Fields Claude Code sends that change nothing here
(``cache_control``, ``context_management``, ``metadata``...) are accepted and reported.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from mlx_integrations.chat.completion import (
    Finished,
    InvalidToolCall,
    ParsedToolCall,
    ReasoningDelta,
    Started,
    TextDelta,
)
from mlx_integrations.chat.output_parser import Event
from mlx_integrations.chat.reasoning import ReasoningSwitch
from mlx_integrations.serve.errors import APIError, anthropic_error_body, api_error
from mlx_integrations.serve.paths import WirePaths
from mlx_integrations.serve.protocol import anthropic as wire
from mlx_integrations.serve.replies import Accepted, json_reply, new_id, stream_reply
from mlx_integrations.serve.sse import KEEPALIVE_COMMENT, closing, sse, until_disconnected
from mlx_integrations.serve.state import (
    ChatParts,
    ServerState,
    nearest_effort,
    reasoning_switch_of,
    sampling_fields,
)

__all__ = ["count_tokens", "messages"]

# The chat core's names of the fields this API names otherwise.
_FIELDS = {
    "stop": "stop_sequences",
    "response_format.json_schema": "output_config.format",
    "response_format": "output_config.format",
    "thinking_budget": "thinking.budget_tokens",
    "enable_thinking": "thinking.type",
    "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
}
_TOOL_FIELDS = {
    "function.parameters": "input_schema",
    "function.name": "name",
    "function.description": "description",
    "function": "",
}
_CALL_FIELDS = {"function.name": "name", "function.arguments": "input", "function": ""}


# ------------------------------------------------------------------ request


def _image(source: Any) -> str:
    if isinstance(source, wire.Base64Source):
        return f"data:{source.media_type};base64,{source.data}"
    return str(source.url)


def _parts(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """Text and image blocks as neutral parts."""
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        if isinstance(block, wire.TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, wire.ImageBlock):
            parts.append({"type": "image", "image": _image(block.source)})
        else:
            raise APIError(
                400,
                f"'{where}[{i}].type' is {block.type!r}; here only 'text' and 'image' "
                "blocks are taken",
                param=f"{where}[{i}].type",
            )
    return parts


def _content(parts: list[dict[str, Any]]) -> Any:
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _blocks(content: str | list[Any]) -> list[Any]:
    return [wire.TextBlock(type="text", text=content)] if isinstance(content, str) else content


def _system_text(content: str | list[Any], where: str) -> str:
    if isinstance(content, str):
        return content
    for i, block in enumerate(content):
        if not isinstance(block, wire.TextBlock):
            raise APIError(
                400,
                f"'{where}[{i}].type' is {block.type!r}; a system message holds text blocks",
                param=f"{where}[{i}].type",
            )
    return "".join(block.text for block in content)


def read_messages(body: wire.MessagesRequest, paths: WirePaths) -> list[dict[str, Any]]:
    """Anthropic's system and messages as chat-core messages; where each message and
    each tool call came from goes in ``paths``.

    System messages in the conversation (Claude Code sends its agents' list that way)
    join the system prompt, after ``system``, in their order: chat templates take one
    system message, at the start.
    """
    out: list[dict[str, Any]] = []
    origins: list[str] = []
    paths.messages = origins
    system = [(_system_text(body.system, "system"), "system")] if body.system else []
    system += [
        (_system_text(message.content, f"messages[{m}].content"), f"messages[{m}]")
        for m, message in enumerate(body.messages)
        if message.role == "system"
    ]
    texts = [text for text, _ in system if text]
    if texts:
        out.append({"role": "system", "content": "\n\n".join(texts)})
        origins.append(system[0][1])
    for m, message in enumerate(body.messages):
        where = f"messages[{m}]"
        blocks = _blocks(message.content)
        if message.role == "user":
            for made, origin in _user_messages(blocks, f"{where}.content"):
                out.append(made)
                origins.append(origin or where)
        elif message.role == "assistant":
            made, calls = _assistant_message(blocks, f"{where}.content")
            if calls:
                paths.calls[len(out)] = calls
            out.append(made)
            origins.append(where)
    return out


def _user_messages(blocks: list[Any], where: str) -> list[tuple[dict[str, Any], str | None]]:
    out: list[tuple[dict[str, Any], str | None]] = []
    rest: list[Any] = []
    for i, block in enumerate(blocks):
        if not isinstance(block, wire.ToolResultBlock):
            rest.append(block)
            continue
        at = f"{where}[{i}]"
        value = _content(_parts(_blocks(block.content), f"{at}.content"))
        if block.is_error and isinstance(value, str):
            value = f"Error: {value}"
        out.append(({"role": "tool", "tool_call_id": block.tool_use_id, "content": value}, at))
    if rest:
        out.append(({"role": "user", "content": _content(_parts(rest, where))}, None))
    return out


def _assistant_message(blocks: list[Any], where: str) -> tuple[dict[str, Any], list[str]]:
    """The assistant's message, and the path of the block of each of its calls."""
    text, reasoning, calls, origins = [], [], [], []
    for i, block in enumerate(blocks):
        if isinstance(block, wire.TextBlock):
            text.append(block.text)
        elif isinstance(block, wire.ThinkingBlock):
            reasoning.append(block.thinking)
        elif isinstance(block, wire.RedactedThinkingBlock):
            continue  # nothing a local model can read
        elif isinstance(block, wire.ToolUseBlock):
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": block.input},
                }
            )
            origins.append(f"{where}[{i}]")
        else:
            raise APIError(
                400,
                f"'{where}[{i}].type' is {block.type!r}; assistant turns hold 'text', "
                "'thinking' and 'tool_use' blocks",
                param=f"{where}[{i}].type",
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    return message, origins


def read_tools(
    body: wire.MessagesRequest, paths: WirePaths, left_out: list[str]
) -> list[dict[str, Any]] | None:
    """The client tools as the chat core's function tools. A tool of another type (the
    server tools ``web_search_...``, ``code_execution_...``, and the tools whose schema
    only Anthropic's models know) is left out of the prompt: its path goes in
    ``left_out`` (the ignored-fields header), where each tool kept came from in
    ``paths``."""
    if not body.tools:
        return None
    out = []
    origins: list[str] = []
    for i, tool in enumerate(body.tools):
        if tool.type not in (None, "custom"):
            left_out.append(f"tools[{i}]")
            continue
        origins.append(f"tools[{i}]")
        function: dict[str, Any] = {
            "name": tool.name,
            "description": tool.description or "",
            "parameters": tool.input_schema or {"type": "object", "properties": {}},
        }
        out.append({"type": "function", "function": function})
    paths.tools = origins
    return out or None


def read_tool_choice(choice: wire.ToolChoice | None) -> tuple[Any, bool | None]:
    """Anthropic's tool choice as the chat core's, and whether calls may be parallel."""
    if choice is None:
        return None, None
    parallel = (
        None if choice.disable_parallel_tool_use is None else not choice.disable_parallel_tool_use
    )
    if choice.type == "tool":
        if not choice.name:
            raise APIError(
                400,
                "'tool_choice.name' is required with type 'tool': the tool to call",
                param="tool_choice.name",
            )
        return choice.name, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel


def read_parts(body: wire.MessagesRequest, left_out: list[str]) -> ChatParts:
    """The chat-core pieces of a request (the paths of the tools left out go in
    ``left_out``); its thinking settings come in :func:`fit_reasoning`, once the model
    is known."""
    output = body.output_config
    response_format = None
    if output is not None and output.format is not None:
        response_format = {"type": "json_schema", "json_schema": {"schema": output.format.schema_}}
    paths = WirePaths(fields=_FIELDS, tool_fields=_TOOL_FIELDS, call_fields=_CALL_FIELDS)
    tools = read_tools(body, paths, left_out)
    tool_choice, parallel = read_tool_choice(body.tool_choice)
    return ChatParts(
        model=body.model,
        messages=read_messages(body, paths),
        paths=paths,
        tools=tools,
        tool_choice=tool_choice if tools else None,
        parallel_tool_calls=parallel,
        response_format=response_format,
        max_tokens=body.max_tokens,
        stop=body.stop_sequences or None,
        **sampling_fields(body),
    )


# Anthropic's effort levels as the chat core's reasoning_effort ("max" is its "high").
_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "high"}


def fit_reasoning(
    parts: ChatParts, body: wire.MessagesRequest, switch: ReasoningSwitch
) -> list[str]:
    """``thinking`` and ``output_config.effort`` as the model's template takes them.

    ``enabled`` and ``adaptive`` turn thinking on (``enabled``'s ``budget_tokens`` caps
    it: ``thinking_budget``), ``disabled`` turns it off; the effort is the template's
    ``reasoning_effort`` (``max`` is ``high``; a level the template lacks, the nearest
    one it takes). A model that does not think has no use for a budget or an effort,
    and thinking turned off none for an effort: those are left out, not refused.

    Returns:
        The paths of the fields left out (for the ignored-fields header).
    """
    left_out: list[str] = []
    thinking, output = body.thinking, body.output_config
    effort = output.effort if output is not None else None
    if thinking is not None:
        parts.enable_thinking = thinking.type != "disabled"
        if thinking.type == "enabled" and thinking.budget_tokens is not None:
            if switch.thinks:
                parts.thinking_budget = thinking.budget_tokens
            else:
                left_out.append("thinking.budget_tokens")
    if effort is not None:
        level = _EFFORTS.get(effort)
        fitted = nearest_effort(level, switch) if level is not None else None
        if fitted is None or parts.enable_thinking is False:
            left_out.append("output_config.effort")
        else:
            parts.reasoning_effort = fitted
    return left_out


# ----------------------------------------------------------------- response


def stop_reason(finished: Finished) -> Any:
    if finished.finish_reason == "tool_calls":
        return "tool_use"
    if finished.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if finished.stop_sequence else "end_turn"


def anthropic_usage(finished: Finished) -> wire.Usage:
    # Anthropic's input_tokens leaves out the tokens read from the cache.
    return wire.Usage(
        input_tokens=finished.prompt_tokens - finished.cached_tokens,
        output_tokens=finished.completion_tokens,
        cache_read_input_tokens=finished.cached_tokens,
        cache_creation_input_tokens=0,
    )


def _tool_use(call: ParsedToolCall, arguments: bool = True) -> wire.ToolUseOut:
    return wire.ToolUseOut(id=call.id, name=call.name, input=call.arguments if arguments else {})


def _message(message_id: str, model: str) -> wire.Message:
    return wire.Message(
        id=message_id, model=model, usage=wire.Usage(input_tokens=0, output_tokens=0)
    )


async def whole_message(
    events: AsyncIterator[Event | Finished | Started], message_id: str, model: str
) -> wire.Message:
    """The non-streamed message: its blocks in the order the model wrote them."""
    body = _message(message_id, model)
    blocks = body.content
    async with closing(events):
        async for event in events:
            last = blocks[-1] if blocks else None
            if isinstance(event, (TextDelta, InvalidToolCall)):
                text = event.text if isinstance(event, TextDelta) else event.raw
                if isinstance(last, wire.TextOut):
                    last.text += text
                else:
                    blocks.append(wire.TextOut(text=text))
            elif isinstance(event, ReasoningDelta):
                if isinstance(last, wire.ThinkingOut):
                    last.thinking += event.text
                else:
                    blocks.append(wire.ThinkingOut(thinking=event.text))
            elif isinstance(event, ParsedToolCall):
                blocks.append(_tool_use(event))
            elif isinstance(event, Finished):
                body.stop_reason = stop_reason(event)
                body.stop_sequence = event.stop_sequence
                body.usage = anthropic_usage(event)
    return body


_PING = sse(wire.StreamEvent(type="ping"), "ping")


class MessageStream:
    """The streamed message, event by event.

    ``message_start`` comes first, once the prompt is counted (the turn's
    :class:`~mlx_integrations.chat.completion.Started`), with its ``input_tokens``;
    while the prompt is processed the keep-alive is a ``ping`` event, as the API sends
    (an SSE comment before ``message_start``, which must come first).
    """

    def __init__(self, message_id: str, model: str):
        self.message_id = message_id
        self.model = model
        self.started = False

    def keepalive(self) -> bytes:
        return _PING if self.started else KEEPALIVE_COMMENT

    def _start(self, prompt_tokens: int) -> bytes:
        message = _message(self.message_id, self.model)
        # Cached tokens are not known before the prefill: the count here is all of
        # them, and message_delta's usage splits it (input and cache_read add up to it).
        message.usage.input_tokens = prompt_tokens
        self.started = True
        return _frame("message_start", message=message)

    async def frames(
        self, events: AsyncIterator[Event | Finished | Started]
    ) -> AsyncIterator[bytes]:
        index = -1
        open_kind: str | None = None

        def start(block: Any) -> bytes:
            nonlocal index, open_kind
            index += 1
            open_kind = block.type
            return _frame("content_block_start", index=index, content_block=block)

        def delta(delta: Any) -> bytes:
            return _frame("content_block_delta", index=index, delta=delta)

        def stop() -> bytes:
            nonlocal open_kind
            open_kind = None
            return _frame("content_block_stop", index=index)

        async with closing(events):
            async for event in events:
                if not self.started:
                    yield self._start(event.prompt_tokens if isinstance(event, Started) else 0)
                    yield _PING
                if isinstance(event, Started):
                    continue
                if isinstance(event, (TextDelta, InvalidToolCall)):
                    if open_kind != "text":
                        if open_kind is not None:
                            yield stop()
                        yield start(wire.TextOut(text=""))
                    text = event.text if isinstance(event, TextDelta) else event.raw
                    yield delta(wire.TextDeltaOut(text=text))
                elif isinstance(event, ReasoningDelta):
                    if open_kind != "thinking":
                        if open_kind is not None:
                            yield stop()
                        yield start(wire.ThinkingOut(thinking=""))
                    yield delta(wire.ThinkingDeltaOut(thinking=event.text))
                elif isinstance(event, ParsedToolCall):
                    if open_kind is not None:
                        yield stop()
                    yield start(_tool_use(event, arguments=False))
                    arguments = json.dumps(event.arguments, ensure_ascii=False)
                    yield delta(wire.InputJSONDelta(partial_json=arguments))
                    yield stop()
                elif isinstance(event, Finished):
                    if open_kind is not None:
                        yield stop()
                    yield _frame(
                        "message_delta",
                        delta=wire.MessageDelta(
                            stop_reason=stop_reason(event), stop_sequence=event.stop_sequence
                        ),
                        usage=anthropic_usage(event),
                    )
        yield _frame("message_stop")


def _frame(kind: str, **fields: Any) -> bytes:
    return sse(wire.StreamEvent(type=kind, **fields), kind)


def anthropic_error_frame(exc: BaseException) -> bytes:
    return sse(anthropic_error_body(api_error(exc)), "error")


# ----------------------------------------------------------------- handlers


async def messages(body: wire.MessagesRequest, request: Request) -> Response:
    """Answer ``POST /v1/messages``."""
    state: ServerState = request.app.state.server
    left_out: list[str] = []
    parts = read_parts(body, left_out)
    served = await state.served(parts.model)
    switch = await reasoning_switch_of(served)
    accepted = Accepted(request, body, left_out + fit_reasoning(parts, body, switch))
    message_id = new_id("msg_")
    chat = state.chat_request(served, parts, request_id=message_id)
    events = state.turn(served, chat, body.stream, parts.paths, announce=body.stream)
    if not body.stream:
        reply = await until_disconnected(
            request.receive, whole_message(events, message_id, parts.model)
        )
        return json_reply(reply, accepted)
    stream = MessageStream(message_id, parts.model)
    return await stream_reply(
        request, events, stream.frames, anthropic_error_frame, accepted, stream.keepalive
    )


async def count_tokens(body: wire.CountTokensRequest, request: Request) -> Response:
    """Answer ``POST /v1/messages/count_tokens``: the prompt's tokens through the model's
    chat template, tools included (what ``usage.input_tokens`` of a call reports,
    cached tokens included)."""
    state: ServerState = request.app.state.server
    left_out: list[str] = []
    parts = read_parts(body, left_out)
    served = await state.served(parts.model)
    switch = await reasoning_switch_of(served)
    accepted = Accepted(request, body, left_out + fit_reasoning(parts, body, switch))
    chat = state.chat_request(served, parts)
    tokens = await state.prompt_tokens(served, chat, parts.paths)
    return json_reply(wire.CountTokensReply(input_tokens=tokens), accepted)
