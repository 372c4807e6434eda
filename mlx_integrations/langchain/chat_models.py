"""ChatMLX: local MLX models as a LangChain chat model."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Sequence
from contextlib import aclosing, closing
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Literal, Self

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.chat_models import LangSmithParams
from langchain_core.language_models.model_profile import ModelProfile
from langchain_core.messages import AIMessage, BaseMessage, convert_to_messages
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import (
    JsonOutputKeyToolsParser,
    PydanticToolsParser,
)
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import (
    Runnable,
    RunnableGenerator,
    RunnableLambda,
    RunnableMap,
    RunnablePassthrough,
)
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from mlx_integrations.chat.completion import Finished, stream_chat_events
from mlx_integrations.chat.reasoning import apply_effort
from mlx_integrations.chat.request import ChatRequest, CheckedTools
from mlx_integrations.chat.tools import read_tool_request
from mlx_integrations.langchain.blocks import PROVIDER
from mlx_integrations.langchain.events import ProtocolEvents
from mlx_integrations.langchain.messages import to_neutral_messages
from mlx_integrations.langchain.profile import model_profile
from mlx_integrations.langchain.replies import (
    ChunkMaker,
    protocol_usage,
    response_metadata,
    result_from_chunks,
    result_from_events,
)
from mlx_integrations.langchain.structured import (
    areject_truncated,
    plain_schema,
    reject_truncated,
    unwrap,
    wrapping_tool,
)
from mlx_integrations.runtime.sync import iterate_sync
from mlx_integrations.settings.chat import ChatSettings

if TYPE_CHECKING:
    # The content-block protocol's event type (``stream_events(version="v3")``); a type
    # only, so an older langchain-core without that protocol still imports ChatMLX.
    from langchain_protocol.protocol import MessagesData


class ChatMLX(ChatSettings, BaseChatModel):
    """A LangChain chat model served by a local MLX engine, no server needed.

    Setup:
        ``pip install "mlx-integrations[cpu]"`` on Linux (Metal is built in on macOS).

    Instantiate:
        .. code-block:: python

            from mlx_integrations.langchain import ChatMLX

            llm = ChatMLX(model="mlx-community/Qwen2.5-0.5B-Instruct-4bit", max_tokens=256)
            # or a folder, a store alias from `mlxi list`, or any BaseEngine:
            # llm = ChatMLX(engine=my_engine)

    Invoke:
        .. code-block:: python

            msg = llm.invoke("What is the capital of France?")
            print(msg.content, msg.usage_metadata)

    Stream:
        .. code-block:: python

            for chunk in llm.stream("Write a haiku about the sea"):
                print(chunk.content, end="", flush=True)

    Async:
        .. code-block:: python

            msg = await llm.ainvoke("Hello")
            # Concurrent calls decode together on the default engine (BatchedEngine);
            # engine_type="simple" serves one at a time.
            results = await llm.abatch(["Hi", "Bonjour"])

    Images (a vision-language model):
        .. code-block:: python

            from langchain_core.messages import HumanMessage

            vlm = ChatMLX(model="mlx-community/Qwen2.5-VL-3B-Instruct-4bit")
            msg = HumanMessage(content=[
                {"type": "image", "url": "chart.png"},  # a path or an http(s)/file/data URL
                # {"type": "image", "base64": b64, "mime_type": "image/png"}
                # {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}
                {"type": "text", "text": "What does this chart show?"},
            ])
            print(vlm.invoke([msg]).content)

    Tool calling:
        .. code-block:: python

            def get_weather(city: str) -> str:
                \"\"\"Weather in a city.\"\"\"
                return "sunny"

            msg = llm.bind_tools([get_weather], tool_choice="any").invoke("Weather in Paris?")
            print(msg.tool_calls)  # [{'name': 'get_weather', 'args': {'city': 'Paris'}, ...}]

    Structured output:
        .. code-block:: python

            from pydantic import BaseModel

            class City(BaseModel):
                name: str
                country: str

            city = llm.with_structured_output(City).invoke("Paris is in France.")
    """

    model_config = ConfigDict(populate_by_name=True)

    model: str | None = Field(default=None, alias="model_name")
    """A model folder, a store alias (``mlxi list``) or a Hugging Face repo id pulled with
    ``mlxi pull``. Ignored when ``engine`` is given. A call may name another one
    (``llm.invoke(..., model="other")``); its engine comes from the same shared pool."""
    stop: list[str] | None = Field(default=None, alias="stop_sequences")
    """Stop sequences; they are never part of the output."""
    streaming: bool = False
    """Make ``invoke`` stream internally (callbacks see tokens as they come)."""
    stream_usage: bool = True
    """Put ``usage_metadata`` on the last chunk of a stream (a call may pass
    ``stream_usage=`` too). Local token counts cost nothing, so it is on by default."""
    max_retries: int | None = None
    """Accepted for compatibility with LangChain's standard parameters; unused locally."""
    api_key: SecretStr | None = Field(default=None, exclude=True, repr=False)
    """Accepted for compatibility with LangChain's standard parameters; unused locally
    (no server to authenticate to)."""

    # -------------------------------------------------------------- identity

    @property
    def _llm_type(self) -> str:
        return "mlx-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "engine_type": type(self.engine).__name__,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "seed": self.seed,
            "stop": self.stop,
            # The rest also change replies, so LangChain's cache must tell them apart.
            "reasoning": self.reasoning,
            "reasoning_effort": self.reasoning_effort,
            "thinking_budget": self.thinking_budget,
            "chat_template_kwargs": self.chat_template_kwargs,
            "tool_format": self.tool_format,
            "logprobs": self.logprobs,
            "top_logprobs": self.top_logprobs,
            "adapter_path": self.adapter_path,
            "kv_bits": self.kv_bits,
            "kv_group_size": self.kv_group_size,
            "quantized_kv_start": self.quantized_kv_start,
        }

    @model_validator(mode="after")
    def _profile_of_the_served_model(self) -> Self:
        # LangChain's own validator asks for the profile before the engine is made.
        if self.profile is None:
            self.profile = self._resolve_model_profile()
        return self

    def _resolve_model_profile(self) -> ModelProfile | None:
        """What the served model takes and does, read from the model (see
        :mod:`~mlx_integrations.langchain.profile`); a ``reasoning_effort`` it does not
        take is refused here, naming the levels it takes."""
        if self.engine is None:
            return None
        profile = model_profile(self.engine)
        levels = profile.get("reasoning_effort_levels") or []
        if self.reasoning_effort is not None and self.reasoning_effort not in levels:
            takes = f"takes {', '.join(map(repr, levels))}" if levels else "does not think"
            raise ValueError(
                f"ChatMLX(reasoning_effort={self.reasoning_effort!r}): {self.model!r} {takes}"
                " (profile['reasoning_effort_levels']); pick one of those or leave it unset"
            )
        return profile

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider=PROVIDER,
            ls_model_name=kwargs.get("model") or self.model or "",
            ls_model_type="chat",
            ls_temperature=kwargs.get("temperature", self.temperature),
            ls_max_tokens=kwargs.get("max_tokens", self.max_tokens),
        )
        if stop or self.stop:
            params["ls_stop"] = stop or self.stop
        return params

    # ------------------------------------------------------------ generation

    def _request(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> ChatRequest:
        call = dict(kwargs)
        call.pop("ls_structured_output_format", None)
        model = call.pop("model", None) or self.model  # reported as given, not resolved
        call.pop("stream", None)  # LangChain's own switch, already acted on
        call.pop("stream_usage", None)  # read by _stream; a whole reply always has usage
        return self.build_request(to_neutral_messages(messages), call, stop=stop, model=model)

    async def _aevents(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        kwargs: dict[str, Any],
        stream: bool = True,
    ) -> AsyncGenerator[Any, None]:
        override = kwargs.get("model")
        request = self._request(messages, stop, kwargs)
        if not override or override == self.model:
            async for event in stream_chat_events(self._served_engine(), request, stream):
                yield event
            return
        # A per-call model: its engine comes from the same pool (loaded once, shared).
        from mlx_integrations.engine import pool

        engine_type = self.engine_type_for(override)
        engine = pool.acquire(override, engine_type=engine_type, **self.made_engine_options())
        try:
            async for event in stream_chat_events(engine, request, stream):
                yield event
        finally:
            pool.release(engine)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        maker = ChunkMaker(self._stream_usage(kwargs), self.output_version == "v1")
        for event in iterate_sync(self._aevents(messages, stop, kwargs)):
            chunk = maker.chunk(event)
            if run_manager and chunk.message.content:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        maker = ChunkMaker(self._stream_usage(kwargs), self.output_version == "v1")
        async for event in self._aevents(messages, stop, kwargs):
            chunk = maker.chunk(event)
            if run_manager and chunk.message.content:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    def _stream_chat_model_events(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[MessagesData]:
        """``stream_events(version="v3")``: protocol events made from the reply's own
        blocks (see :mod:`~mlx_integrations.langchain.events`)."""
        kwargs.pop("stream_usage", None)  # message-finish always carries the usage
        writer = self._protocol_events(kwargs)
        last: list[MessagesData] = []
        # LangChain stops pulling at message-finish: the request (and a per-call model's
        # pool lease) is closed before that last event goes out, not when this is freed.
        with closing(iterate_sync(self._aevents(messages, stop, kwargs))) as events:
            for event in events:
                if isinstance(event, Finished):
                    last = writer.feed(event)
                    break
                yield from writer.feed(event)
        yield from last

    async def _astream_chat_model_events(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[MessagesData]:
        """``astream_events(version="v3")``: as :meth:`_stream_chat_model_events`."""
        kwargs.pop("stream_usage", None)
        writer = self._protocol_events(kwargs)
        last: list[MessagesData] = []
        async with aclosing(self._aevents(messages, stop, kwargs)) as events:
            async for event in events:
                if isinstance(event, Finished):
                    last = writer.feed(event)
                    break
                for item in writer.feed(event):
                    yield item
        for item in last:
            yield item

    def _protocol_events(self, kwargs: dict[str, Any]) -> ProtocolEvents:
        model = kwargs.get("model") or self.model
        return ProtocolEvents(
            PROVIDER, model, lambda end: (protocol_usage(end), response_metadata(end))
        )

    def _stream_usage(self, kwargs: dict[str, Any]) -> bool:
        """Whether a stream's last chunk carries usage (the call's ``stream_usage``
        argument, taken out of ``kwargs``, else the field)."""
        value = kwargs.pop("stream_usage", None)
        if value is None:
            return self.stream_usage
        if not isinstance(value, bool):
            raise TypeError(f"stream_usage must be True or False, got {value!r}")
        return value

    # ---------------------------------------------------------- token counts

    def get_token_ids(self, text: str) -> list[int]:
        """The ids of ``text`` in the model's own tokenizer (no special tokens added)."""
        if self.custom_get_token_ids is not None:
            return self.custom_get_token_ids(text)
        return list(self._served_engine().tokenizer.encode(text, add_special_tokens=False))

    def get_num_tokens_from_messages(
        self, messages: list[BaseMessage], tools: Sequence[Any] | None = None
    ) -> int:
        """Tokens of the prompt that ``messages`` (and ``tools``) render to through the
        model's chat template: the ``input_tokens`` a call with them reports.

        A list the template refuses (some templates want strictly alternating roles,
        and ``trim_messages`` counts parts of a conversation) is counted message by
        message with the model's tokenizer instead.
        """
        if not messages:
            return 0
        messages = convert_to_messages(messages)  # ("human", "hi") tuples and dicts too
        engine = self._served_engine()
        render = getattr(engine, "render_prompt", None)
        neutral = to_neutral_messages(messages)
        tokenizer = engine.tokenizer  # loads the model, so the template is known
        if self.custom_get_token_ids is None and render is not None:
            template_kwargs = dict(self.chat_template_kwargs)
            if self.reasoning is not None:
                template_kwargs["enable_thinking"] = self.reasoning
            neutral, template_kwargs = apply_effort(  # as a call renders it
                tokenizer, self.reasoning_effort, neutral, template_kwargs
            )
            openai_tools = [convert_to_openai_tool(t) for t in tools] if tools else None
            try:
                prompt = render(neutral, tools=openai_tools, **template_kwargs)
            except Exception:  # the template's own errors: count per message
                pass
            else:
                return len(tokenizer.encode(prompt, add_special_tokens=False))
        return super().get_num_tokens_from_messages(messages, tools)

    # ------------------------------------------------------------ generation

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.streaming:
            return result_from_chunks(list(self._stream(messages, stop, run_manager, **kwargs)))
        events = list(iterate_sync(self._aevents(messages, stop, kwargs, stream=False)))
        return result_from_events(events, self.output_version == "v1")

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.streaming:
            chunks = [c async for c in self._astream(messages, stop, run_manager, **kwargs)]
            return result_from_chunks(chunks)
        events = [e async for e in self._aevents(messages, stop, kwargs, stream=False)]
        return result_from_events(events, self.output_version == "v1")

    # ----------------------------------------------------------------- tools

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: dict[str, Any] | str | bool | None = None,
        parallel_tool_calls: bool | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools; ``tool_choice`` is enforced by constrained decoding.

        Args:
            tools: Dicts (OpenAI format), pydantic models, functions or ``BaseTool``.
            tool_choice: ``"auto"`` (default), ``"none"``, ``"any"``/``"required"``/True
                (must call one), or a tool name (must call that one).
            parallel_tool_calls: Allow several calls in one turn. By default True with
                ``"auto"``, and one call when a call is forced (``"any"`` or a name).
            strict: Accepted for API compatibility (it is no call argument): a forced
                call always follows the tool's schema; with ``"auto"`` the calls the
                model writes are parsed, and malformed ones go to ``invalid_tool_calls``.
            **kwargs: Further call arguments to bind.
        """
        del strict
        formatted = [convert_to_openai_tool(t) for t in tools]
        # Checked once, here: a bad tool fails now, not at the first call, and the calls
        # take the checked tools as they are.
        checked = read_tool_request(
            formatted, tool_choice, bool(parallel_tool_calls in (None, True))
        )
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        if parallel_tool_calls is not None:
            kwargs["parallel_tool_calls"] = parallel_tool_calls
        return super().bind(tools=CheckedTools(formatted, checked.tools), **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type | None = None,
        *,
        method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | BaseModel]:
        """Outputs that match ``schema``, guaranteed by constrained decoding.

        Args:
            schema: A pydantic class, TypedDict, JSON schema or OpenAI tool dict (may be
                None with ``method="json_mode"``).
            method: ``"json_schema"`` (default; the reply is constrained to the schema),
                ``"function_calling"`` (a forced call of a tool with that schema) or
                ``"json_mode"`` (any JSON object).
            include_raw: Return ``{"raw", "parsed", "parsing_error"}`` instead of raising.
            strict: Accepted for API compatibility; outputs always follow the schema.
        """
        if kwargs:
            raise ValueError(f"Received unsupported arguments {kwargs}")
        is_pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
        fmt: dict[str, Any] | None = {
            "kwargs": {"method": method, "strict": strict},
            "schema": schema,
        }
        scalar = plain_schema(schema) if not is_pydantic else None
        if method == "function_calling":
            if schema is None:
                raise ValueError("method='function_calling' needs a schema")
            if scalar is not None and scalar.get("type") != "object" and "properties" not in scalar:
                # Tool arguments are an object: a value of another type travels wrapped.
                tool = wrapping_tool(scalar)
                name = tool["function"]["name"]
                parser: Runnable = JsonOutputKeyToolsParser(
                    key_name=name, first_tool_only=True
                ) | RunnableLambda(unwrap)
            else:
                tool = convert_to_openai_tool(schema)
                name = tool["function"]["name"]
                parser = (
                    PydanticToolsParser(tools=[schema], first_tool_only=True)  # type: ignore[list-item]
                    if is_pydantic
                    else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
                )
            llm = self.bind_tools(
                [tool], tool_choice=name, parallel_tool_calls=False, ls_structured_output_format=fmt
            )
        elif method in ("json_schema", "json_mode"):
            if schema is None and method == "json_schema":
                raise ValueError("method='json_schema' needs a schema")
            # json_mode: any JSON object; when a schema is given, constrained to it as well.
            response_format: dict[str, Any] = {"type": "json_object"}
            if schema is not None:
                json_schema = scalar if scalar is not None else convert_to_json_schema(schema)
                response_format = {"type": "json_schema", "json_schema": {"schema": json_schema}}
            if method == "json_mode" and not schema:
                fmt = None
            llm = self.bind(response_format=response_format, ls_structured_output_format=fmt)
            parser = (
                PydanticOutputParser(pydantic_object=schema)  # type: ignore[arg-type]
                if is_pydantic
                else JsonOutputParser()
            )
        else:
            raise ValueError(
                f"method must be 'json_schema', 'function_calling' or 'json_mode', got {method!r}"
            )
        # A generator, so that a stream's chunks flow on to the parser (a JSON parser
        # yields partial objects as they grow) and only a cut-off end raises.
        parser = RunnableGenerator(reject_truncated, areject_truncated) | parser
        if include_raw:
            with_parsed = RunnablePassthrough.assign(
                parsed=itemgetter("raw") | parser, parsing_error=lambda _: None
            )
            fallback = RunnablePassthrough.assign(parsed=lambda _: None)
            return RunnableMap(raw=llm) | with_parsed.with_fallbacks(
                [fallback], exception_key="parsing_error"
            )
        return llm | parser
