"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``), typed.

Claude Code and other agents send many fields a local model has no use for
(``cache_control`` on blocks and tools, ``context_management``, ``metadata``...): they
are accepted and reported. Blocks and tools of types this server does not serve are
typed as "other", so the translator names them in its refusal.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, Tag, model_serializer

from mlx_integrations.serve.protocol.base import (
    Fallback,
    ReplyModel,
    WireModel,
    other_than,
    tagged,
    unused,
)

__all__ = [
    "CountTokensReply",
    "CountTokensRequest",
    "ErrorBody",
    "Message",
    "MessagesRequest",
    "StreamEvent",
]


# ------------------------------------------------------------------------ blocks


class CacheControl(WireModel):
    type: str = "ephemeral"
    ttl: str | None = None


class TextBlock(WireModel):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = unused()
    citations: list[Any] | None = unused()


class Base64Source(WireModel):
    type: Literal["base64"]
    media_type: str
    data: str


class URLSource(WireModel):
    type: Literal["url"]
    url: str


ImageSource = Annotated[
    Annotated[Base64Source, Tag("type=base64")] | Annotated[URLSource, Tag("type=url")],
    tagged("type", {"base64": "type=base64", "url": "type=url"}),
]


class ImageBlock(WireModel):
    type: Literal["image"]
    source: ImageSource
    cache_control: CacheControl | None = unused()


class ToolUseBlock(WireModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = unused()


ResultContent = Annotated[
    Annotated[TextBlock, Tag("type=text")] | Annotated[ImageBlock, Tag("type=image")],
    tagged("type", {"text": "type=text", "image": "type=image"}),
]


class ToolResultBlock(WireModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ResultContent] = ""
    is_error: bool | None = None
    """An error's text reaches the model as ``Error: ...``."""
    cache_control: CacheControl | None = unused()


class ThinkingBlock(WireModel):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = unused()


class RedactedThinkingBlock(WireModel):
    """Encrypted thinking of Anthropic's models: nothing a local model can read."""

    type: Literal["redacted_thinking"]
    data: str | None = unused()


class OtherBlock(Fallback):
    """A block of another type (documents, server tools' results...)."""

    model_config = other_than(
        "text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking"
    )

    type: str


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("type=text")]
    | Annotated[ImageBlock, Tag("type=image")]
    | Annotated[ToolUseBlock, Tag("type=tool_use")]
    | Annotated[ToolResultBlock, Tag("type=tool_result")]
    | Annotated[ThinkingBlock, Tag("type=thinking")]
    | Annotated[RedactedThinkingBlock, Tag("type=redacted_thinking")]
    | Annotated[OtherBlock, Tag("type=other")],
    tagged(
        "type",
        {
            "text": "type=text",
            "image": "type=image",
            "tool_use": "type=tool_use",
            "tool_result": "type=tool_result",
            "thinking": "type=thinking",
            "redacted_thinking": "type=redacted_thinking",
        },
        other="type=other",
    ),
]


class InputMessage(WireModel):
    role: Literal["user", "assistant", "system"]
    """``system`` in the conversation joins the system prompt."""
    content: str | list[ContentBlock]


# ------------------------------------------------------------- tools and settings


class Tool(WireModel):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    """The input's JSON schema (an object)."""
    type: str | None = None
    """None or ``custom`` for a tool the client runs; a tool of another type (server
    tools such as ``web_search_20250305``) is left out of the prompt and reported."""
    cache_control: CacheControl | None = unused()
    strict: bool | None = unused()


class ToolChoice(WireModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    """The tool to call, with ``type: tool``."""
    disable_parallel_tool_use: bool | None = None


class Thinking(WireModel):
    type: Literal["enabled", "disabled", "adaptive"]
    """``enabled`` and ``adaptive`` turn thinking on where the chat template can,
    ``disabled`` turns it off."""
    budget_tokens: int | None = Field(default=None, ge=1)
    """With ``enabled``: caps the thinking of a model that thinks (left out, and
    reported, for one that does not)."""
    display: str | None = unused()


class OutputFormat(WireModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(WireModel):
    effort: str | None = None
    """The chat template's ``reasoning_effort``: ``low``, ``medium``, ``high`` (``max``
    is ``high``; a level the template lacks, the nearest it takes). Left out, and
    reported, for a model that does not think, with thinking ``disabled``, or for
    another value."""
    format: OutputFormat | None = None


class Metadata(WireModel):
    user_id: str | None = unused()


class MessagesRequest(WireModel):
    """``POST /v1/messages``."""

    model: str
    messages: list[InputMessage]
    system: str | list[TextBlock] | None = None
    max_tokens: int | None = None
    """Anthropic's clients always send it; unset, the reply may run to the context
    window."""
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    stream: bool = False
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    metadata: Metadata | None = unused()
    context_management: dict[str, Any] | None = unused()
    service_tier: str | None = unused()
    container: Any = unused()
    mcp_servers: list[Any] | None = unused()


class CountTokensRequest(MessagesRequest):
    """``POST /v1/messages/count_tokens``: the request a call would send."""


# ----------------------------------------------------------------------- replies


class TextOut(ReplyModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingOut(ReplyModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""


class ToolUseOut(ReplyModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


OutputBlock = Annotated[TextOut | ThinkingOut | ToolUseOut, Field(discriminator="type")]


class Usage(ReplyModel):
    input_tokens: int
    """Prompt tokens not read from the cache."""
    output_tokens: int
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


class Message(ReplyModel):
    """The answer of ``POST /v1/messages``."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[OutputBlock] = Field(default_factory=list)
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None = None
    stop_sequence: str | None = None
    usage: Usage


class TextDeltaOut(ReplyModel):
    type: Literal["text_delta"] = "text_delta"
    text: str


class ThinkingDeltaOut(ReplyModel):
    type: Literal["thinking_delta"] = "thinking_delta"
    thinking: str


class InputJSONDelta(ReplyModel):
    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str


class MessageDelta(ReplyModel):
    stop_reason: str | None
    stop_sequence: str | None


class StreamEvent(ReplyModel):
    """One event of a streamed message: ``message_start``, ``content_block_start``,
    ``content_block_delta``, ``content_block_stop``, ``message_delta``,
    ``message_stop``, ``ping``; the other fields are those of that type."""

    type: str
    message: Message | None = None
    index: int | None = None
    content_block: OutputBlock | None = None
    delta: TextDeltaOut | ThinkingDeltaOut | InputJSONDelta | MessageDelta | None = None
    usage: Usage | None = None

    @model_serializer(mode="wrap")
    def _own_fields(self, handler: Any) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if v is not None}


class CountTokensReply(ReplyModel):
    """The answer of ``POST /v1/messages/count_tokens``."""

    input_tokens: int


class ErrorDetail(ReplyModel):
    type: str
    message: str


class ErrorBody(ReplyModel):
    """An error, as Anthropic's API answers it."""

    type: Literal["error"] = "error"
    error: ErrorDetail
