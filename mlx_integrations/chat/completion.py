"""One chat turn against any engine, as a stream of typed events.

Both adapters, ``mlxi run`` and ``mlxi serve`` stand on this: they build a checked
:class:`~mlx_integrations.chat.request.ChatRequest` at their edge; the turn hands it to
an engine of ours whole (:class:`~mlx_integrations.chat.request.RequestEngine`, which
builds the constraints once it has rendered the prompt), or to any other engine as the
contract's keyword arguments with the constraints as logits processors; then it splits
the reply into text, reasoning and tool calls, and ends with the usage and finish reason.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

from mlx_integrations.chat.constraints import constraint_processors, format_instructions
from mlx_integrations.chat.media_parts import reject_media_for_text_model
from mlx_integrations.chat.output_parser import (
    ChatOutputParser,
    Event,
    Logprobs,
    ParsedOutput,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
)
from mlx_integrations.chat.reasoning import (
    ThinkingBudgetProcessor,
    apply_effort,
    reasoning_token_count,
    think_markers,
)
from mlx_integrations.chat.request import ChatRequest, RequestEngine
from mlx_integrations.chat.schemas import unenforced_keywords
from mlx_integrations.chat.tool_formats import (
    InvalidToolCall,
    ParsedToolCall,
    ToolFormat,
    detect_format,
)
from mlx_integrations.chat.tools import ToolChoiceMode, ToolRequest
from mlx_integrations.engine.base import BaseEngine, GenerationOutput

__all__ = [
    "ChatRequest",
    "Finished",
    "InvalidToolCall",
    "Logprobs",
    "ParsedToolCall",
    "ReasoningDelta",
    "Started",
    "TextDelta",
    "Turn",
    "engine_tool_format",
    "stream_chat_events",
    "timeout_message",
    "within_timeout",
]

T = TypeVar("T")


@dataclass
class Started:
    """The first event of a turn when it is asked for (``announce=True``): the prompt
    is rendered and counted, and the engine is about to process it.

    Our engines say so before the prompt is prefilled; another engine's turn says so
    with its first output.
    """

    prompt_tokens: int


@dataclass
class Finished:
    """The last event of a turn."""

    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    model_name: str
    ttft_s: float
    generation_tps: float
    model_path: str | None
    """The folder the engine loaded the model from, where the engine says
    (``MLXEngine.model_path``); ``model_name`` is the name as given."""
    text: str
    """The raw reply, markup included (for debugging and ``include_raw``)."""
    draft_tokens: int = 0
    """Tokens drafted by speculative decoding (0 when it did not run)."""
    accepted_draft_tokens: int = 0
    """Drafted tokens the model accepted."""
    stop_sequence: str | None = None
    """The stop sequence that ended the reply, where the engine says (None for the
    end-of-sequence token, the token limit, or an engine that does not say)."""
    reasoning_tokens: int = 0
    """Tokens of the reply inside thinking blocks (counted from the engine's tokens;
    0 where it gives none)."""
    logprobs: list[dict[str, Any]] | None = None
    """Where the request asked for them (``logprobs``/``top_logprobs``) and the engine
    gives them (ours do): every generated token's log-probability, in order, in
    OpenAI's ``logprobs.content`` shape (:func:`logprob_content`)."""

    def speculative_metadata(self) -> dict[str, Any]:
        """Acceptance figures for the adapters' metadata; empty without speculation."""
        return speculative_metadata(self.draft_tokens, self.accepted_draft_tokens)


def speculative_metadata(drafted: int, accepted: int) -> dict[str, Any]:
    """``draft_tokens``, ``accepted_draft_tokens`` and ``draft_acceptance_rate``, or {}
    when nothing was drafted."""
    if not drafted:
        return {}
    return {
        "draft_tokens": drafted,
        "accepted_draft_tokens": accepted,
        "draft_acceptance_rate": round(accepted / drafted, 4),
    }


@dataclass
class Turn(ParsedOutput):
    """A chat turn folded from its events, as both adapters build their replies.

    Attributes:
        finished: The last event (usage, finish reason), once it has come.
    """

    finished: Finished | None = None

    def add(self, event: Event | Finished) -> None:
        """Fold one more event in (text, reasoning, a call, or the end of the turn)."""
        if isinstance(event, Finished):
            self.finished = event
        else:
            super().add(event)


