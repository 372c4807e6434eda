"""MLXLLM: local MLX models as a LlamaIndex function-calling LLM."""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
    ToolCallBlock,
)
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.types import PydanticProgramMode
from pydantic import field_validator

from mlx_integrations.chat.completion import (
    speculative_metadata,
    stream_chat_events,
    within_timeout,
)
from mlx_integrations.chat.request import ChatRequest, CheckedTools
from mlx_integrations.chat.tools import read_tools
from mlx_integrations.engine.base import GenerationOutput
from mlx_integrations.engine.options import EngineOptions
from mlx_integrations.engine.vision.media import MediaLimits
from mlx_integrations.llama_index.messages import to_neutral_messages
from mlx_integrations.llama_index.responses import (
    ResponseState,
    StructuredOutputTruncated,
    StructuredStream,
    final_response,
    parse_structured,
    usage_raw,
)
from mlx_integrations.runtime.sync import iterate_sync
from mlx_integrations.settings.chat import ChatSettings

if TYPE_CHECKING:
    from llama_index.core.prompts import BasePromptTemplate
    from llama_index.core.tools.types import BaseTool
    from pydantic import BaseModel

__all__ = ["MLXLLM", "MLXLLMMetadata", "StructuredOutputTruncated"]

DEFAULT_CONTEXT_WINDOW = 4096


class MLXLLMMetadata(LLMMetadata):
    """LlamaIndex's ``LLMMetadata``, and whether the model takes images and video."""

    is_multimodal: bool = False
    """True for a vision-language model: ``ImageBlock`` / ``VideoBlock`` reach it."""


