"""One chat request, built and checked once at the edge, the form our engines take.

The adapters build a :class:`ChatRequest` from their fields and call arguments, the
HTTP server from its protocol models, and the contract's ``stream_chat(**kwargs)`` from
its keywords (:meth:`ChatRequest.from_kwargs`). Every check runs in :meth:`ChatRequest.build`;
a bad value raises :class:`RequestError` carrying the path of the field at fault
(``tools[2].function.parameters``), so a caller (the server's ``param``) never reads
the message to learn which field it was.

Examples:
    >>> from mlx_integrations.chat.request import ChatRequest, RequestError
    >>> request = ChatRequest.build([{"role": "user", "content": "Hi"}], temperature=0)
    >>> request.sampling.temperature
    0.0
    >>> try:
    ...     ChatRequest.build([{"role": "user", "content": "Hi"}], top_p=2)
    ... except RequestError as exc:
    ...     print(exc.path)
    top_p
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mlx_integrations.chat.constraints import Constraint, format_constraint
from mlx_integrations.chat.fields import (
    RequestError,
    RequestTypeError,
    Sampling,
    check_logprobs,
    check_max_tokens,
    check_processors,
    check_stop,
    check_template_kwargs,
    check_timeout,
    checking,
)
from mlx_integrations.chat.messages import normalize_messages
from mlx_integrations.chat.reasoning import check_budget, check_effort
from mlx_integrations.chat.tool_formats import ToolFormat, get_format
from mlx_integrations.chat.tools import ToolRequest, read_tool_request
from mlx_integrations.engine.base import GenerationOutput

__all__ = [
    "ChatRequest",
    "Reasoning",
    "RequestEngine",
    "RequestError",
    "RequestTypeError",
    "Sampling",
    "check_stop",
    "check_template_kwargs",
    "check_timeout",
    "checking",
]


@dataclass(frozen=True)
class Reasoning:
    """How much a thinking model thinks (see :mod:`mlx_integrations.chat.reasoning`)."""

    effort: str | None = None
    """``"none"``, ``"low"``, ``"medium"`` or ``"high"``, through the template's own
    switch; None leaves the template's default."""
    enable_thinking: bool | None = None
    """The template's on/off switch; None leaves its default."""
    budget: int | None = None
    """Most thinking tokens, then the end marker is written; None: no cap."""

    @classmethod
    def check(
        cls, effort: Any = None, enable_thinking: Any = None, budget: Any = None
    ) -> Reasoning:
        """Check the three; ``enable_thinking`` and an ``effort`` must agree.

        Raises:
            RequestError: A bad level or budget, or the two switches disagreeing.
        """
        with checking("reasoning_effort"):
            effort = check_effort(effort)
        with checking("thinking_budget"):
            budget = check_budget(budget)
        if enable_thinking is not None and not isinstance(enable_thinking, bool):
            raise RequestTypeError(
                f"enable_thinking must be True, False or None, got {enable_thinking!r}",
                "enable_thinking",
            )
        if enable_thinking is not None and effort is not None:
            if enable_thinking != (effort != "none"):
                raise RequestError(
                    f"reasoning={enable_thinking!r} and reasoning_effort={effort!r} disagree; "
                    "set one (reasoning_effort='none' turns thinking off, another level turns "
                    "it on)",
                    "reasoning_effort",
                )
            enable_thinking = None  # the effort says it, through the template's own switch
        return cls(effort, enable_thinking, budget)


# ----------------------------------------------------------------- the request


_RESPONSE_FORMAT_HELP = (
    "{'type': 'json_object'}, {'type': 'json_schema', 'json_schema': {'schema': {...}}} "
    "or {'type': 'text'}"
)