def engine_tool_format(engine: BaseEngine, override: str | ToolFormat | None = None) -> ToolFormat:
    """The tool-call family the engine's model writes (picked once per model), or the
    request's ``override``.

    Our engines pick it at load (their own ``tool_format`` option included); for any
    other engine it is detected from its tokenizer, and cached.
    """
    if isinstance(override, ToolFormat):
        return override
    if override:
        return detect_format(engine.tokenizer, override)
    if isinstance(engine, RequestEngine):
        return engine.tool_format
    return detect_format(engine.tokenizer)


def with_format_instructions(
    messages: list[dict[str, Any]], response_format: Any, tools: bool = False
) -> list[dict[str, Any]]:
    """Tell the model the JSON it must write; the constraint alone cannot tell it why.

    The grammar keeps the output valid, but a model that has not seen the schema
    fills it with whatever it was about to say. The instruction goes into the system
    message (one is added when there is none).
    """
    note = format_instructions(response_format, tools)
    if note is None:
        return messages
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0])
        content = first["content"]
        if isinstance(content, list):
            first["content"] = [*content, {"type": "text", "text": "\n\n" + note}]
        else:
            first["content"] = f"{content}\n\n{note}" if content else note
        return [first, *messages[1:]]
    return [{"role": "system", "content": note}, *messages]


async def _last(outputs: AsyncIterator[GenerationOutput]) -> GenerationOutput:
    """The last chunk of a stream: the whole output."""
    last = None
    async for last in outputs:  # noqa: B007
        pass
    assert last is not None, "the engine returned no output"
    return last


async def _whole(call: Awaitable[GenerationOutput]) -> AsyncIterator[GenerationOutput]:
    """A whole output as a stream of one chunk whose new text is all of it."""
    out = copy.copy(await call)  # any engine's output type, a dataclass or not
    out.new_text = out.text
    yield out


async def stream_chat_events(
    engine: BaseEngine,
    request: ChatRequest,
    stream: bool = True,
    announce: bool = False,
    logprob_events: bool = False,
) -> AsyncIterator[Event | Finished | Started | Logprobs]:
    """Run one chat turn and yield its events, ending with :class:`Finished`.

    With ``stream=False`` (a caller that collects the whole reply) the engine's
    ``chat`` answers in one piece, which the parser reads at once: the same events,
    without a chunk per token on the way. With ``announce`` (and ``stream``) the first
    event is :class:`Started`, with the prompt's token count (a server's first frame).
    With ``logprob_events`` (and ``stream``), where the request asked for
    log-probabilities, a :class:`Logprobs` event follows the events of each engine
    chunk; :attr:`Finished.logprobs` holds them all in any case.

    Raises:
        TimeoutError: The turn outlasted ``request.timeout`` (see :func:`within_timeout`).
    """
    events = _chat_events(engine, request, stream, announce and stream, logprob_events and stream)
    if request.timeout is not None:
        events = within_timeout(events, request.timeout, request.max_tokens)
    try:
        async for event in events:
            yield event
    finally:
        await cast(Any, events).aclose()  # an early exit aborts the request now, not at GC


def timeout_message(timeout: float, max_tokens: int) -> str:
    """What a call that outlasted its ``timeout`` says (its request was stopped)."""
    return (
        f"The call did not finish within timeout={timeout:g} s, so its request was "
        f"stopped on the engine. Raise timeout (None waits as long as the reply takes), "
        f"or lower max_tokens (now {max_tokens}) for a shorter reply."
    )


