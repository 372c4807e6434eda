"""One chat turn against any engine, as a stream of typed events.

Both adapters stand on this: it validates tools and tool choice, builds the
constraints that enforce them, calls ``engine.stream_chat``, splits the reply into
text, reasoning and tool calls, and ends with the usage and finish reason.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

from mlx_integrations.chat.output_parser import (
    ChatOutputParser,
    Event,
    ReasoningDelta,
    TextDelta,
)
from mlx_integrations.chat.template import mistral_call_layout
from mlx_integrations.chat.tool_parsers import (
    FORMATS,
    InvalidToolCall,
    ParsedToolCall,
    ToolCallFormat,
    detect_format,
)
from mlx_integrations.engine.base import BaseEngine, GenerationOutput

__all__ = [
    "ChatRequest",
    "Finished",
    "InvalidToolCall",
    "ParsedToolCall",
    "ReasoningDelta",
    "TextDelta",
    "normalize_tool_choice",
    "pop_engine_options",
    "stream_chat_events",
    "validate_tools",
]


@dataclass
class ChatRequest:
    """Everything one chat turn needs, framework-neutral."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    """None/"auto", "none", "required"/"any"/True, a tool name, or an OpenAI dict."""
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    """{"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}}."""
    max_tokens: int = 512
    temperature: float = 0.7
    top_p: float = 1.0
    stop: list[str] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    """Further engine kwargs: top_k, min_p, repetition_penalty, seed, chat_template_kwargs..."""


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
    text: str
    """The raw reply, markup included (for debugging and ``include_raw``)."""


def pop_engine_options(kwargs: dict[str, Any], defaults: Any) -> dict[str, Any]:
    """Take the per-call engine options out of ``kwargs``, else the adapter's defaults.

    ``defaults`` is the adapter (``ChatMLX``/``MLXLLM``): its ``top_k``, ``min_p``,
    ``repetition_penalty``, ``seed``, ``reasoning``, ``chat_template_kwargs`` and
    ``tool_parser`` fields. The result is :attr:`ChatRequest.options`.
    """
    options: dict[str, Any] = {}
    for name in ("top_k", "min_p", "repetition_penalty", "seed", "logits_processors"):
        value = kwargs.pop(name, getattr(defaults, name, None))
        if value is not None:
            options[name] = value
    template_kwargs = {
        **(defaults.chat_template_kwargs or {}),
        **kwargs.pop("chat_template_kwargs", {}),
    }
    if template_kwargs:
        options["chat_template_kwargs"] = template_kwargs
    reasoning = kwargs.pop("reasoning", defaults.reasoning)
    if reasoning is not None:
        options["enable_thinking"] = bool(reasoning)
    tool_parser = kwargs.pop("tool_parser", defaults.tool_parser)
    if tool_parser:
        options["tool_parser"] = tool_parser
    return options


def validate_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Check OpenAI-style tool definitions; return them normalized.

    Raises:
        TypeError / ValueError: naming the tool and what is wrong with it.
    """
    if tools is None:
        return None
    if not isinstance(tools, (list, tuple)):
        raise TypeError(f"tools must be a list of tool definitions, got {type(tools).__name__}")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise TypeError(f"tools[{i}] must be a dict, got {tool!r}")
        fn = tool.get("function", tool) if tool.get("type", "function") == "function" else None
        if not isinstance(fn, dict):
            raise ValueError(f"tools[{i}] is not a function tool: {tool!r}")
        name = fn.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"tools[{i}] has no name: {tool!r}")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ValueError(
                f"Tool {name!r} has parameters {params!r}; they must be a JSON schema object"
            )
        if params.get("type", "object") != "object":
            raise ValueError(
                f"Tool {name!r}: parameters must be a JSON schema of type 'object', "
                f"got type {params.get('type')!r}"
            )
        entry = {"name": name, "parameters": params}
        if fn.get("description"):
            entry["description"] = str(fn["description"])
        out.append({"type": "function", "function": entry})
    return out


def normalize_tool_choice(tool_choice: Any, tools: list[dict[str, Any]] | None) -> str | None:
    """Reduce the many spellings of tool choice to "auto", "none", "required" or a name.

    Raises:
        ValueError: A choice that names an unknown tool, or asks for a call without tools.
    """
    if tool_choice is None or tool_choice == "auto":
        return "auto" if tools else None
    if tool_choice is False or tool_choice == "none":
        return "none"
    choice: str | None
    if tool_choice is True or tool_choice in ("any", "required"):
        choice = "required"
    elif isinstance(tool_choice, dict):
        fn = tool_choice.get("function", tool_choice)
        choice = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(choice, str):
            raise ValueError(f"tool_choice {tool_choice!r} does not name a function")
    elif isinstance(tool_choice, str):
        choice = tool_choice
    else:
        raise TypeError(f"tool_choice must be a string, bool or dict, got {tool_choice!r}")
    if not tools:
        raise ValueError(f"tool_choice={tool_choice!r} needs tools; bind some tools first")
    names = [t["function"]["name"] for t in tools]
    if choice != "required" and choice not in names:
        raise ValueError(
            f"tool_choice names the tool {choice!r}, which is not bound; bound tools: "
            f"{', '.join(names)}"
        )
    return choice


def think_markers(engine: BaseEngine) -> tuple[str, str] | None:
    """The model's reasoning markers, from its tokenizer (mlx-lm knows several)."""
    tokenizer = engine.tokenizer
    start = getattr(tokenizer, "think_start", None)
    end = getattr(tokenizer, "think_end", None)
    if isinstance(start, str) and isinstance(end, str):
        return start, end
    return None


_JSON_BODY_FORMATS = ("hermes", "llama3_json")


def _can_constrain(tokenizer: Any) -> bool:
    """A grammar needs a real tokenizer with an end-of-sequence token."""
    if tokenizer is None or not hasattr(tokenizer, "encode"):
        return False
    return bool(getattr(tokenizer, "eos_token_ids", None)) or (
        getattr(tokenizer, "eos_token_id", None) is not None
    )


def closed_schema(schema: Any) -> Any:
    """A copy of a JSON schema where objects allow no properties beyond those listed.

    Small models like to add keys that the schema merely permits (``"type"``,
    ``"description"`` copied from the prompt); like OpenAI's strict mode, constrained
    outputs keep to the listed properties unless a schema says otherwise.
    """
    if isinstance(schema, list):
        return [closed_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed_schema(v) for k, v in schema.items()}
    is_object = out.get("type") == "object" or "properties" in out
    if is_object and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def _nonempty_required_strings(schema: Any) -> Any:
    """Required string arguments must not be empty (unless the schema sets minLength).

    Forced into a call it has no words for, a small model writes ``""``; a tool's
    required string argument is practically never meant to be empty.
    """
    if isinstance(schema, list):
        return [_nonempty_required_strings(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _nonempty_required_strings(v) for k, v in schema.items()}
    props = out.get("properties")
    if isinstance(props, dict):
        for name in out.get("required") or []:
            prop = props.get(name)
            if isinstance(prop, dict) and prop.get("type") == "string" and "minLength" not in prop:
                props[name] = {**prop, "minLength": 1}
    return out


def _closed_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                **t["function"],
                "parameters": _nonempty_required_strings(
                    closed_schema(t["function"]["parameters"])
                ),
            },
        }
        for t in tools
    ]


