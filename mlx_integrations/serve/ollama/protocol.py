"""Ollama's API as typed objects: the requests of ``/api/*`` and their replies.

The fields follow Ollama's API reference (docs/api.md of ollama/ollama). As on the
other endpoints, the fields the server uses are strict (a wrong type is a 400 naming
its path), any other field is accepted and reported in ``x-mlxi-ignored-fields``, and
what the engines cannot do (token log-probabilities, Ollama's Go templates, fill-in-the-
middle ``suffix``) is refused with a 400 naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from mlx_integrations.serve.protocol.base import ReplyModel, WireModel, unused

__all__ = [
    "ChatRequest",
    "ChatResponse",
    "CopyRequest",
    "DeleteRequest",
    "EmbedRequest",
    "EmbedResponse",
    "EmbeddingsRequest",
    "EmbeddingsResponse",
    "ErrorBody",
    "GenerateRequest",
    "GenerateResponse",
    "ModelDetails",
    "ModelEntry",
    "Options",
    "Progress",
    "PullRequest",
    "RunningModel",
    "RunningModels",
    "ShowRequest",
    "ShowResponse",
    "Tags",
    "Version",
]

_NO_LOGPROBS = "is not supported: the engines return no token probabilities; leave it out"

KeepAlive = float | str
"""Seconds, or a duration (``"5m"``, ``"1h"``); 0 unloads after the request, -1 keeps."""
Think = bool | Literal["low", "medium", "high"]
Format = Literal["", "json"] | dict[str, Any]


# ------------------------------------------------------------------- requests


class Options(WireModel):
    """Sampling and length settings (Ollama's Modelfile parameters)."""

    temperature: float | None = None
    """0 is greedy; unset takes the model's ``generation_config.json``, else 1.0."""
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    num_predict: int | None = None
    """Most tokens of the reply; -1 or -2 (or unset): up to the context window."""
    stop: str | list[str] | None = None
    num_ctx: int | None = None
    """The prompt and the reply together stay within this many tokens: a longer prompt
    is refused (Ollama would cut its start), the reply stops there."""
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    num_keep: int | None = unused()
    repeat_last_n: int | None = unused()
    typical_p: float | None = unused()
    tfs_z: float | None = unused()
    mirostat: int | None = unused()
    mirostat_tau: float | None = unused()
    mirostat_eta: float | None = unused()
    penalize_newline: bool | None = unused()
    numa: bool | None = unused()
    num_batch: int | None = unused()
    num_gpu: int | None = unused()
    main_gpu: int | None = unused()
    low_vram: bool | None = unused()
    use_mmap: bool | None = unused()
    use_mlock: bool | None = unused()
    num_thread: int | None = unused()


class FunctionCall(WireModel):
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    """The arguments as an object (Ollama's way) or a JSON object string."""
    index: int | None = unused()


class ToolCall(WireModel):
    id: str | None = None
    type: str | None = unused()
    function: FunctionCall


class Message(WireModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    images: list[str] | None = None
    """Base64 images (a vision model's input), shown before the message's text."""
    tool_calls: list[ToolCall] | None = None
    thinking: str | None = None
    """An earlier turn's reasoning, shown to templates that render it."""
    tool_name: str | None = None
    """The tool a ``tool`` message answers (else the earlier calls are answered in order)."""
    tool_call_id: str | None = None
    """The call a ``tool`` message answers (LangChain's ChatOllama sends it)."""


class FunctionDefinition(WireModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """The arguments' JSON schema (an object); none means no arguments."""


class Tool(WireModel):
    type: str = "function"
    """``function``; the chat core refuses other types, naming them."""
    function: FunctionDefinition


class Generating(WireModel):
    """What ``/api/chat`` and ``/api/generate`` share."""

    model: str
    """``name`` or ``name:latest``: a store name or alias, a pulled Hub id, a folder."""
    format: Format | None = None
    """``"json"``, or a JSON schema the reply must match (enforced token by token)."""
    options: Options | None = None
    stream: bool = True
    """NDJSON objects as the reply is written (Ollama's default), or one object."""
    keep_alive: KeepAlive | None = None
    """How long the model stays loaded after this request; unset: the server's default."""
    think: Think | None = None
    """Thinking on or off, or its effort (``low``, ``medium``, ``high``)."""
    logprobs: bool | None = None
    top_logprobs: int | None = None

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: Any) -> Any:
        if value:
            raise ValueError(_NO_LOGPROBS)
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _no_top_logprobs(cls, value: Any) -> Any:
        if value:
            raise ValueError(_NO_LOGPROBS)
        return value


class ChatRequest(Generating):
    """``POST /api/chat``. Without messages it only loads (or, with ``keep_alive: 0``,
    unloads) the model."""

    messages: list[Message] = Field(default_factory=list)
    tools: list[Tool] | None = None


class GenerateRequest(Generating):
    """``POST /api/generate``. Without a prompt it only loads (or unloads) the model."""

    prompt: str = ""
    system: str | None = None
    """A system message before the prompt."""
    raw: bool = False
    """Continue ``prompt`` as it is, without the chat template."""
    images: list[str] | None = None
    suffix: str | None = None
    template: str | None = None
    context: list[int] | None = None

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: Any) -> Any:
        if value:
            raise ValueError("is not supported: the models here only continue text; leave it out")
        return value

    @field_validator("template")
    @classmethod
    def _no_template(cls, value: Any) -> Any:
        if value:
            raise ValueError(
                "is not supported: it is an Ollama Go template, and this server renders the "
                "model's own chat template; leave it out, or send the prompt formatted "
                "with raw: true"
            )
        return value

    @field_validator("context")
    @classmethod
    def _no_context(cls, value: Any) -> Any:
        if value:
            raise ValueError(
                "is not kept here (Ollama deprecates it): send the conversation as messages "
                "to /api/chat instead"
            )
        return value


class EmbedRequest(WireModel):
    """``POST /api/embed``."""

    model: str
    input: str | list[str]
    dimensions: int | None = None
    """The vectors' size; only the model's own size is served."""
    keep_alive: KeepAlive | None = None
    truncate: bool | None = unused()
    options: dict[str, Any] | None = unused()

    @field_validator("input")
    @classmethod
    def _some_text(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("must be a string or a non-empty array of strings")
        return value


class EmbeddingsRequest(WireModel):
    """``POST /api/embeddings``: Ollama's older endpoint, one text."""

    model: str
    prompt: str
    keep_alive: KeepAlive | None = None
    options: dict[str, Any] | None = unused()


class Named(WireModel):
    """A request that names one model: ``model``, or ``name`` as older clients send."""

    model: str = ""
    name: str = ""

    @model_validator(mode="after")
    def _one_name(self) -> Named:
        if not (self.model or self.name):
            raise ValueError(
                "must name its model in 'model' (e.g. 'smollm2:latest'; older clients send 'name')"
            )
        return self

    @property
    def named(self) -> str:
        return self.model or self.name


class ShowRequest(Named):
    """``POST /api/show``."""

    verbose: bool | None = unused()


class PullRequest(Named):
    """``POST /api/pull``: a Hugging Face repo id, ``:tag`` naming its revision."""

    stream: bool = True
    insecure: bool | None = unused()


class DeleteRequest(Named):
    """``DELETE /api/delete``."""


class CopyRequest(WireModel):
    """``POST /api/copy``: a new name (a store alias) for a stored model."""

    source: str
    destination: str


# --------------------------------------------------------------------- replies


def _absent(value: Any) -> bool:
    return value is None


class FunctionOut(ReplyModel):
    name: str
    arguments: dict[str, Any]


class ToolCallOut(ReplyModel):
    id: str
    function: FunctionOut


class MessageOut(ReplyModel):
    role: Literal["assistant"] = "assistant"
    content: str = ""
    thinking: str | None = Field(default=None, exclude_if=_absent)
    tool_calls: list[ToolCallOut] | None = Field(default=None, exclude_if=_absent)


class Counters(ReplyModel):
    """What the last object of a reply adds: why it ended, tokens and nanoseconds."""

    model: str
    created_at: str
    """When the object was made, RFC 3339."""
    done: bool = False
    done_reason: str | None = Field(default=None, exclude_if=_absent)
    """``stop``, ``length``, or ``load``/``unload`` for a request without input."""
    total_duration: int | None = Field(default=None, exclude_if=_absent)
    load_duration: int | None = Field(default=None, exclude_if=_absent)
    prompt_eval_count: int | None = Field(default=None, exclude_if=_absent)
    """Tokens of the prompt, those read from the prefix cache included."""
    prompt_eval_duration: int | None = Field(default=None, exclude_if=_absent)
    eval_count: int | None = Field(default=None, exclude_if=_absent)
    eval_duration: int | None = Field(default=None, exclude_if=_absent)


class ChatResponse(Counters):
    """The answer of ``/api/chat``, and each line of its stream."""

    message: MessageOut


class GenerateResponse(Counters):
    """The answer of ``/api/generate``, and each line of its stream."""

    response: str = ""
    thinking: str | None = Field(default=None, exclude_if=_absent)


class EmbedResponse(ReplyModel):
    model: str
    embeddings: list[list[float]]
    total_duration: int
    load_duration: int
    prompt_eval_count: int


class EmbeddingsResponse(ReplyModel):
    embedding: list[float]


class ModelDetails(ReplyModel):
    parent_model: str = ""
    format: str = "mlx"
    family: str = ""
    families: list[str] | None = None
    parameter_size: str = ""
    """``135M``, ``7.6B``."""
    quantization_level: str = ""
    """``Q4`` (4-bit), ``BF16``..."""


class ModelEntry(ReplyModel):
    name: str
    model: str
    modified_at: str
    size: int
    """Bytes of the model's files."""
    digest: str
    details: ModelDetails


class Tags(ReplyModel):
    """The answer of ``GET /api/tags``."""

    models: list[ModelEntry]


class ShowResponse(ReplyModel):
    """The answer of ``POST /api/show``."""

    modelfile: str
    parameters: str
    template: str
    details: ModelDetails
    model_info: dict[str, Any]
    capabilities: list[str]
    """``completion``, ``tools``, ``vision``, ``thinking``, ``embedding``."""
    modified_at: str


class RunningModel(ReplyModel):
    """A model in memory: Ollama's fields, then this server's residency figures
    (``kind``, ``path``, ``engine_type``, ``memory_bytes``, ``keep_alive_s``...)."""

    name: str
    model: str
    size: int
    digest: str
    details: ModelDetails
    expires_at: str | None
    """When it unloads if no request comes, RFC 3339; null when it will not."""
    size_vram: int
    context_length: int | None = None


class RunningModels(ReplyModel):
    """The answer of ``GET /api/ps``."""

    models: list[dict[str, Any]]
    """:class:`RunningModel` objects with the residency keys of ``mlxi ps`` beside."""


class Progress(ReplyModel):
    """A line of ``/api/pull``'s stream (and its one answer when not streamed)."""

    status: str
    digest: str | None = Field(default=None, exclude_if=_absent)
    total: int | None = Field(default=None, exclude_if=_absent)
    completed: int | None = Field(default=None, exclude_if=_absent)


class Version(ReplyModel):
    """The answer of ``GET /api/version``."""

    version: str
    """The Ollama API version this server answers as (clients compare it)."""
    mlxi: str
    """This server's own version."""


class ErrorBody(ReplyModel):
    """An error, as Ollama answers it (and as the last line of a stream)."""

    error: str