async def within_timeout(
    stream: AsyncIterator[T], timeout: float, max_tokens: int
) -> AsyncIterator[T]:
    """``stream``'s items until ``timeout`` seconds have passed since the first step.

    Each step runs as a task the deadline can cancel; a cancelled step ends the
    engine's stream, which stops its request between two tokens, and the engine
    serves the next request as usual.

    Raises:
        TimeoutError: The deadline passed before the stream ended; it says the
            ``timeout`` and what to change (:func:`timeout_message`).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while True:
            step = asyncio.ensure_future(_next(stream))
            try:
                await asyncio.wait({step}, timeout=max(deadline - loop.time(), 0.0))
            finally:
                timed_out = not step.done()
                if timed_out:  # (or this consumer was cancelled): end the step first
                    step.cancel()
                    await asyncio.wait({step})
            if timed_out:
                if not step.cancelled():
                    step.exception()  # retrieved: the deadline is what the caller hears of
                raise TimeoutError(timeout_message(timeout, max_tokens))
            try:
                item = step.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


def _model_path(engine: BaseEngine) -> str | None:
    path = getattr(engine, "model_path", None)
    return None if path is None else str(path)


async def _next(stream: AsyncIterator[T]) -> T:
    return await stream.__anext__()


async def _chat_events(
    engine: BaseEngine, request: ChatRequest, stream: bool, announce: bool, logprob_events: bool
) -> AsyncIterator[Event | Finished | Started | Logprobs]:
    if request.response_format is not None and request.tools.mode is ToolChoiceMode.AUTO:
        if repeats_a_call(request.messages):
            # A model that calls again what it was answered, instead of answering, is
            # looping (small models do, turn after turn): the answer is required now.
            request = request.replace(tools=replace(request.tools, mode=ToolChoiceMode.NONE))
    tools = request.tools
    request = request.replace(
        messages=with_format_instructions(request.messages, request.response_format, tools.active)
    )
    await engine.start()
    fmt = engine_tool_format(engine, request.tool_format)
    outputs: AsyncIterator[GenerationOutput]
    if isinstance(engine, RequestEngine):
        # Our engines build the constraints themselves once they have rendered the
        # prompt, so that they hold after a thinking block the prompt opens.
        outputs = engine.stream_request(
            request.replace(tool_format=fmt), final_only=not stream, announce=announce
        )
        if announce:  # its first output says the prompt is counted, before the prefill
            yield Started(prompt_tokens=(await anext(aiter(outputs))).prompt_tokens)
            announce = False
        if not stream:
            outputs = _whole(_last(outputs))
    else:
        outputs = await _foreign_outputs(engine, request, fmt, stream)
    openai_tools = tools.openai_tools()
    parser: ChatOutputParser | None = None
    started = time.perf_counter()
    first_at: float | None = None
    last = None
    saw_call = False
    logprobs: list[dict[str, Any]] = []
    async for out in outputs:
        if announce:  # an engine that cannot say it earlier says it with its first output
            yield Started(prompt_tokens=out.prompt_tokens)
            announce = False
        if parser is None:
            first_at = time.perf_counter()
            # The engine rendered the prompt and says whether it opened a thinking block.
            parser = ChatOutputParser(
                tool_format=fmt if tools.active else None,
                tools=openai_tools,
                think_markers=think_markers(engine.tokenizer),
                starts_in_reasoning=bool(getattr(out, "starts_in_reasoning", False)),
            )
        last = out
        if out.new_text:
            for event in parser.feed(out.new_text):
                saw_call |= isinstance(event, (ParsedToolCall, InvalidToolCall))
                yield _checked_call(event, tools)
        chunk_logprobs = getattr(out, "logprobs", None)
        if chunk_logprobs is not None:
            content = logprob_content(engine.tokenizer, chunk_logprobs)
            logprobs.extend(content)
            if logprob_events and content:
                yield Logprobs(content)
    assert last is not None and parser is not None, "the engine returned no output"
    for event in parser.finish():
        saw_call |= isinstance(event, (ParsedToolCall, InvalidToolCall))
        yield _checked_call(event, tools)
    reason = last.finish_reason
    if saw_call and reason == "stop":
        reason = "tool_calls"
    yield Finished(
        finish_reason=reason,
        prompt_tokens=last.prompt_tokens,
        completion_tokens=last.completion_tokens,
        cached_tokens=int(getattr(last, "cached_tokens", 0) or 0),
        model_name=request.model or engine.model_name,
        model_path=_model_path(engine),
        # Unknown (0.0) for a whole reply from an engine that does not time its first token.
        ttft_s=float(
            getattr(last, "ttft_s", 0.0) or ((first_at or started) - started if stream else 0.0)
        ),
        generation_tps=float(getattr(last, "generation_tps", 0.0) or 0.0),
        text=last.text,
        draft_tokens=last.mtp_drafts,
        accepted_draft_tokens=last.mtp_accepted,
        stop_sequence=getattr(last, "stop_sequence", None),
        reasoning_tokens=reasoning_token_count(
            list(getattr(last, "tokens", None) or []),
            engine.tokenizer,
            bool(getattr(last, "starts_in_reasoning", False)),
        ),
        logprobs=logprobs if getattr(last, "logprobs", None) is not None else None,
    )


def logprob_content(tokenizer: Any, entries: list[TokenLogprob]) -> list[dict[str, Any]]:
    """Token log-probabilities as OpenAI's ``logprobs.content`` lists them: each token's
    text, ``logprob`` and UTF-8 ``bytes`` (a token holding part of a character reads
    as U+FFFD in its text, its bytes exact), and its step's ``top_logprobs``."""

    def token(token_id: int, logprob: float) -> dict[str, Any]:
        data = token_bytes(tokenizer, token_id)
        return {
            "token": data.decode("utf-8", "replace"),
            "logprob": logprob,
            "bytes": list(data),
        }

    return [
        {
            **token(entry.token_id, entry.logprob),
            "top_logprobs": [token(i, lp) for i, lp in entry.top],
        }
        for entry in entries
    ]


