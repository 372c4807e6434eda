"""A reusable conformance suite for LlamaIndex LLMs, in the spirit of langchain-tests.

Subclass :class:`LLMConformanceTests` in a test module and provide the ``llm`` fixture
(and, for function-calling LLMs, ``tool``). Every LLM that LlamaIndex's agents, query
engines and structured programs rely on should pass it:

- all eight entry points (chat, stream_chat, complete, stream_complete, and async);
- streams whose deltas add up to the final text, ending with usage in ``raw``;
- async calls that leave the event loop free;
- callbacks and instrumentation events fired as for built-in LLMs;
- token counts readable by ``TokenCountingHandler``;
- for function-calling LLMs: ``chat_with_tools`` with ``tool_required`` yields
  ``ToolCallBlock``s with ids, ``get_tool_calls_from_response`` works on every partial
  chunk of a stream, ``predict_and_call`` runs the tool, tool results are accepted back;
- ``structured_predict`` and its async and streaming forms return valid objects.

Knobs (class attributes): ``max_tokens`` for generation calls, ``is_function_calling``,
``supports_structured_output``.
"""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.callbacks import CallbackManager, CBEventType, TokenCountingHandler
from llama_index.core.callbacks.base_handler import BaseCallbackHandler
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import (
    LLMChatEndEvent,
    LLMChatStartEvent,
    LLMCompletionEndEvent,
)
from llama_index.core.prompts import PromptTemplate
from pydantic import BaseModel, Field

from tests.support.event_loop import loop_ticks_while

USER = [ChatMessage(role=MessageRole.USER, content="Say hello.")]


class Pick(BaseModel):
    """A choice among a few options (bounded, so any model can close it)."""

    color: str = Field(json_schema_extra={"enum": ["red", "green", "blue"]})
    count: int = Field(ge=0, le=9)


class _Recorder(BaseEventHandler):
    events: list = []

    @classmethod
    def class_name(cls) -> str:
        return "Recorder"

    def handle(self, event: Any, **kwargs: Any) -> None:
        self.events.append(event)


class _CallbackRecorder(BaseCallbackHandler):
    def __init__(self) -> None:
        super().__init__([], [])
        self.starts: list[CBEventType] = []
        self.ends: list[CBEventType] = []

    def on_event_start(self, event_type, payload=None, event_id="", parent_id="", **kw):
        self.starts.append(event_type)
        return event_id

    def on_event_end(self, event_type, payload=None, event_id="", **kw):
        self.ends.append(event_type)

    def start_trace(self, trace_id=None):
        pass

    def end_trace(self, trace_id=None, trace_map=None):
        pass