def check_response_format(value: Any) -> tuple[dict[str, Any] | None, Constraint | None]:
    """An OpenAI-style ``response_format`` and the constraint it asks for, checked
    (a JSON schema compiled once here); ``{"type": "text"}`` is no format.

    Raises:
        RequestError: At ``response_format`` (or ``response_format.json_schema.schema``).
    """
    if value is None:
        return None, None
    if not isinstance(value, Mapping):
        raise RequestTypeError(
            f"response_format must be a dict such as {_RESPONSE_FORMAT_HELP}, got "
            f"{type(value).__name__}: {value!r:.80}",
            "response_format",
        )
    path = "response_format"
    if value.get("type") == "json_schema" and isinstance(value.get("json_schema"), Mapping):
        path = "response_format.json_schema.schema"
    with checking(path):
        constraint = format_constraint(value)
    return (dict(value) if constraint is not None else None), constraint


class CheckedTools(list[dict[str, Any]]):
    """OpenAI-style tool dicts that were checked when bound (``bind_tools``), carrying
    their :class:`~mlx_integrations.chat.tools.ToolSpec` list so that a call builds its
    request without checking them again. A plain list to everything else."""

    def __init__(self, tools: Sequence[dict[str, Any]], specs: Sequence[Any]) -> None:
        super().__init__(tools)
        self.specs = tuple(specs)