def token_bytes(tokenizer: Any, token_id: int) -> bytes:
    """The bytes a token stands for: exact for byte-level BPE vocabularies (mlx-lm's
    own byte table), else the UTF-8 of its decoded text."""
    tokenmap = getattr(getattr(tokenizer, "detokenizer", None), "tokenmap", None)
    if tokenmap is not None and 0 <= token_id < len(tokenmap):
        try:  # _byte_decoder is mlx-lm's own table; a later mlx-lm may move it
            from mlx_lm.tokenizer_utils import _byte_decoder

            return bytes(map(_byte_decoder().__getitem__, tokenmap[token_id]))
        except (ImportError, KeyError):
            pass
    return str(tokenizer.decode([token_id])).encode("utf-8")


def repeats_a_call(messages: list[dict[str, Any]]) -> bool:
    """Whether the conversation holds one tool call twice (the same tool, the same
    arguments), in one turn or in two."""
    seen: set[tuple[str, str]] = set()
    for message in messages:
        for call in message.get("tool_calls") or ():
            function = call.get("function", call)
            key = (function.get("name"), json.dumps(function.get("arguments"), sort_keys=True))
            if key in seen:
                return True
            seen.add(key)
    return False


def _checked_call(event: Event, tools: ToolRequest) -> Event:
    """A parsed call, checked where the grammar did not hold it: a call of a tool that
    is not among the request's (a model writing calls freely, ``tool_choice`` auto) is
    an invalid call; so is one of a tool whose schema the grammar could not hold it to
    entirely (keywords such as ``propertyNames``) that fails the whole schema."""
    if not isinstance(event, ParsedToolCall):
        return event
    spec = next((t for t in tools.tools if t.name == event.name), None)
    if spec is None:
        names = ", ".join(t.name for t in tools.tools) or "none"
        return InvalidToolCall(
            raw=json.dumps({"name": event.name, "arguments": event.arguments}, ensure_ascii=False),
            error=f"The model called {event.name!r}, which is not among the request's tools "
            f"({names})",
            name=event.name,
            id=event.id,
        )
    if not unenforced_keywords(spec.parameters):
        return event
    from jsonschema import ValidationError, validate

    try:
        validate(event.arguments, spec.parameters)
    except ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the top level"
        return InvalidToolCall(
            raw=json.dumps(event.arguments, ensure_ascii=False),
            error=f"The arguments of {event.name!r} do not match its schema at {where}: "
            f"{exc.message}",
            name=event.name,
            id=event.id,
        )
    return event


async def _foreign_outputs(
    engine: BaseEngine, request: ChatRequest, fmt: ToolFormat, stream: bool
) -> AsyncIterator[GenerationOutput]:
    """A turn on an engine that takes no :class:`ChatRequest`: the contract's keyword
    arguments, the constraints and the thinking budget as logits processors, the effort
    as template variables (or a flag in the system message)."""
    # Any engine's text model refuses media here, before a prompt is rendered.
    reject_media_for_text_model(
        request.messages, engine.model_name, bool(engine.is_mllm), request.images, request.videos
    )
    # Building a grammar can take a moment: keep it off the event loop.
    processors = await asyncio.to_thread(
        constraint_processors, engine.tokenizer, fmt, request.tools, request.format_constraint
    )
    kwargs = request.engine_kwargs()
    messages = request.messages
    if request.reasoning.effort is not None:
        template_kwargs = dict(kwargs.get("chat_template_kwargs") or {})
        messages, template_kwargs = apply_effort(
            engine.tokenizer, request.reasoning.effort, messages, template_kwargs
        )
        kwargs["chat_template_kwargs"] = template_kwargs
    if request.reasoning.budget is not None:
        processors.append(ThinkingBudgetProcessor(engine.tokenizer, request.reasoning.budget))
    if processors:
        kwargs["logits_processors"] = [*kwargs.get("logits_processors", []), *processors]
    # The contract declares stream_chat `async def` returning an iterator; engines
    # implement it as an async generator, which is what is iterated here.
    if stream:
        return cast(AsyncIterator[GenerationOutput], engine.stream_chat(messages, **kwargs))
    return _whole(engine.chat(messages, **kwargs))