class MLXLLM(ChatSettings, FunctionCallingLLM):
    """A LlamaIndex LLM served by a local MLX engine: chat, tools, structured output.

    Every entry point is native (sync from any thread, async without blocking the
    event loop); tool calls come back as ``ToolCallBlock`` with real call ids;
    ``tool_required`` is enforced by constrained decoding.

    Examples:
        .. code-block:: python

            from llama_index.core import Settings
            from llama_index.core.llms import ChatMessage
            from mlx_integrations.llama_index import MLXLLM

            llm = MLXLLM(model="mlx-community/Qwen2.5-0.5B-Instruct-4bit", max_tokens=256)
            Settings.llm = llm
            print(llm.chat([ChatMessage(role="user", content="Hello!")]))
            for r in llm.stream_complete("The capital of France is"):
                print(r.delta, end="")

    Async (calls made together decode together on the default engine, ``BatchedEngine``;
    ``engine_type="simple"`` serves one at a time):
        .. code-block:: python

            import asyncio

            questions = ["Capital of France?", "Capital of Italy?"]
            replies = await asyncio.gather(
                *[llm.achat([ChatMessage(role="user", content=q)]) for q in questions]
            )

    Images (a vision-language model; ``llm.metadata.is_multimodal`` is True):
        .. code-block:: python

            from llama_index.core.llms import ImageBlock, TextBlock

            vlm = MLXLLM(model="mlx-community/Qwen2.5-VL-3B-Instruct-4bit")
            msg = ChatMessage(role="user", blocks=[
                ImageBlock(path="chart.png"),  # or url="https://...", image=png_bytes
                TextBlock(text="What does this chart show?"),
            ])
            print(vlm.chat([msg]).message.content)

    Tool calling:
        .. code-block:: python

            from llama_index.core.tools import FunctionTool

            def get_weather(city: str) -> str:
                \"\"\"Weather in a city.\"\"\"
                return "sunny"

            tool = FunctionTool.from_defaults(get_weather)
            response = llm.chat_with_tools([tool], user_msg="Weather in Paris?",
                                           tool_required=True)
            print(llm.get_tool_calls_from_response(response))
    """

    context_window: int | None = None
    """Context window; read from the model's config when None."""
    response_format: dict[str, Any] | Callable[[list[dict[str, Any]]], Any] | None = None
    """Constraint applied to calls that set none: ``{'type': 'json_object'}``,
    ``{'type': 'json_schema', ...}`` or ``{'type': 'grammar', 'grammar': <lark>}`` (see
    ``react_response_format`` for ReAct agents)."""

    @field_validator("context_window")
    @classmethod
    def _positive_window(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(
                f"context_window must be a positive number of tokens, got {value!r}; "
                "leave it None to read it from the model's config"
            )
        return value

    @field_validator("response_format")
    @classmethod
    def _known_response_format(cls, value: Any) -> Any:
        if value is not None and not callable(value):
            from mlx_integrations.chat.constraints import response_format_constraint

            response_format_constraint(value)  # raises naming what is wrong, before any call
        return value

    @classmethod
    def class_name(cls) -> str:
        return "MLXLLM"

    @property
    def metadata(self) -> MLXLLMMetadata:
        window = self.context_window or getattr(self.engine, "context_length", None)
        return MLXLLMMetadata(
            context_window=window or DEFAULT_CONTEXT_WINDOW,
            num_output=self.max_tokens,
            is_chat_model=True,
            is_function_calling_model=True,
            model_name=self.model or "",
            is_multimodal=bool(self._served_engine().is_mllm),
        )

    # ------------------------------------------------------------- internals

    def _request(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> ChatRequest:
        call = dict(kwargs)
        call.pop("formatted", None)
        call.setdefault("parallel_tool_calls", True)
        stop = call.pop("stop", None)
        served = getattr(self._served_engine(), "options", None)
        limits = served.media_limits if isinstance(served, EngineOptions) else MediaLimits()
        neutral = to_neutral_messages(messages, limits.max_bytes)
        response_format = call.get("response_format", self.response_format)
        if callable(response_format):  # chosen per call from the conversation
            response_format = response_format(neutral)
        call["response_format"] = response_format
        # reported as given (metadata.model_name), not resolved
        return self.build_request(neutral, call, stop=stop, model=self.model)

    async def _astream_responses(
        self, messages: Sequence[ChatMessage], kwargs: dict[str, Any], stream: bool = True
    ) -> AsyncIterator[ChatResponse]:
        request = self._request(messages, kwargs)
        state = ResponseState()
        async for event in stream_chat_events(self._served_engine(), request, stream):
            yield state.add(event)

    # ---------------------------------------------------------------- chat

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        last = None
        for last in iterate_sync(self._astream_responses(messages, kwargs, False)):  # noqa: B007
            pass
        assert last is not None
        return final_response(last)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        def gen() -> ChatResponseGen:
            yield from iterate_sync(self._astream_responses(messages, kwargs))

        return gen()

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        last = None
        async for last in self._astream_responses(messages, kwargs, False):  # noqa: B007
            pass
        assert last is not None
        return final_response(last)

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        async def gen() -> ChatResponseAsyncGen:
            async for response in self._astream_responses(messages, kwargs):
                yield response

        return gen()

    # ------------------------------------------------------------ complete

    def _completion_messages(self, prompt: str) -> list[ChatMessage]:
        messages = [ChatMessage(role=MessageRole.USER, content=prompt)]
        return self._extend_messages(messages)

    async def _astream_completion(
        self, prompt: str, formatted: bool, kwargs: dict[str, Any]
    ) -> AsyncIterator[CompletionResponse]:
        if not formatted:
            async for r in self._astream_responses(self._completion_messages(prompt), kwargs):
                yield CompletionResponse(
                    text=r.message.content or "",
                    delta=r.delta,
                    raw=r.raw,
                    additional_kwargs=r.additional_kwargs,
                )
            return
        # formatted=True: the prompt is sent as is, no chat template.
        request = self._request([ChatMessage(role="user", content=prompt)], kwargs)
        if request.tools.tools:
            raise ValueError(
                "tools cannot be used with formatted=True (the prompt is raw text); "
                "use chat_with_tools"
            )
        options: dict[str, Any] = request.sampling.options()
        processors = list(request.logits_processors)
        if request.format_constraint is not None:
            tokenizer = self._served_engine().tokenizer
            processors.append(request.format_constraint.make_processor(tokenizer))
        if processors:
            options["logits_processors"] = processors
        # The contract declares stream_generate ``async def``; engines make it a generator.
        stream = cast(
            AsyncIterator[GenerationOutput],
            self._served_engine().stream_generate(
                prompt,
                max_tokens=request.max_tokens,
                temperature=request.temperature,
                top_p=request.top_p,
                stop=list(request.stop) or None,
                **options,
            ),
        )
        if request.timeout is not None:
            stream = within_timeout(stream, request.timeout, request.max_tokens)
        text = ""
        async for out in stream:
            text += out.new_text
            raw = None
            if out.finished:
                raw = usage_raw(
                    out.prompt_tokens,
                    out.completion_tokens,
                    int(getattr(out, "cached_tokens", 0) or 0),
                    out.finish_reason,
                    self.model,
                )
                path = getattr(self._served_engine(), "model_path", None)
                if path is not None:
                    raw["model_path"] = str(path)
                raw.update(speculative_metadata(out.mtp_drafts, out.mtp_accepted))
            if out.new_text or out.finished:
                yield CompletionResponse(text=text, delta=out.new_text, raw=raw)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        last = None
        for last in iterate_sync(self._astream_completion(prompt, formatted, kwargs)):  # noqa: B007
            pass
        assert last is not None
        return CompletionResponse(
            text=last.text, raw=last.raw, additional_kwargs=last.additional_kwargs
        )

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        def gen() -> CompletionResponseGen:
            yield from iterate_sync(self._astream_completion(prompt, formatted, kwargs))

        return gen()

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        last = None
        async for last in self._astream_completion(prompt, formatted, kwargs):  # noqa: B007
            pass
        assert last is not None
        return CompletionResponse(
            text=last.text, raw=last.raw, additional_kwargs=last.additional_kwargs
        )

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        async def gen() -> CompletionResponseAsyncGen:
            async for r in self._astream_completion(prompt, formatted, kwargs):
                yield r

        return gen()

    # --------------------------------------------------------------- tools

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        tool_choice: str | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        specs = []
        for tool in tools:
            if tool.metadata.fn_schema is None:
                warnings.warn(
                    f"Tool {tool.metadata.name!r} has fn_schema=None, so it takes LlamaIndex's "
                    "default argument {'input': str}; give it an fn_schema (FunctionTool."
                    "from_defaults infers one from the function's signature)",
                    UserWarning,
                    stacklevel=2,
                )
            specs.append(tool.metadata.to_openai_tool())
        checked = CheckedTools(specs, read_tools(specs))  # checked once, here
        messages = list(chat_history or [])
        if isinstance(user_msg, str):
            user_msg = ChatMessage(role=MessageRole.USER, content=user_msg)
        if user_msg is not None:
            messages.append(user_msg)
        if tool_choice is None:
            tool_choice = "required" if tool_required else "auto"
        return {
            "messages": messages,
            "tools": checked or None,
            "tool_choice": tool_choice if specs else None,
            "parallel_tool_calls": allow_parallel_tool_calls,
            **kwargs,
        }

    def _validate_chat_with_tools_response(
        self,
        response: ChatResponse,
        tools: Sequence[BaseTool],
        allow_parallel_tool_calls: bool = False,
        **kwargs: Any,
    ) -> ChatResponse:
        if not allow_parallel_tool_calls:
            calls = [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]
            if len(calls) > 1:
                keep = calls[0]
                response.message.blocks = [
                    b
                    for b in response.message.blocks
                    if not isinstance(b, ToolCallBlock) or b is keep
                ]
        return response

    def get_tool_calls_from_response(
        self,
        response: ChatResponse,
        error_on_no_tool_call: bool = True,
        **kwargs: Any,
    ) -> list[ToolSelection]:
        """Tool calls of a response (works on every partial chunk of a stream)."""
        selections = [
            ToolSelection(
                tool_id=block.tool_call_id or "",
                tool_name=block.tool_name,
                tool_kwargs=block.tool_kwargs if isinstance(block.tool_kwargs, dict) else {},
            )
            for block in response.message.blocks
            if isinstance(block, ToolCallBlock)
        ]
        if not selections and error_on_no_tool_call:
            invalid = response.additional_kwargs.get("invalid_tool_calls")
            if invalid:
                detail = f"; the model wrote malformed calls: {invalid}"
            else:
                text = (response.message.content or "")[:200]
                detail = (
                    f"; the model answered in text instead: {text!r}. To make it call a "
                    "tool, pass tool_required=True (or tool_choice='<tool name>') to "
                    "chat_with_tools / predict_and_call: the call is then constrained "
                    "to the tool's schema"
                )
            raise ValueError(f"Expected at least one tool call, but got 0 tool calls{detail}")
        return selections

    # ---------------------------------------------------- structured output

    def _schema_call(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None,
        prompt_args: dict[str, Any],
    ) -> tuple[list[ChatMessage], dict[str, Any]]:
        """The messages and chat arguments of a call constrained to ``output_cls``'s schema."""
        messages = self._extend_messages(prompt.format_messages(**prompt_args))
        schema = output_cls.model_json_schema()
        response_format = {"type": "json_schema", "json_schema": {"schema": schema}}
        return messages, {**(llm_kwargs or {}), "response_format": response_format}

    def structured_predict(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> BaseModel:
        """Predict an instance of ``output_cls``; the output is constrained to its schema."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return super().structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        messages, kwargs = self._schema_call(output_cls, prompt, llm_kwargs, prompt_args)
        return parse_structured(output_cls, self.chat(messages, **kwargs))

    async def astructured_predict(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> BaseModel:
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return await super().astructured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        messages, kwargs = self._schema_call(output_cls, prompt, llm_kwargs, prompt_args)
        return parse_structured(output_cls, await self.achat(messages, **kwargs))

    def stream_structured_predict(  # type: ignore[override]
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Iterator[Any]:
        """Yield partial objects as the JSON streams in, the complete one last."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return super().stream_structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        messages, kwargs = self._schema_call(output_cls, prompt, llm_kwargs, prompt_args)
        stream = self.stream_chat(messages, **kwargs)

        def gen() -> Iterator[Any]:
            fold = StructuredStream(output_cls)
            for response in stream:
                if (partial := fold.add(response)) is not None:
                    yield partial
            yield fold.result()

        return gen()

    async def astream_structured_predict(  # type: ignore[override]
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> AsyncIterator[Any]:
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return await super().astream_structured_predict(
                output_cls, prompt, llm_kwargs, **prompt_args
            )
        messages, kwargs = self._schema_call(output_cls, prompt, llm_kwargs, prompt_args)
        stream = await self.astream_chat(messages, **kwargs)

        async def gen() -> AsyncIterator[Any]:
            fold = StructuredStream(output_cls)
            async for response in stream:
                if (partial := fold.add(response)) is not None:
                    yield partial
            yield fold.result()

        return gen()