def _closed_response_format(response_format: dict[str, Any]) -> dict[str, Any]:
    spec = response_format.get("json_schema")
    if response_format.get("type") == "json_schema" and isinstance(spec, dict):
        return {
            **response_format,
            "json_schema": {**spec, "schema": closed_schema(spec.get("schema"))},
        }
    return response_format


def constraint_processors(
    engine: BaseEngine,
    fmt: ToolCallFormat,
    tools: list[dict[str, Any]] | None,
    choice: str | None,
    parallel: bool,
    response_format: dict[str, Any] | None,
) -> tuple[list[Any], ToolCallFormat]:
    """Logits processors that enforce a response format or the tool choice.

    Returns the processors and the tool-call format the output will be in: constrained
    calls are written as ``{"name": ..., "arguments": {...}}`` between the model's own
    markers when its format has a JSON body, else between Hermes ``<tool_call>`` markers.
    """
    from mlx_integrations.chat import constraints

    tokenizer = engine.tokenizer
    if (response_format is None and choice in (None, "auto")) and not _can_constrain(tokenizer):
        return [], fmt  # free text with optional calls needs no grammar
    if not _can_constrain(tokenizer):
        raise ValueError(
            f"tool_choice={choice!r} / response_format need constrained decoding, which needs "
            f"the engine's tokenizer; the engine for {engine.model_name!r} exposes none"
        )
    rf = constraints.response_format_constraint(
        _closed_response_format(response_format) if response_format else None
    )
    if rf is not None:
        return [rf.make_processor(tokenizer)], fmt
    if not tools or choice is None:
        return [], fmt
    layout = None
    if fmt.name == "mistral":
        # Probed once at load by our engines; other engines' templates are probed here.
        caps = getattr(engine, "template_capabilities", None)
        layout = caps.mistral_layout if caps is not None else mistral_call_layout(tokenizer)
    if fmt.name in _JSON_BODY_FORMATS and fmt.start:
        markers = constraints.ToolCallMarkers(fmt.start, fmt.end)
    elif layout is not None:
        # Mistral calls in the layout its template writes (the parser reads all three).
        markers = constraints.ToolCallMarkers(fmt.start, "", layout=layout)
    else:
        fmt = FORMATS["hermes"]
        markers = constraints.ToolCallMarkers(fmt.start, fmt.end)
    tool_choice = {"required": "required", "auto": "auto", "none": "none"}.get(choice, choice)
    constraint = constraints.tool_choice_constraint(
        _closed_tools(tools), tool_choice, parallel=parallel, markers=markers
    )
    return [constraint.make_processor(tokenizer)], fmt


