"""OpenAI's chat completions, completions, embeddings and models, as typed objects.

The fields follow OpenAI's API reference, with the sampling extensions that vLLM also
takes (``top_k``, ``min_p``, ``repetition_penalty``, ``chat_template_kwargs``) and
``thinking_budget``. Fields marked unused are accepted and reported; what the engines
cannot do (audio, the legacy ``functions``) is refused with a
400 naming the field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import Field, Tag, field_validator, model_serializer

from mlx_integrations.serve.protocol.base import (
    Fallback,
    ReplyModel,
    WireModel,
    other_than,
    tagged,
    unused,
)
from mlx_integrations.serve.protocol.logprobs import ChoiceLogprobs, CompletionLogprobs

__all__ = [
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "Completion",
    "CompletionRequest",
    "EmbeddingList",
    "EmbeddingRequest",
    "ErrorBody",
    "Model",
    "ModelList",
    "StreamOptions",
    "Usage",
]

MAX_CHOICES = 32
"""The most choices (``n``) one request may ask for: each is a request of its own, decoded
in one batch with the others."""


def _refuse_unless(value: Any, allowed: tuple[Any, ...], why: str) -> Any:
    if value is not None and not any(
        value is a or (value == a and type(value) is type(a)) for a in allowed
    ):
        raise ValueError(why)
    return value


# ----------------------------------------------------------------- content parts


class TextPart(WireModel):
    type: Literal["text"]
    text: str


class ImageURL(WireModel):
    url: str
    """A ``data:`` URL, an http(s) URL, or a path the server's media policy allows."""
    detail: str | None = unused()


class ImageURLPart(WireModel):
    type: Literal["image_url"]
    image_url: ImageURL


class VideoURL(WireModel):
    url: str


class VideoURLPart(WireModel):
    type: Literal["video_url"]
    video_url: VideoURL


class MediaPart(WireModel):
    """An image or video by its source (``{"type": "image", "image": ...}``)."""

    type: Literal["image", "video"]
    image: str | None = None
    video: str | None = None


class OtherPart(Fallback):
    """A part of another type (audio, files): the chat core refuses it, naming it."""

    model_config = other_than("text", "image_url", "video_url", "image", "video")

    type: str


ContentPart = Annotated[
    Annotated[TextPart, Tag("type=text")]
    | Annotated[ImageURLPart, Tag("type=image_url")]
    | Annotated[VideoURLPart, Tag("type=video_url")]
    | Annotated[MediaPart, Tag("type=media")]
    | Annotated[OtherPart, Tag("type=other")],
    tagged(
        "type",
        {
            "text": "type=text",
            "image_url": "type=image_url",
            "video_url": "type=video_url",
            "image": "type=media",
            "video": "type=media",
        },
        other="type=other",
    ),
]
TextParts = list[TextPart]


# ---------------------------------------------------------------------- messages


class FunctionCall(WireModel):
    name: str
    arguments: str | dict[str, Any] = "{}"
    """The arguments as a JSON object string (or the object itself)."""


class ToolCall(WireModel):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(WireModel):
    role: Literal["system"]
    content: str | TextParts
    name: str | None = unused()


class DeveloperMessage(WireModel):
    """Read as a system message: chat templates know no developer role."""

    role: Literal["developer"]
    content: str | TextParts
    name: str | None = unused()


class UserMessage(WireModel):
    role: Literal["user"]
    content: str | list[ContentPart]
    name: str | None = unused()


class AssistantMessage(WireModel):
    role: Literal["assistant"]
    content: str | TextParts | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None
    """The reasoning of an earlier turn, shown to templates that render it."""
    name: str | None = unused()
    refusal: str | None = unused()


class ToolMessage(WireModel):
    role: Literal["tool"]
    content: str | list[ContentPart]
    tool_call_id: str


ChatMessage = Annotated[
    Annotated[SystemMessage, Tag("role=system")]
    | Annotated[DeveloperMessage, Tag("role=developer")]
    | Annotated[UserMessage, Tag("role=user")]
    | Annotated[AssistantMessage, Tag("role=assistant")]
    | Annotated[ToolMessage, Tag("role=tool")],
    tagged(
        "role",
        {
            "system": "role=system",
            "developer": "role=developer",
            "user": "role=user",
            "assistant": "role=assistant",
            "tool": "role=tool",
        },
    ),
]


# ------------------------------------------------------------ tools and formats