@dataclass(frozen=True)
class ChatRequest:
    """Everything one chat turn needs, checked, framework-neutral.

    Make one with :meth:`build` (or :meth:`from_kwargs`, the contract's keywords);
    the fields then hold checked values only.
    """

    messages: list[dict[str, Any]]
    """The conversation, normalized (role, content as a string or parts, tool calls)."""
    tools: ToolRequest
    """The tools and how they may be called (the prompt, the constraint and the parser
    share it)."""
    max_tokens: int = 512
    sampling: Sampling = field(default_factory=Sampling)
    stop: tuple[str, ...] = ()
    response_format: dict[str, Any] | None = None
    """The JSON the answer must be (None: free text); checked."""
    format_constraint: Constraint | None = field(default=None, compare=False, repr=False)
    """The constraint ``response_format`` asks for (built at :meth:`build`)."""
    reasoning: Reasoning = field(default_factory=Reasoning)
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Variables for the chat template (the engine's own apply first)."""
    images: tuple[str, ...] = ()
    """Images beside the messages' own parts (the contract's ``images=``)."""
    videos: tuple[str, ...] = ()
    logits_processors: tuple[Callable[..., Any], ...] = ()
    """Custom processors, applied before the request's constraints."""
    tool_format: str | ToolFormat | None = None
    """A tool-call family to use instead of the model's own."""
    request_id: str | None = None
    """The id to run it under (``abort_request``); None: a new one."""
    logprobs: int | None = None
    """Report each generated token's log-probability and this many most likely
    alternatives per step (0: none); None: no log-probabilities."""
    timeout: float | None = None
    """Seconds the whole turn may take; then its request is stopped and TimeoutError raised."""
    model: str | None = None
    """The model's name as the caller gave it, reported back; None: the engine's own."""

    # ------------------------------------------------------------ building

    @classmethod
    def build(
        cls,
        messages: Any,
        *,
        tools: Any = None,
        tool_choice: Any = None,
        parallel_tool_calls: Any = None,
        response_format: Any = None,
        max_tokens: Any = 512,
        temperature: Any = 0.7,
        top_p: Any = 1.0,
        stop: Any = None,
        top_k: Any = None,
        min_p: Any = None,
        repetition_penalty: Any = None,
        repetition_context_size: Any = None,
        presence_penalty: Any = None,
        frequency_penalty: Any = None,
        logit_bias: Any = None,
        seed: Any = None,
        reasoning_effort: Any = None,
        enable_thinking: Any = None,
        thinking_budget: Any = None,
        chat_template_kwargs: Any = None,
        images: Any = None,
        videos: Any = None,
        logits_processors: Any = None,
        tool_format: Any = None,
        request_id: Any = None,
        logprobs: Any = None,
        top_logprobs: Any = None,
        timeout: Any = None,
        model: Any = None,
    ) -> ChatRequest:
        """Check every argument and return the request.

        Args:
            messages: The conversation: dicts with ``role`` and ``content`` (a string or
                parts), ``tool_calls``, ``tool_call_id``.
            tools: OpenAI-style tool dicts.
            tool_choice: None/``"auto"``, ``"none"``, ``"required"``/``"any"``/True, a
                tool name, or ``{"type": "function", "function": {"name": ...}}``.
            parallel_tool_calls: Several calls in one turn; None: yes, unless a call
                is forced (then one: small models repeat calls).
            response_format: ``{"type": "json_object"}``, ``{"type": "json_schema",
                "json_schema": {"schema": ...}}``, ``{"type": "text"}`` or None.
            max_tokens: Most tokens to generate (the engines also stop at the context window).
            temperature, top_p, top_k, min_p, repetition_penalty,
                repetition_context_size, presence_penalty, frequency_penalty,
                logit_bias, seed: Sampling (:class:`Sampling`).
            stop: Stop sequences.
            reasoning_effort, enable_thinking, thinking_budget: :class:`Reasoning`.
            chat_template_kwargs: Variables for the chat template.
            images, videos: Media beside the messages' parts (vision models).
            logits_processors: Custom processors ``(tokens, logits) -> logits``.
            tool_format: A tool-call family name to use instead of the model's own.
            request_id: The id to run the request under.
            logprobs: Report the generated tokens' log-probabilities (True/False).
            top_logprobs: And this many most likely alternatives per step (0 to 20;
                given alone, it asks for the log-probabilities too).
            timeout: Seconds the whole turn may take (None: no limit).
            model: The model's name as the caller gave it.

        Raises:
            RequestError: The first bad value, with its path (a ``RequestTypeError``,
                also a ``TypeError``, for a wrong type).
        """
        if parallel_tool_calls is None:
            parallel_tool_calls = tool_choice in (None, "auto", "none", False)
        if isinstance(tools, CheckedTools):
            tools = tools.specs
        tool_request = read_tool_request(tools, tool_choice, parallel_tool_calls)
        # Media parts are kept here; an engine of a text model refuses them.
        normalized = normalize_messages(messages, media=True)
        checked_format, constraint = check_response_format(response_format)
        template_kwargs = check_template_kwargs(chat_template_kwargs)
        if tool_format is not None and not isinstance(tool_format, ToolFormat):
            with checking("tool_format"):
                get_format(tool_format)  # an unknown family is named here
        if request_id is not None and not isinstance(request_id, str):
            raise RequestTypeError(f"request_id must be a string, got {request_id!r}", "request_id")
        return cls(
            messages=normalized,
            tools=tool_request,
            max_tokens=check_max_tokens(max_tokens),
            sampling=Sampling.check(
                temperature,
                top_p,
                top_k=top_k,
                min_p=min_p,
                repetition_penalty=repetition_penalty,
                repetition_context_size=repetition_context_size,
                presence_penalty=presence_penalty,
                frequency_penalty=frequency_penalty,
                logit_bias=logit_bias,
                seed=seed,
            ),
            stop=check_stop(stop),
            response_format=checked_format,
            format_constraint=constraint,
            reasoning=Reasoning.check(reasoning_effort, enable_thinking, thinking_budget),
            chat_template_kwargs=template_kwargs,
            images=_media("images", images),
            videos=_media("videos", videos),
            logits_processors=check_processors(logits_processors),
            tool_format=tool_format,
            request_id=request_id,
            logprobs=check_logprobs(logprobs, top_logprobs),
            timeout=check_timeout(timeout),
            model=model,
        )

    @classmethod
    def from_kwargs(
        cls,
        messages: Any,
        max_tokens: Any = 256,
        temperature: Any = 0.7,
        top_p: Any = 0.9,
        tools: Any = None,
        images: Any = None,
        videos: Any = None,
        **kwargs: Any,
    ) -> ChatRequest:
        """The request of a contract call, ``engine.stream_chat(messages, ..., **kwargs)``,
        with the contract's defaults.

        Raises:
            RequestTypeError: A keyword no engine of ours takes (naming those it does).
            RequestError: A bad value, as :meth:`build`.
        """
        check_call_keywords(kwargs)
        if "parallel_tool_calls" not in kwargs:
            kwargs["parallel_tool_calls"] = True  # the contract's callers expect it
        return cls.build(
            messages,
            tools=tools,
            images=images,
            videos=videos,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            **kwargs,
        )

    def replace(self, **changes: Any) -> ChatRequest:
        """A copy with ``changes`` (values already checked by the caller)."""
        return replace(self, **changes)

    # ------------------------------------------------------------ reading

    @property
    def temperature(self) -> float:
        return self.sampling.temperature

    @property
    def top_p(self) -> float:
        return self.sampling.top_p

    def template_kwargs(self) -> dict[str, Any]:
        """The request's template variables, its ``enable_thinking`` switch included."""
        kwargs = dict(self.chat_template_kwargs)
        if self.reasoning.enable_thinking is not None:
            kwargs["enable_thinking"] = self.reasoning.enable_thinking
        return kwargs

    def engine_kwargs(self) -> dict[str, Any]:
        """The request as the contract's keyword arguments, for an engine that takes no
        :class:`ChatRequest`: sampling, stop, template variables, custom processors and
        the tools to show. Tool choice, response format and the reasoning controls are
        not there: the chat core turns them into processors and template variables."""
        kwargs: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            # With tool_choice "none" the model is not shown the tools: small models call
            # whatever they are shown.
            "tools": self.tools.openai_tools(),
            "stop": list(self.stop) or None,
            **self.sampling.options(),
        }
        template_kwargs = self.template_kwargs()
        if template_kwargs:
            kwargs["chat_template_kwargs"] = template_kwargs
        if self.images:
            kwargs["images"] = list(self.images)
        if self.videos:
            kwargs["videos"] = list(self.videos)
        if self.logits_processors:
            kwargs["logits_processors"] = list(self.logits_processors)
        if self.request_id is not None:
            kwargs["request_id"] = self.request_id
        return kwargs