def with_format_instructions(
    messages: list[dict[str, Any]], response_format: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """Tell the model the JSON it must write; the constraint alone cannot tell it why.

    The grammar keeps the output valid, but a model that has not seen the schema
    fills it with whatever it was about to say. The instruction goes into the system
    message (one is added when there is none).
    """
    if not response_format or response_format.get("type") not in ("json_schema", "json_object"):
        return messages
    if response_format["type"] == "json_object":
        note = "Answer with a single JSON object and nothing else."
    else:
        schema = (response_format.get("json_schema") or {}).get("schema") or {}
        note = (
            "Answer with a single JSON object and nothing else. It must follow this "
            f"JSON schema:\n{json.dumps(schema, ensure_ascii=False)}"
        )
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0])
        content = first["content"]
        if isinstance(content, list):
            first["content"] = [*content, {"type": "text", "text": "\n\n" + note}]
        else:
            first["content"] = f"{content}\n\n{note}" if content else note
        return [first, *messages[1:]]
    return [{"role": "system", "content": note}, *messages]


async def stream_chat_events(
    engine: BaseEngine, request: ChatRequest
) -> AsyncIterator[Event | Finished]:
    """Run one chat turn and yield its events, ending with :class:`Finished`."""
    tools = validate_tools(request.tools)
    choice = normalize_tool_choice(request.tool_choice, tools)
    options = dict(request.options)
    messages = with_format_instructions(request.messages, request.response_format)
    await engine.start()
    fmt = detect_format(engine.tokenizer, options.pop("tool_parser", None))
    markers = think_markers(engine)
    starts_in_reasoning = False
    render = getattr(engine, "render_prompt", None)
    if markers and render is not None:
        template_kwargs = dict(options.get("chat_template_kwargs") or {})
        if options.get("enable_thinking") is not None:
            template_kwargs["enable_thinking"] = options["enable_thinking"]
        # Rendering is the engine's own (its template options included), off the loop.
        prompt = await asyncio.to_thread(
            render, messages, tools=tools if choice != "none" else None, **template_kwargs
        )
        starts_in_reasoning = prompt.rstrip().endswith(markers[0])
    # Building a grammar can take a moment: keep it off the event loop.
    processors, fmt = await asyncio.to_thread(
        constraint_processors,
        engine,
        fmt,
        tools,
        choice,
        request.parallel_tool_calls,
        request.response_format,
    )
    if processors:
        options["logits_processors"] = [*options.get("logits_processors", []), *processors]
    parser = ChatOutputParser(
        tool_format=fmt if tools and choice != "none" else None,
        tools=tools,
        think_markers=markers,
        starts_in_reasoning=starts_in_reasoning,
    )
    started = time.perf_counter()
    first_at: float | None = None
    last = None
    saw_call = False
    # The contract declares stream_chat `async def` returning an iterator; engines
    # implement it as an async generator, which is what is iterated here.
    stream = cast(
        AsyncIterator[GenerationOutput],
        engine.stream_chat(
            messages,
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            # With tool_choice "none" the model is not shown the tools: small models call
            # whatever they are shown.
            tools=tools if choice != "none" else None,
            stop=request.stop,
            **options,
        ),
    )
    async for out in stream:
        if first_at is None:
            first_at = time.perf_counter()
        last = out
        if out.new_text:
            for event in parser.feed(out.new_text):
                saw_call |= isinstance(event, (ParsedToolCall, InvalidToolCall))
                yield event
    for event in parser.finish():
        saw_call |= isinstance(event, (ParsedToolCall, InvalidToolCall))
        yield event
    assert last is not None, "the engine returned no output"
    reason = last.finish_reason
    if saw_call and reason == "stop":
        reason = "tool_calls"
    yield Finished(
        finish_reason=reason,
        prompt_tokens=last.prompt_tokens,
        completion_tokens=last.completion_tokens,
        cached_tokens=int(getattr(last, "cached_tokens", 0) or 0),
        model_name=engine.model_name,
        ttft_s=float(getattr(last, "ttft_s", 0.0) or ((first_at or started) - started)),
        generation_tps=float(getattr(last, "generation_tps", 0.0) or 0.0),
        text=last.text,
    )
