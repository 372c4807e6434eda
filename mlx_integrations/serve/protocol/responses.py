"""OpenAI's Responses API (``POST /v1/responses``), as typed objects.

A request carries its conversation in ``input``, or continues a kept response
(``previous_response_id``). Items and tools of types this server does not serve are
typed as "other" so that the translator names them in its refusal (``tools[4].type``)
and later servers can take them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, Tag, field_validator, model_serializer

from mlx_integrations.serve.protocol.base import (
    Fallback,
    ReplyModel,
    WireModel,
    other_than,
    tagged,
    unused,
)
from mlx_integrations.serve.protocol.openai import JSONObjectFormat, TextFormat

__all__ = ["Response", "ResponseEvent", "ResponsesRequest"]


# ------------------------------------------------------------------------- input


class InputText(WireModel):
    type: Literal["input_text", "output_text", "text"]
    text: str
    annotations: list[Any] | None = unused()
    logprobs: list[Any] | None = unused()


class InputImage(WireModel):
    type: Literal["input_image"]
    image_url: str | None = None
    """A URL or a ``data:`` URL (``file_id`` is not served)."""
    detail: str | None = unused()


class OtherContent(Fallback):
    """A part of another type (files, audio, refusals): refused, naming it."""

    model_config = other_than("input_text", "output_text", "text", "input_image")

    type: str


InputContent = Annotated[
    Annotated[InputText, Tag("type=text")]
    | Annotated[InputImage, Tag("type=input_image")]
    | Annotated[OtherContent, Tag("type=other")],
    tagged(
        "type",
        {
            "input_text": "type=text",
            "output_text": "type=text",
            "text": "type=text",
            "input_image": "type=input_image",
        },
        other="type=other",
    ),
]


class MessageItem(WireModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputContent]
    id: str | None = unused()
    status: str | None = unused()


class FunctionCallItem(WireModel):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str = "{}"
    """The arguments as a JSON object string."""
    id: str | None = unused()
    status: str | None = unused()


class FunctionCallOutputItem(WireModel):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputContent]
    id: str | None = unused()
    status: str | None = unused()


class CustomToolCallItem(WireModel):
    """An earlier call of a custom (freeform) tool: its input is one string."""

    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str
    id: str | None = unused()
    status: str | None = unused()


class CustomToolCallOutputItem(WireModel):
    type: Literal["custom_tool_call_output"]
    call_id: str
    output: str | list[InputContent]
    id: str | None = unused()
    status: str | None = unused()


class ReasoningItem(WireModel):
    """Reasoning of an earlier turn: not shown to the model again."""

    type: Literal["reasoning"]
    id: str | None = unused()
    summary: list[Any] | None = unused()
    content: list[Any] | None = unused()
    encrypted_content: str | None = unused()
    status: str | None = unused()


class OtherItem(Fallback):
    """An item of another type (``item_reference``, hosted tools' calls...)."""

    model_config = other_than(
        "message",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "reasoning",
    )

    type: str


InputItem = Annotated[
    Annotated[MessageItem, Tag("type=message")]
    | Annotated[FunctionCallItem, Tag("type=function_call")]
    | Annotated[FunctionCallOutputItem, Tag("type=function_call_output")]
    | Annotated[CustomToolCallItem, Tag("type=custom_tool_call")]
    | Annotated[CustomToolCallOutputItem, Tag("type=custom_tool_call_output")]
    | Annotated[ReasoningItem, Tag("type=reasoning")]
    | Annotated[OtherItem, Tag("type=other")],
    tagged(
        "type",
        {
            None: "type=message",  # a message may leave its type out
            "message": "type=message",
            "function_call": "type=function_call",
            "function_call_output": "type=function_call_output",
            "custom_tool_call": "type=custom_tool_call",
            "custom_tool_call_output": "type=custom_tool_call_output",
            "reasoning": "type=reasoning",
        },
        other="type=other",
    ),
]


# ------------------------------------------------------------------------- tools


class FunctionTool(WireModel):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """The arguments' JSON schema (an object)."""
    strict: bool | None = unused()


class NamespaceTool(WireModel):
    """A group of function tools under one name (Codex's sub-agent tools): its
    functions are offered as they are."""

    type: Literal["namespace"]
    name: str | None = unused()
    description: str | None = unused()
    tools: list[FunctionTool]


class TextToolFormat(WireModel):
    """Free text."""

    type: Literal["text"]


class GrammarToolFormat(WireModel):
    """Text of a grammar: Lark (llguidance's dialect) or a regular expression."""

    type: Literal["grammar"]
    syntax: Literal["lark", "regex"]
    definition: str


CustomToolFormat = Annotated[
    Annotated[TextToolFormat, Tag("type=text")] | Annotated[GrammarToolFormat, Tag("type=grammar")],
    tagged("type", {"text": "type=text", "grammar": "type=grammar"}),
]


class CustomTool(WireModel):
    """A freeform tool: its input is one string (Codex's ``apply_patch``). Offered to
    the model as a function of one string argument, ``input``."""

    type: Literal["custom"]
    name: str
    description: str | None = None
    format: CustomToolFormat | None = None
    """Free text (the default), or text of a grammar: a regular expression holds the
    input, as a Lark grammar of a regular language does (one with recursion is shown
    to the model in the tool's description only)."""


class OtherTool(Fallback):
    """A tool only the hosted API runs (``web_search``, ``file_search``...): left out of
    the prompt, and named in the ignored-fields header."""

    model_config = other_than("function", "namespace", "custom")

    type: str


ResponsesTool = Annotated[
    Annotated[FunctionTool, Tag("type=function")]
    | Annotated[NamespaceTool, Tag("type=namespace")]
    | Annotated[CustomTool, Tag("type=custom")]
    | Annotated[OtherTool, Tag("type=other")],
    tagged(
        "type",
        {"function": "type=function", "namespace": "type=namespace", "custom": "type=custom"},
        other="type=other",
    ),
]


class ToolChoiceObject(WireModel):
    type: str
    """``function`` or ``custom`` (with ``name``) forces that tool."""
    name: str | None = None


class JSONSchemaTextFormat(WireModel):
    type: Literal["json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = unused()


TextFormatSpec = Annotated[
    Annotated[TextFormat, Tag("type=text")]
    | Annotated[JSONObjectFormat, Tag("type=json_object")]
    | Annotated[JSONSchemaTextFormat, Tag("type=json_schema")],
    tagged(
        "type",
        {"text": "type=text", "json_object": "type=json_object", "json_schema": "type=json_schema"},
    ),
]


class TextConfig(WireModel):
    format: TextFormatSpec | None = None
    verbosity: str | None = unused()


class Reasoning(WireModel):
    effort: str | None = None
    """The chat template's own switch: ``none``, ``minimal`` (``low``), ``low``,
    ``medium``, ``high``, ``xhigh`` (``high``); a level the template lacks is the
    nearest one it takes, and a model that does not think leaves it out (reported)."""
    summary: str | None = unused()
    generate_summary: str | None = unused()


class ResponsesRequest(WireModel):
    """``POST /v1/responses``."""

    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    """A system message before the input."""
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceObject | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    thinking_budget: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    stream: bool = False
    previous_response_id: str | None = None
    """Continue from a kept response: its input and output items come before
    ``input`` (its ``instructions`` do not)."""
    store: bool | None = None
    """Keep the response (the default) for ``previous_response_id`` and ``GET
    /v1/responses/{id}``, in memory, for ``--responses-ttl``; ``false`` keeps nothing."""
    include: list[str] | None = unused()
    """``message.output_text.logprobs`` is served (reported as used); encrypted
    reasoning is not made here (reasoning items come back in clear)."""
    top_logprobs: int | None = None
    """With ``include: ["message.output_text.logprobs"]``: the 0 to 20 most likely
    tokens of each step of the answer."""
    metadata: dict[str, Any] | None = unused()
    user: str | None = unused()
    prompt_cache_key: str | None = unused()
    safety_identifier: str | None = unused()
    service_tier: str | None = unused()
    truncation: str | None = unused()
    max_tool_calls: int | None = unused()
    stream_options: dict[str, Any] | None = unused()

    @field_validator("input")
    @classmethod
    def _some_input(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("must be a string or a non-empty array of input items")
        return value


# ------------------------------------------------------------------------ output


class OutputText(ReplyModel):
    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)
    """With ``include: ["message.output_text.logprobs"]``: the text's tokens, each with
    its ``token``, ``logprob``, ``bytes`` and ``top_logprobs``."""


class ReasoningText(ReplyModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str = ""


class OutputMessage(ReplyModel):
    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed"] = "in_progress"
    role: Literal["assistant"] = "assistant"
    content: list[OutputText] = Field(default_factory=list)


class OutputReasoning(ReplyModel):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText] = Field(default_factory=list)
    status: Literal["in_progress", "completed"] = "in_progress"


class OutputFunctionCall(ReplyModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed"] = "completed"


class OutputCustomToolCall(ReplyModel):
    type: Literal["custom_tool_call"] = "custom_tool_call"
    id: str
    call_id: str
    name: str
    input: str
    status: Literal["in_progress", "completed"] = "completed"


OutputItem = Annotated[
    OutputMessage | OutputReasoning | OutputFunctionCall | OutputCustomToolCall,
    Field(discriminator="type"),
]


class InputTokensDetails(ReplyModel):
    cached_tokens: int = 0


class OutputTokensDetails(ReplyModel):
    reasoning_tokens: int = 0


class ResponseUsage(ReplyModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(ReplyModel):
    reason: Literal["max_output_tokens"]


class ResponseError(ReplyModel):
    """Why a response failed (``status: failed``)."""

    code: str
    message: str


class Response(ReplyModel):
    """The answer of ``POST /v1/responses`` (and the snapshot its stream events carry)."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"] = "in_progress"
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    tool_choice: Any = "auto"
    tools: list[Any] = Field(default_factory=list)
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    instructions: str | None = None
    text: Any = Field(default_factory=lambda: {"format": {"type": "text"}})
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    usage: ResponseUsage | None = None
    previous_response_id: str | None = None
    store: bool = True
    """Kept for ``previous_response_id`` and ``GET /v1/responses/{id}``."""
    top_logprobs: int | None = None


class ResponseEvent(ReplyModel):
    """One event of a streamed response: its ``type`` names it (``response.created``,
    ``response.output_text.delta``...); the other fields are those of that type."""

    type: str
    sequence_number: int
    response: Response | None = None
    output_index: int | None = None
    item: OutputItem | None = None
    item_id: str | None = None
    content_index: int | None = None
    part: OutputText | None = None
    delta: str | None = None
    text: str | None = None
    name: str | None = None
    arguments: str | None = None
    input: str | None = None
    logprobs: list[Any] | None = None

    @model_serializer(mode="wrap")
    def _own_fields(self, handler: Any) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if v is not None}