CALL_KEYWORDS = frozenset(
    {
        "top_k",
        "min_p",
        "repetition_penalty",
        "repetition_context_size",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "seed",
        "logits_processors",
        "request_id",
        "stop",
        "chat_template_kwargs",
        "enable_thinking",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "tool_format",
        "reasoning_effort",
        "thinking_budget",
        "logprobs",
        "top_logprobs",
    }
)
"""The keyword arguments our engines' ``chat``/``stream_chat`` take beyond the contract's
named ones."""


def check_call_keywords(kwargs: Mapping[str, Any]) -> None:
    """Refuse a keyword argument no engine call of ours takes.

    Raises:
        RequestTypeError: Naming the first unknown one (its path) and those taken.
    """
    unknown = sorted(set(kwargs) - CALL_KEYWORDS)
    if unknown:
        raise RequestTypeError(
            f"unexpected keyword argument(s) {unknown}; supported: {sorted(CALL_KEYWORDS)}",
            unknown[0],
        )


def _media(name: str, value: Any) -> tuple[str, ...]:
    if not value:
        return ()
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise RequestTypeError(f"{name} must be a list of paths or URLs, got {value!r:.80}", name)
    return tuple(str(v) for v in value)


class RequestEngine(ABC):
    """An engine that takes a :class:`ChatRequest` whole (the engines of this package).

    The chat core hands such an engine the request itself, and the engine builds the
    constraints once it has rendered the prompt (so that they hold after a thinking
    block the prompt opens). Any other ``BaseEngine`` gets the contract's keyword
    arguments (:meth:`ChatRequest.engine_kwargs`) with the constraints as logits
    processors.
    """

    @property
    @abstractmethod
    def tool_format(self) -> ToolFormat:
        """The model's tool-call family."""

    @abstractmethod
    def stream_request(
        self, request: ChatRequest, *, final_only: bool = False, announce: bool = False
    ) -> AsyncIterator[GenerationOutput]:
        """Run the request and stream its output (only the last chunk with ``final_only``).

        With ``announce`` the first output is an empty, unfinished chunk sent once the
        prompt is rendered and counted (its ``prompt_tokens``), before it is processed.

        Raises:
            RequestError: A value this model cannot take (media for a text model, a
                ``logit_bias`` id outside its vocabulary, a prompt past its context window).
        """