class LLMConformanceTests:
    """Subclass and provide the ``llm`` fixture (and ``tool`` for function calling)."""

    max_tokens = 16
    is_function_calling = True
    supports_structured_output = True

    # ------------------------------------------------------------------ chat

    def test_metadata(self, llm):
        meta = llm.metadata
        assert meta.is_chat_model is True
        assert meta.context_window > 0 and meta.num_output > 0
        assert meta.is_function_calling_model is self.is_function_calling
        assert meta.model_name

    def test_chat(self, llm):
        response = llm.chat(USER, max_tokens=self.max_tokens)
        assert response.message.role == MessageRole.ASSISTANT
        assert isinstance(response.message.content, str)
        usage = response.raw["usage"]
        assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= self.max_tokens

    def test_stream_chat_deltas_add_up(self, llm):
        responses = list(llm.stream_chat(USER, max_tokens=self.max_tokens))
        assert responses
        text = "".join(r.delta or "" for r in responses)
        assert text == responses[-1].message.content
        for r in responses:  # each carries the text so far
            assert responses[-1].message.content.startswith(r.message.content or "")
        assert responses[-1].raw["usage"]["completion_tokens"] > 0

    async def test_achat_and_astream_chat(self, llm):
        response = await llm.achat(USER, max_tokens=self.max_tokens)
        assert response.raw["usage"]["completion_tokens"] > 0
        gen = await llm.astream_chat(USER, max_tokens=self.max_tokens)
        responses = [r async for r in gen]
        assert "".join(r.delta or "" for r in responses) == responses[-1].message.content

    async def test_async_leaves_event_loop_free(self, llm):
        _, ticks = await loop_ticks_while(llm.achat(USER, max_tokens=self.max_tokens))
        assert ticks >= 3

    # -------------------------------------------------------------- complete

    def test_complete_and_stream_complete(self, llm):
        response = llm.complete("The sky is", max_tokens=self.max_tokens)
        assert isinstance(response.text, str)
        assert response.raw["usage"]["completion_tokens"] > 0
        parts = list(llm.stream_complete("The sky is", max_tokens=self.max_tokens))
        assert "".join(p.delta or "" for p in parts) == parts[-1].text

    def test_formatted_prompt_is_sent_as_is(self, llm):
        raw = llm.complete("Once upon a time", formatted=True, max_tokens=self.max_tokens)
        templated = llm.complete("Once upon a time", max_tokens=self.max_tokens)
        # No chat template: the prompt is only the text given.
        assert raw.raw["usage"]["prompt_tokens"] < templated.raw["usage"]["prompt_tokens"]

    async def test_acomplete_and_astream_complete(self, llm):
        response = await llm.acomplete("The sky is", max_tokens=self.max_tokens)
        assert response.raw["usage"]["completion_tokens"] > 0
        gen = await llm.astream_complete("The sky is", max_tokens=self.max_tokens)
        parts = [p async for p in gen]
        assert "".join(p.delta or "" for p in parts) == parts[-1].text

    # ---------------------------------------------------- observability

    def test_callbacks_and_instrumentation_fire(self, llm):
        recorder = _CallbackRecorder()
        old = llm.callback_manager
        llm.callback_manager = CallbackManager([recorder])
        handler = _Recorder()
        handler.events = []
        dispatcher = get_dispatcher()
        dispatcher.add_event_handler(handler)
        try:
            llm.chat(USER, max_tokens=self.max_tokens)
            llm.complete("Hi", max_tokens=self.max_tokens)
        finally:
            dispatcher.event_handlers.remove(handler)
            llm.callback_manager = old
        assert CBEventType.LLM in recorder.starts and CBEventType.LLM in recorder.ends
        kinds = {type(e) for e in handler.events}
        assert {LLMChatStartEvent, LLMChatEndEvent, LLMCompletionEndEvent} <= kinds

    def test_token_counting_handler_counts_exact_tokens(self, llm):
        # A whitespace tokenizer, unlike the model's: counts equal to the reply's usage
        # show the handler read the usage, not its own guess (and no tokenizer download).
        counter = TokenCountingHandler(tokenizer=str.split)
        old = llm.callback_manager
        llm.callback_manager = CallbackManager([counter])
        try:
            response = llm.chat(USER, max_tokens=self.max_tokens)
        finally:
            llm.callback_manager = old
        usage = response.raw["usage"]
        assert counter.prompt_llm_token_count == usage["prompt_tokens"]
        assert counter.completion_llm_token_count == usage["completion_tokens"]

    # ------------------------------------------------------------------ tools

    def test_chat_with_tools_required(self, llm, tool):
        if not self.is_function_calling:
            pytest.skip("not a function-calling LLM")
        response = llm.chat_with_tools(
            [tool], user_msg="Use the tool.", tool_required=True, max_tokens=64
        )
        calls = llm.get_tool_calls_from_response(response)
        assert calls and calls[0].tool_name == tool.metadata.name
        assert calls[0].tool_id
        blocks = [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]
        assert blocks and all(b.tool_call_id for b in blocks)

    def test_stream_chat_with_tools_every_chunk_is_readable(self, llm, tool):
        if not self.is_function_calling:
            pytest.skip("not a function-calling LLM")
        responses = list(
            llm.stream_chat_with_tools(
                [tool], user_msg="Use the tool.", tool_required=True, max_tokens=64
            )
        )
        for r in responses:  # agents call this on every chunk
            llm.get_tool_calls_from_response(r, error_on_no_tool_call=False)
        assert llm.get_tool_calls_from_response(responses[-1])

    def test_no_tool_call_raises_when_asked(self, llm, tool):
        if not self.is_function_calling:
            pytest.skip("not a function-calling LLM")
        response = llm.chat(USER, max_tokens=4)
        assert llm.get_tool_calls_from_response(response, error_on_no_tool_call=False) == []
        with pytest.raises(ValueError):
            llm.get_tool_calls_from_response(response, error_on_no_tool_call=True)

    def test_predict_and_call_runs_the_tool(self, llm, tool):
        if not self.is_function_calling:
            pytest.skip("not a function-calling LLM")
        result = llm.predict_and_call(
            [tool], user_msg="Use the tool.", tool_required=True, max_tokens=64
        )
        assert result.sources and result.sources[0].tool_name == tool.metadata.name
        assert not result.sources[0].is_error

    def test_tool_result_goes_back(self, llm, tool):
        if not self.is_function_calling:
            pytest.skip("not a function-calling LLM")
        first = llm.chat_with_tools(
            [tool], user_msg="Use the tool.", tool_required=True, max_tokens=64
        )
        call = llm.get_tool_calls_from_response(first)[0]
        history = [
            ChatMessage(role=MessageRole.USER, content="Use the tool."),
            first.message,
            ChatMessage(
                role=MessageRole.TOOL,
                content="42",
                additional_kwargs={"tool_call_id": call.tool_id, "name": call.tool_name},
            ),
        ]
        answer = llm.chat_with_tools([tool], chat_history=history, max_tokens=self.max_tokens)
        # The call and its result are part of the prompt now.
        assert answer.raw["usage"]["prompt_tokens"] > first.raw["usage"]["prompt_tokens"]

    # ----------------------------------------------------- structured output

    def test_structured_predict(self, llm):
        if not self.supports_structured_output:
            pytest.skip("no structured output")
        prompt = PromptTemplate("Pick a color and a count for {topic}.")
        pick = llm.structured_predict(Pick, prompt, llm_kwargs={"max_tokens": 64}, topic="a flag")
        assert isinstance(pick, Pick) and pick.color in {"red", "green", "blue"}

    async def test_astructured_predict(self, llm):
        if not self.supports_structured_output:
            pytest.skip("no structured output")
        prompt = PromptTemplate("Pick a color and a count for {topic}.")
        pick = await llm.astructured_predict(
            Pick, prompt, llm_kwargs={"max_tokens": 64}, topic="a kite"
        )
        assert isinstance(pick, Pick)

    def test_stream_structured_predict(self, llm):
        if not self.supports_structured_output:
            pytest.skip("no structured output")
        prompt = PromptTemplate("Pick a color and a count for {topic}.")
        outs = list(
            llm.stream_structured_predict(
                Pick, prompt, llm_kwargs={"max_tokens": 64}, topic="a ball"
            )
        )
        assert outs and isinstance(outs[-1], Pick)

    def test_as_structured_llm(self, llm):
        if not self.supports_structured_output:
            pytest.skip("no structured output")
        sllm = llm.as_structured_llm(Pick)
        response = sllm.chat(
            [ChatMessage(role=MessageRole.USER, content="Pick one.")], max_tokens=64
        )
        assert isinstance(response.raw, Pick)