class FunctionDefinition(WireModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """The arguments' JSON schema (an object); none means no arguments."""
    strict: bool | None = unused()


class Tool(WireModel):
    type: str = "function"
    """``function``; the chat core refuses other types, naming them."""
    function: FunctionDefinition


class NamedFunction(WireModel):
    name: str


class NamedToolChoice(WireModel):
    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JSONSchemaSpec(WireModel):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    """The JSON schema the reply must match (enforced token by token)."""
    strict: bool | None = unused()


class TextFormat(WireModel):
    type: Literal["text"]


class JSONObjectFormat(WireModel):
    type: Literal["json_object"]


class JSONSchemaFormat(WireModel):
    type: Literal["json_schema"]
    json_schema: JSONSchemaSpec


ResponseFormat = Annotated[
    Annotated[TextFormat, Tag("type=text")]
    | Annotated[JSONObjectFormat, Tag("type=json_object")]
    | Annotated[JSONSchemaFormat, Tag("type=json_schema")],
    tagged(
        "type",
        {"text": "type=text", "json_object": "type=json_object", "json_schema": "type=json_schema"},
    ),
]


class StreamOptions(WireModel):
    include_usage: bool | None = None
    """Send a last chunk with the usage (and ``"usage": null`` on the others)."""
    include_obfuscation: bool | None = unused()


# --------------------------------------------------------------------- requests


class SamplingFields(WireModel):
    """The sampling fields the OpenAI endpoints share (vLLM's extensions included)."""

    temperature: float | None = None
    """0 is greedy; unset takes the model's ``generation_config.json``, else 1.0."""
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    """Token id (as a string) to a bias added to its logit; -100 bans it."""
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = unused()


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    model: str
    """A store alias (``mlxi list``), a pulled Hub id or a model folder."""
    messages: list[ChatMessage]
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    max_completion_tokens: int | None = None
    max_tokens: int | None = None
    """The older name of ``max_completion_tokens``; unset, the reply may run to the
    context window."""
    reasoning_effort: str | None = None
    """Passed to the chat template's own switch (``none``, ``low``, ``high``...)."""
    thinking_budget: int | None = None
    """The most thinking tokens before the model is made to answer (an extension)."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Variables for the chat template (``{"enable_thinking": false}``)."""
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    """Choices to make, each its own request decoded with the others (with a ``seed``,
    choice i samples with seed + i)."""
    logprobs: bool | None = None
    """Report the answer's tokens with their log-probabilities."""
    top_logprobs: int | None = None
    """And the 0 to 20 most likely tokens of each step."""
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    metadata: dict[str, Any] | None = unused()
    store: bool | None = unused()
    service_tier: str | None = unused()
    prompt_cache_key: str | None = unused()
    prompt_cache_retention: str | None = unused()
    safety_identifier: str | None = unused()
    verbosity: str | None = unused()
    prediction: dict[str, Any] | None = unused()
    web_search_options: dict[str, Any] | None = unused()

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        return _refuse_unless(value, (["text"], []), "must be ['text']: the reply is text")

    @field_validator("audio")
    @classmethod
    def _no_audio(cls, value: Any) -> Any:
        return _refuse_unless(value, (), "is not supported: the reply is text")

    @field_validator("functions")
    @classmethod
    def _no_functions(cls, value: Any) -> Any:
        return _refuse_unless(value, (), "(legacy) is not supported; pass 'tools' instead")

    @field_validator("function_call")
    @classmethod
    def _no_function_call(cls, value: Any) -> Any:
        return _refuse_unless(value, (), "(legacy) is not supported; pass 'tool_choice' instead")


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: raw text continued, no chat template."""

    model: str
    prompt: str | list[str] | list[int] | list[list[int]]
    """The text to continue, or its token ids; several prompts make several choices."""
    max_tokens: int = Field(default=16, ge=0)
    """Most tokens to generate; 0 (with ``echo``) only reads the prompt: with
    ``logprobs``, its own log-probabilities."""
    echo: bool = False
    """Start each choice's text with its prompt; with ``logprobs``, the prompt's tokens
    come first in the choice's ``logprobs`` (the first with ``null``), each with its
    log-probability given the tokens before it, and every generated token follows,
    the closing one included."""
    response_format: ResponseFormat | None = None
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    """Choices per prompt (with a ``seed``, choice i samples with seed + i)."""
    best_of: int | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)
    """Report each token's log-probability and those of this many most likely tokens."""
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _some_prompt(cls, value: Any) -> Any:
        if isinstance(value, list) and (not value or any(p in ("", []) for p in value)):
            raise ValueError(
                "must be a string, token ids, or a non-empty array of them, none of them empty"
            )
        return value

    def prompts(self) -> list[str | list[int]]:
        """Each prompt: text or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            return [cast(Any, prompt)]
        return list(cast(Any, prompt))

    @field_validator("best_of")
    @classmethod
    def _one_best(cls, value: Any) -> Any:
        return _refuse_unless(
            value, (1,), "must be 1: choices are not ranked here (ask for several with 'n')"
        )

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: Any) -> Any:
        return _refuse_unless(value, ("",), "is not supported: the models here only continue text")


class EmbeddingRequest(WireModel):
    """``POST /v1/embeddings``."""

    model: str
    input: str | list[str]
    """Text or texts (token-id input is not taken)."""
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    """The vectors' size; only the model's own size is served."""
    user: str | None = unused()

    @field_validator("input", mode="before")
    @classmethod
    def _some_text(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("must be a string or a non-empty array of strings")
        if isinstance(value, list) and not all(isinstance(v, str) for v in value):
            raise ValueError(
                "must be text: token-id input is not taken (LangChain's OpenAIEmbeddings: "
                "pass check_embedding_ctx_length=False)"
            )
        return value


# ----------------------------------------------------------------------- replies


def _absent(value: Any) -> bool:
    """Left out of a reply when None (a delta carries only what it adds)."""
    return value is None


class PromptTokensDetails(ReplyModel):
    cached_tokens: int = 0
    """Prompt tokens read from the prefix cache rather than computed."""


class Usage(ReplyModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class ToolCallFunction(ReplyModel):
    name: str
    arguments: str
    """The arguments as a JSON object string."""


class ToolCallOut(ReplyModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class AssistantReply(ReplyModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] | None = None

    @model_serializer(mode="wrap")
    def _leave_out_none(self, handler: Any) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if v is not None or k == "content"}


class Choice(ReplyModel):
    index: int
    message: AssistantReply
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(ReplyModel):
    """The answer of ``POST /v1/chat/completions``."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[Choice]
    usage: Usage


class ToolCallDelta(ReplyModel):
    index: int
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class Delta(ReplyModel):
    """What a chunk adds; only the fields it carries are sent."""

    role: Literal["assistant"] | None = Field(default=None, exclude_if=_absent)
    content: str | None = Field(default=None, exclude_if=_absent)
    reasoning_content: str | None = Field(default=None, exclude_if=_absent)
    tool_calls: list[ToolCallDelta] | None = Field(default=None, exclude_if=_absent)


class ChunkChoice(ReplyModel):
    index: int = 0
    delta: Delta
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(ReplyModel):
    """One event of a streamed chat completion."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChunkChoice]
    usage: Usage | None = None
    """Sent (null) on every chunk when ``stream_options.include_usage``, then filled
    on a last chunk without choices; left out otherwise."""

    @model_serializer(mode="wrap")
    def _usage_when_asked(self, handler: Any) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if "usage" not in self.model_fields_set:
            del data["usage"]
        return data


class CompletionChoice(ReplyModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None


class Completion(ReplyModel):
    """The answer of ``POST /v1/completions``, and each event of its stream."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: Usage | None = None
    """On the answer; on a stream, as on a chat completion's chunks."""

    @model_serializer(mode="wrap")
    def _usage_when_asked(self, handler: Any) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if "usage" not in self.model_fields_set:
            del data["usage"]
        return data


class Embedding(ReplyModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str
    """The vector, or its little-endian float32 bytes in base64."""


class EmbeddingUsage(ReplyModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(ReplyModel):
    """The answer of ``POST /v1/embeddings``."""

    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class Model(ReplyModel):
    """A model requests may name."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "mlxi"


class ModelList(ReplyModel):
    """The answer of ``GET /v1/models``."""

    object: Literal["list"] = "list"
    data: list[Model]


class ErrorDetail(ReplyModel):
    message: str
    type: str
    param: str | None = None
    """The path of the request field at fault (``tools[2].function.parameters``)."""
    code: str | None = None


class ErrorBody(ReplyModel):
    """An error, as OpenAI's API answers it."""

    error: ErrorDetail
