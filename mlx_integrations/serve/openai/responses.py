"""``POST /v1/responses``: OpenAI's Responses API, for clients that speak only it.

A request carries its conversation in ``input`` (messages, tool calls and their
outputs), or continues a kept response with ``previous_response_id``: responses are
kept (``store``, OpenAI's default) in memory, for a while (:mod:`.response_store`).
Text, images (``input_image``), function tools (a ``namespace``'s too) and custom
(freeform) tools (:mod:`.custom_tools`) with ``tool_choice`` enforced, ``text.format``
(JSON object or schema), the answer's token log-probabilities (``include:
["message.output_text.logprobs"]``, ``top_logprobs``) and streaming are served;
reasoning comes back as a ``reasoning`` item (in clear: ``include``'s encrypted
reasoning is not made here). The hosted API's own tools (``web_search``...) are left
out of the prompt and named in the ignored-fields header.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple

from starlette.requests import Request
from starlette.responses import Response

from mlx_integrations.chat.completion import (
    Finished,
    InvalidToolCall,
    ParsedToolCall,
    ReasoningDelta,
    TextDelta,
)
from mlx_integrations.chat.reasoning import EFFORT_LEVELS, ReasoningSwitch
from mlx_integrations.serve.errors import APIError, api_error, openai_error_body
from mlx_integrations.serve.openai import custom_tools
from mlx_integrations.serve.openai.chat import core_response_format
from mlx_integrations.serve.openai.logprobs import Entry, with_answer_logprobs
from mlx_integrations.serve.paths import WirePaths
from mlx_integrations.serve.protocol import responses as wire
from mlx_integrations.serve.replies import Accepted, json_reply, new_id, now, stream_reply
from mlx_integrations.serve.sse import closing, sse, until_disconnected
from mlx_integrations.serve.state import (
    ChatParts,
    ServerState,
    nearest_effort,
    reasoning_switch_of,
    sampling_fields,
)

__all__ = ["responses"]

# The chat core's names of the fields this API names otherwise.
_FIELDS = {
    "max_tokens": "max_output_tokens",
    "response_format.json_schema": "text.format",
    "response_format": "text.format",
    "reasoning_effort": "reasoning.effort",
}
_TOOL_FIELDS = {
    "function.parameters": "parameters",
    "function.name": "name",
    "function.description": "description",
    "function": "",
}
_CALL_FIELDS = {"function.name": "name", "function.arguments": "arguments", "function": ""}
_LOGPROBS = "message.output_text.logprobs"


# ------------------------------------------------------------------ request


def _content(content: str | list[Any], where: str) -> Any:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        if isinstance(part, wire.InputText):
            parts.append({"type": "text", "text": part.text})
        elif isinstance(part, wire.InputImage):
            if part.image_url is None:
                raise APIError(
                    400,
                    f"'{where}[{i}].image_url' is required: give the image as a URL or a "
                    "data: URL (file_id is not served)",
                    param=f"{where}[{i}].image_url",
                )
            parts.append({"type": "image", "image": part.image_url})
        else:
            raise APIError(
                400,
                f"'{where}[{i}].type' is {part.type!r}; use 'input_text' or 'input_image' "
                "(files are not served)",
                param=f"{where}[{i}].type",
            )
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def input_items(body: wire.ResponsesRequest, earlier: list[Any]) -> list[Any]:
    """The conversation's input items: those of the response it continues (its
    inputs and outputs), then ``input`` (a string is a user message)."""
    if isinstance(body.input, str):
        return [*earlier, wire.MessageItem.model_validate({"role": "user", "content": body.input})]
    return [*earlier, *body.input]


def read_input(
    body: wire.ResponsesRequest, paths: WirePaths, earlier: list[Any] | None = None
) -> list[dict[str, Any]]:
    """``instructions``, the items of the response it continues (``earlier``) and
    ``input`` as chat-core messages; where each message and each call came from goes in
    ``paths`` (the earlier items are named ``previous_response_id``)."""
    messages: list[dict[str, Any]] = []
    origins: list[str] = []
    paths.messages = origins
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
        origins.append("instructions")
    before = len(earlier or ())
    for i, item in enumerate(input_items(body, earlier or [])):
        if i < before:
            where = "previous_response_id"
        else:
            where = "input" if isinstance(body.input, str) else f"input[{i - before}]"
        if isinstance(item, wire.MessageItem):
            role = "system" if item.role == "developer" else item.role
            messages.append({"role": role, "content": _content(item.content, f"{where}.content")})
            origins.append(where)
        elif isinstance(item, (wire.FunctionCallItem, wire.CustomToolCallItem)):
            arguments = (
                item.arguments
                if isinstance(item, wire.FunctionCallItem)
                else custom_tools.call_arguments(item.input)
            )
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": arguments},
            }
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                messages.append(last)
                origins.append(where)
            last.setdefault("tool_calls", []).append(call)
            paths.calls.setdefault(len(messages) - 1, []).append(where)
        elif isinstance(item, (wire.FunctionCallOutputItem, wire.CustomToolCallOutputItem)):
            output = item.output
            content = output if isinstance(output, str) else _content(output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": content})
            origins.append(where)
        elif isinstance(item, wire.ReasoningItem):
            continue  # the model's earlier reasoning is not shown to it again
        else:
            raise APIError(
                400,
                f"'{where}.type' is {item.type!r}; use 'message', 'function_call', "
                "'function_call_output', 'custom_tool_call' or 'custom_tool_call_output'",
                param=f"{where}.type",
            )
    return messages


def _function(tool: wire.FunctionTool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.parameters is not None:
        function["parameters"] = tool.parameters
    return {"type": "function", "function": function}


def read_tools(
    body: wire.ResponsesRequest, paths: WirePaths
) -> tuple[list[dict[str, Any]], list[str], set[str]]:
    """The tools as the chat core's function tools (a namespace's functions, and each
    custom tool as a function of one string), the paths of the tools left out (the
    hosted API's own: ``web_search``...), and the names of the custom tools."""
    out: list[dict[str, Any]] = []
    origins: list[str] = []
    left_out: list[str] = []
    custom: set[str] = set()
    for i, tool in enumerate(body.tools or ()):
        if isinstance(tool, wire.FunctionTool):
            out.append(_function(tool))
            origins.append(f"tools[{i}]")
        elif isinstance(tool, wire.NamespaceTool):
            for j, inner in enumerate(tool.tools):
                out.append(_function(inner))
                origins.append(f"tools[{i}].tools[{j}]")
        elif isinstance(tool, wire.CustomTool):
            out.append(custom_tools.as_function(tool))
            origins.append(f"tools[{i}]")
            custom.add(tool.name)
        else:
            left_out.append(f"tools[{i}]")
    paths.tools = origins
    return out, left_out, custom


def read_tool_choice(body: wire.ResponsesRequest) -> Any:
    choice = body.tool_choice
    if isinstance(choice, wire.ToolChoiceObject):
        if choice.type in ("function", "custom") and choice.name:
            return choice.name
        raise APIError(
            400,
            "'tool_choice' must be 'auto', 'none', 'required', or {'type': 'function', "
            "'name': ...} or {'type': 'custom', 'name': ...}",
            param="tool_choice",
        )
    return choice


def read_format(value: Any) -> dict[str, Any] | None:
    """``text.format`` as the chat core's ``response_format``."""
    if isinstance(value, wire.JSONSchemaTextFormat):
        return {"type": "json_schema", "json_schema": {"name": value.name, "schema": value.schema_}}
    return core_response_format(value)


# OpenAI's effort levels as the chat core's (its lowest thinking level is "low", its
# highest "high"); another value is refused by the chat core, naming the field.
_EFFORTS = {"minimal": "low", "xhigh": "high"}


def fit_effort(parts: ChatParts, switch: ReasoningSwitch) -> list[str]:
    """``reasoning.effort`` as the model's template takes it: Codex sends one to every
    model. A level the template lacks is the nearest one it takes; a model that does
    not think (or cannot stop) leaves it out.

    Returns:
        ``["reasoning.effort"]`` when it was left out, else nothing.
    """
    level = parts.reasoning_effort
    if level is None or level not in (*EFFORT_LEVELS, *_EFFORTS):
        return []  # the chat core says what is wrong with it
    fitted = nearest_effort(_EFFORTS.get(level, level), switch)
    parts.reasoning_effort = fitted
    return [] if fitted is not None else ["reasoning.effort"]


class Read(NamedTuple):
    """A request read: its chat-core pieces, the paths of what was left out, the
    names of its custom tools (whose calls come back as ``custom_tool_call`` items),
    and the fields declared unused that it uses."""

    parts: ChatParts
    left_out: list[str]
    custom: set[str]
    used: set[str]


def read_parts(body: wire.ResponsesRequest, earlier: list[Any] | None = None) -> Read:
    """The chat-core pieces of a request (continuing the conversation ``earlier``),
    and what was left out of them."""
    paths = WirePaths(fields=_FIELDS, tool_fields=_TOOL_FIELDS, call_fields=_CALL_FIELDS)
    tools, left_out, custom = read_tools(body, paths)
    include = body.include or []
    logprobs = _LOGPROBS in include
    used = {"include"} if logprobs and set(include) == {_LOGPROBS} else set()
    if body.top_logprobs is not None and not logprobs:
        left_out.append("top_logprobs")  # OpenAI's top_logprobs come with the include
    parts = ChatParts(
        model=body.model,
        messages=read_input(body, paths, earlier),
        paths=paths,
        tools=tools or None,
        tool_choice=read_tool_choice(body) if tools else None,
        parallel_tool_calls=body.parallel_tool_calls,
        response_format=read_format(body.text.format if body.text else None),
        max_tokens=body.max_output_tokens,
        reasoning_effort=body.reasoning.effort if body.reasoning else None,
        logprobs=True if logprobs else None,
        top_logprobs=body.top_logprobs if logprobs else None,
        **sampling_fields(body),
    )
    return Read(parts, left_out, custom, used)


# ----------------------------------------------------------------- response


def _dumped(value: Any) -> Any:
    if isinstance(value, list):
        return [_dumped(v) for v in value]
    if hasattr(value, "model_dump"):
        return value.model_dump(by_alias=True, exclude_unset=True)
    return value


class _Builder:
    """The response object and its output items, built from the turn's events."""

    def __init__(
        self,
        response_id: str,
        body: wire.ResponsesRequest,
        custom: set[str],
        store: bool = False,
        on_finish: Callable[[wire.Response], None] | None = None,
    ):
        self.custom = custom
        """The custom tools' names: their calls are ``custom_tool_call`` items."""
        self.on_finish = on_finish
        """Called with the finished response before its last event (to keep it)."""
        self.response = wire.Response(
            id=response_id,
            created_at=now(),
            model=body.model,
            parallel_tool_calls=body.parallel_tool_calls is not False,
            tool_choice=_dumped(body.tool_choice) if body.tool_choice is not None else "auto",
            tools=_dumped(body.tools or []),
            temperature=body.temperature,
            top_p=body.top_p,
            max_output_tokens=body.max_output_tokens,
            instructions=body.instructions,
            text=_dumped(body.text) if body.text is not None else {"format": {"type": "text"}},
            metadata=body.metadata or {},
            previous_response_id=body.previous_response_id,
            store=store,
            top_logprobs=body.top_logprobs,
        )
        self.sequence = 0

    @property
    def output(self) -> list[Any]:
        return self.response.output

    def event(self, kind: str, **fields: Any) -> bytes:
        frame = wire.ResponseEvent(type=kind, sequence_number=self.sequence, **fields)
        self.sequence += 1
        return sse(frame, kind)

    def failed(self, exc: BaseException) -> bytes:
        """``response.failed``: what ends a stream that met an error (or a server that
        stops) after its first event; the response carries the error."""
        error = openai_error_body(api_error(exc)).error
        self.response.status = "failed"
        self.response.error = wire.ResponseError(
            code=error.code or error.type, message=error.message
        )
        return self.event("response.failed", response=self.response)

    def finish(self, finished: Finished) -> None:
        truncated = finished.finish_reason == "length"
        self.response.status = "incomplete" if truncated else "completed"
        if truncated:
            self.response.incomplete_details = wire.IncompleteDetails(reason="max_output_tokens")
        self.response.usage = wire.ResponseUsage(
            input_tokens=finished.prompt_tokens,
            input_tokens_details=wire.InputTokensDetails(cached_tokens=finished.cached_tokens),
            output_tokens=finished.completion_tokens,
            output_tokens_details=wire.OutputTokensDetails(),
            total_tokens=finished.prompt_tokens + finished.completion_tokens,
        )
        if self.on_finish is not None:
            self.on_finish(self.response)


def _call_item(call: ParsedToolCall) -> wire.OutputFunctionCall:
    return wire.OutputFunctionCall(
        id=new_id("fc_"),
        call_id=call.id,
        name=call.name,
        arguments=json.dumps(call.arguments, ensure_ascii=False),
    )


def _custom_call_frames(call: ParsedToolCall, built: _Builder) -> list[bytes]:
    """A custom tool's call: a ``custom_tool_call`` item and its input's events."""
    item = wire.OutputCustomToolCall(
        id=new_id("ctc_"), call_id=call.id, name=call.name, input=custom_tools.input_of(call)
    )
    built.output.append(item)
    index = len(built.output) - 1
    shown = item.model_copy(update={"input": "", "status": "in_progress"})
    at = {"item_id": item.id, "output_index": index}
    return [
        built.event("response.output_item.added", output_index=index, item=shown),
        built.event("response.custom_tool_call_input.delta", delta=item.input, **at),
        built.event("response.custom_tool_call_input.done", input=item.input, **at),
        built.event("response.output_item.done", output_index=index, item=item),
    ]


async def response_frames(
    events: AsyncIterator[Any], built: _Builder, logprobs: bool = False
) -> AsyncIterator[bytes]:
    """The streamed response: created, items added, deltas, items done, completed.

    With ``logprobs`` (a turn with :class:`Logprobs` events), a text delta carries the
    log-probabilities of the answer's tokens it brings (:func:`with_answer_logprobs`),
    and the message's ``output_text`` all of them.
    """
    yield built.event("response.created", response=built.response)
    yield built.event("response.in_progress", response=built.response)
    open_item: wire.OutputMessage | wire.OutputReasoning | None = None

    def close() -> list[bytes]:
        nonlocal open_item
        item, open_item = open_item, None
        if item is None:
            return []
        index = len(built.output) - 1
        item.status = "completed"
        at = {"item_id": item.id, "output_index": index, "content_index": 0}
        frames = []
        if isinstance(item, wire.OutputMessage):
            part = item.content[0]
            frames.append(
                built.event(
                    "response.output_text.done", text=part.text, logprobs=part.logprobs, **at
                )
            )
            frames.append(built.event("response.content_part.done", part=part, **at))
        else:
            text = item.content[0].text
            frames.append(built.event("response.reasoning_text.done", text=text, **at))
        frames.append(built.event("response.output_item.done", output_index=index, item=item))
        return frames

    def open_(item: wire.OutputMessage | wire.OutputReasoning) -> list[bytes]:
        nonlocal open_item
        frames = close()
        open_item = item
        built.output.append(item)
        index = len(built.output) - 1
        frames.append(built.event("response.output_item.added", output_index=index, item=item))
        if isinstance(item, wire.OutputMessage):
            item.content.append(wire.OutputText())
            frames.append(
                built.event(
                    "response.content_part.added",
                    item_id=item.id,
                    output_index=index,
                    content_index=0,
                    part=wire.OutputText(),
                )
            )
        else:
            item.content.append(wire.ReasoningText())
        return frames

    def late(tokens: list[Entry]) -> None:
        """Tokens of an answer whose message is closed: its ``output_text`` has them."""
        messages = [i for i in built.output if isinstance(i, wire.OutputMessage)]
        if messages and messages[-1].content:
            messages[-1].content[0].logprobs += tokens

    async with closing(with_answer_logprobs(events, logprobs)) as pairs:
        async for event, tokens in pairs:
            if event is None and not isinstance(open_item, wire.OutputMessage):
                late(tokens or [])
            elif event is None or isinstance(event, (TextDelta, InvalidToolCall)):
                text = (
                    ""
                    if event is None
                    else event.text
                    if isinstance(event, TextDelta)
                    else event.raw
                )
                if not isinstance(open_item, wire.OutputMessage):
                    for frame in open_(wire.OutputMessage(id=new_id("msg_"))):
                        yield frame
                assert isinstance(open_item, wire.OutputMessage)
                open_item.content[0].text += text
                open_item.content[0].logprobs += tokens or []
                yield built.event(
                    "response.output_text.delta",
                    item_id=open_item.id,
                    output_index=len(built.output) - 1,
                    content_index=0,
                    delta=text,
                    logprobs=tokens or [],
                )
            elif isinstance(event, ReasoningDelta):
                if not isinstance(open_item, wire.OutputReasoning):
                    for frame in open_(wire.OutputReasoning(id=new_id("rs_"))):
                        yield frame
                assert isinstance(open_item, wire.OutputReasoning)
                open_item.content[0].text += event.text
                yield built.event(
                    "response.reasoning_text.delta",
                    item_id=open_item.id,
                    output_index=len(built.output) - 1,
                    content_index=0,
                    delta=event.text,
                )
            elif isinstance(event, ParsedToolCall) and event.name in built.custom:
                for frame in close():
                    yield frame
                for frame in _custom_call_frames(event, built):
                    yield frame
            elif isinstance(event, ParsedToolCall):
                for frame in close():
                    yield frame
                item = _call_item(event)
                built.output.append(item)
                index = len(built.output) - 1
                shown = item.model_copy(update={"arguments": "", "status": "in_progress"})
                yield built.event("response.output_item.added", output_index=index, item=shown)
                at = {"item_id": item.id, "output_index": index}
                yield built.event(
                    "response.function_call_arguments.delta", delta=item.arguments, **at
                )
                yield built.event(
                    "response.function_call_arguments.done",
                    name=item.name,
                    arguments=item.arguments,
                    **at,
                )
                yield built.event("response.output_item.done", output_index=index, item=item)
            elif isinstance(event, Finished):
                for frame in close():
                    yield frame
                built.finish(event)
                # Cut at max_output_tokens too: the status says "incomplete", and the
                # SDK's stream helper, which waits for this event, gets its response.
                yield built.event("response.completed", response=built.response)


async def whole_response(
    events: AsyncIterator[Any], built: _Builder, logprobs: bool = False
) -> wire.Response:
    """The non-streamed response (the same items the stream builds)."""
    async for _ in response_frames(events, built, logprobs):
        pass
    return built.response


async def responses(body: wire.ResponsesRequest, request: Request) -> Response:
    """Answer ``POST /v1/responses``."""
    state: ServerState = request.app.state.server
    kept = state.responses
    earlier: list[Any] = []
    if body.previous_response_id is not None:
        found = kept.find(body.previous_response_id, param="previous_response_id")
        earlier = found.conversation()
    parts, left_out, custom, used = read_parts(body, earlier)
    served = await state.served(parts.model)
    if parts.reasoning_effort is not None:
        left_out += fit_effort(parts, await reasoning_switch_of(served))
    store = body.store is not False and kept.size > 0
    if body.store and not store:
        left_out.append("store")  # this server keeps none (--responses-store-size 0)
    accepted = Accepted(request, body, left_out, used)
    items = input_items(body, earlier)
    built = _Builder(
        new_id("resp_"),
        body,
        custom,
        store=store,
        on_finish=(lambda response: kept.put(response, items)) if store else None,
    )
    chat = state.chat_request(served, parts, request_id=built.response.id)
    logprobs = chat.logprobs is not None
    # Logprobs are sorted by the events of each engine chunk: a streamed turn.
    events = state.turn(
        served, chat, body.stream or logprobs, parts.paths, body.stream, logprobs=logprobs
    )
    if not body.stream:
        reply = await until_disconnected(request.receive, whole_response(events, built, logprobs))
        return json_reply(reply, accepted)

    def frames(events: AsyncIterator[Any]) -> AsyncIterator[bytes]:
        return response_frames(events, built, logprobs)

    return await stream_reply(request, events, frames, built.failed, accepted)
