"""ChatMLX on real tiny models: messages, streaming, tools, reasoning, metadata, errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import tool

from mlx_integrations.engine import BaseEngine, GenerationOutput, SimpleEngine
from mlx_integrations.langchain import ChatMLX
from mlx_integrations.langchain.messages import to_neutral_messages
from tests.support.forcing import forcing


@tool
def get_weather(city: str) -> str:
    """Get the weather of a city."""
    return f"sunny in {city}"


@pytest.fixture(scope="module")
def llm(tiny_llama) -> ChatMLX:
    # prefix_key_step=1: all that is cached is read, on CUDA too (a later turn here is
    # shorter than CUDA's default key step).
    return ChatMLX(
        model=str(tiny_llama),
        temperature=0,
        max_tokens=24,
        engine_options={"prefix_key_step": 1},
    )


def forced(llm: ChatMLX, text: str) -> dict[str, Any]:
    processor, _ = forcing(llm.engine.tokenizer, text)
    return {"logits_processors": [processor]}


def test_invoke_and_metadata(llm):
    msg = llm.invoke(
        [SystemMessage("Be brief."), HumanMessage("Hello")], **forced(llm, "Hi there!")
    )
    assert isinstance(msg, AIMessage)
    assert msg.content == "Hi there!"
    usage = msg.usage_metadata
    assert usage["output_tokens"] == len(llm.engine.tokenizer.encode("Hi there!")) + 1  # + EOS
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert "cache_read" in usage["input_token_details"]
    meta = msg.response_metadata
    assert meta["model_name"] == llm.model and meta["model_provider"] == "mlx"
    assert meta["finish_reason"] == "stop"
    assert meta["time_to_first_token_s"] >= 0 and meta["tokens_per_second"] >= 0


def test_stream_has_usage_on_exactly_one_chunk(llm):
    chunks = list(llm.stream("Hello", **forced(llm, "Streaming works fine.")))
    text = "".join(c.content for c in chunks)
    assert text == "Streaming works fine."
    with_usage = [c for c in chunks if c.usage_metadata]
    assert len(with_usage) == 1 and chunks[-1].chunk_position == "last"
    assert len(chunks) > 2  # really streamed


async def test_async_invoke_stream_and_batch(llm):
    msg = await llm.ainvoke("Hi", **forced(llm, "async ok"))
    assert msg.content == "async ok"
    parts = [c.content async for c in llm.astream("Hi", **forced(llm, "async stream"))]
    assert "".join(parts) == "async stream"
    outs = await llm.abatch(["a", "b", "c"], max_tokens=3)
    assert all(o.usage_metadata["output_tokens"] <= 3 for o in outs)


def test_second_turn_reads_prompt_from_cache(llm):
    first = llm.invoke("Tell me about Paris", **forced(llm, "Paris is lovely."))
    second = llm.invoke(
        [HumanMessage("Tell me about Paris"), first, HumanMessage("And Rome?")], max_tokens=4
    )
    assert second.usage_metadata["input_token_details"]["cache_read"] > 10


def test_tool_call_parsed_with_unique_ids(llm):
    bound = llm.bind_tools([get_weather])
    text = (
        'Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
        '</tool_call><tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
    )
    msg = bound.invoke("Weather in Paris and Rome?", max_tokens=80, **forced(llm, text))
    assert [c["args"] for c in msg.tool_calls] == [{"city": "Paris"}, {"city": "Rome"}]
    assert all(c["name"] == "get_weather" for c in msg.tool_calls)
    ids = [c["id"] for c in msg.tool_calls]
    assert len(set(ids)) == 2 and all(ids)
    assert msg.content == "Let me check. "
    assert "<tool_call>" not in msg.content
    assert msg.response_metadata["finish_reason"] == "tool_calls"


def test_tool_call_streams_as_chunks(llm):
    bound = llm.bind_tools([get_weather])
    text = 'Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    chunks = list(bound.stream("Weather in Oslo?", max_tokens=60, **forced(llm, text)))
    assert all("<tool" not in c.content for c in chunks)
    merged: AIMessageChunk = sum(chunks[1:], chunks[0])
    assert merged.tool_calls == [
        {
            "name": "get_weather",
            "args": {"city": "Oslo"},
            "id": merged.tool_calls[0]["id"],
            "type": "tool_call",
        }
    ]
    assert merged.content == "Sure. "


def test_malformed_call_is_an_invalid_tool_call(llm):
    bound = llm.bind_tools([get_weather])
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>'
    msg = bound.invoke("Weather?", max_tokens=60, **forced(llm, text))
    assert msg.tool_calls == []
    assert len(msg.invalid_tool_calls) == 1
    bad = msg.invalid_tool_calls[0]
    assert bad["name"] == "get_weather" and bad["error"] and '"city": ' in bad["args"]


def test_reasoning_kept_apart(llm):
    text = "<think>The user greets me.</think>Hello!"
    msg = llm.invoke("Hi", max_tokens=40, **forced(llm, text))
    assert msg.content == "Hello!"
    assert msg.additional_kwargs["reasoning_content"] == "The user greets me."
    v1 = llm.model_copy(update={"output_version": "v1"})
    blocks = v1.invoke("Hi", max_tokens=40, **forced(llm, text)).content
    kinds = [b["type"] for b in blocks]
    assert "reasoning" in kinds and "text" in kinds
    assert next(b for b in blocks if b["type"] == "reasoning")["reasoning"] == "The user greets me."


def test_tool_history_reaches_template_natively(llm):
    history = [
        HumanMessage("Weather in Paris?"),
        AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "c1"}]),
        ToolMessage("sunny in Paris", tool_call_id="c1"),
    ]
    neutral = to_neutral_messages(history)
    prompt = llm.engine.render_prompt(neutral, tools=None)
    assert (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in prompt
    )
    assert "<tool_response>\nsunny in Paris\n</tool_response>" in prompt
    answer = llm.invoke(history, **forced(llm, "It is sunny."))
    assert answer.content == "It is sunny."


def test_stop_sequences(llm):
    msg = llm.invoke("Hi", stop=["world"], max_tokens=40, **forced(llm, "Hello world again"))
    assert msg.content == "Hello "
    assert msg.response_metadata["finish_reason"] == "stop"


def test_models_share_one_engine(tiny_llama):
    a = ChatMLX(model=str(tiny_llama))
    b = ChatMLX(model=str(tiny_llama), temperature=0.1)
    assert a.engine is b.engine
    c = ChatMLX(model=str(tiny_llama), engine_options={"cache_memory_mb": 16})
    assert c.engine is not a.engine


def test_stats_and_clear_pass_through(llm):
    llm.invoke("Hi", max_tokens=2)
    stats = llm.get_stats()
    assert stats["num_requests_processed"] >= 1
    cleared = llm.clear_runtime_caches()
    assert cleared["dropped_entries"] >= 1
    assert llm.get_stats()["prefix_cache"]["entry_count"] == 0


def test_ls_params_honour_per_call_model(llm):
    params = llm._get_ls_params(model="other-model")
    assert params["ls_model_name"] == "other-model" and params["ls_provider"] == "mlx"


async def test_cancelling_astream_aborts_in_engine(llm):
    before = llm.engine.get_stats()["num_requests_aborted"]
    seen = asyncio.Event()

    async def consume():
        async for _ in llm.astream("Go on forever", max_tokens=5000, **forced(llm, "x" * 3000)):
            seen.set()

    task = asyncio.create_task(consume())
    await seen.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    msg = await asyncio.wait_for(llm.ainvoke("Hi", max_tokens=2), 30)
    assert msg.usage_metadata["output_tokens"] <= 2
    assert llm.engine.get_stats()["num_requests_aborted"] == before + 1


BAD = [
    (
        dict(input=[HumanMessage(content=[{"type": "image_url", "image_url": {"url": "x"}}])]),
        ValueError,
        "text-only model",
    ),
    (dict(input=[HumanMessage(content=[{"type": "mystery"}])]), ValueError, "unsupported type"),
    (dict(input="hi", tool_choice="get_weather"), ValueError, "needs tools"),
]


@pytest.mark.parametrize(("call", "exc", "match"), BAD)
def test_bad_input_is_rejected_before_generation(llm, call, exc, match):
    before = llm.engine.get_stats()["num_requests_processed"]
    with pytest.raises(exc, match=match):
        llm.invoke(**call)
    assert llm.engine.get_stats()["num_requests_processed"] == before


def test_bad_tools_rejected_at_bind(llm):
    with pytest.raises(ValueError, match="not bound"):
        llm.bind_tools([get_weather], tool_choice="no_such_tool")
    with pytest.raises(ValueError, match="type 'object'"):
        llm.bind_tools(
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]
        )


def test_bad_construction():
    with pytest.raises(ValueError, match="needs model"):
        ChatMLX()
    with pytest.raises(FileNotFoundError):
        ChatMLX(model="./no/such/folder")


class ScriptedEngine(BaseEngine):
    """An engine of another project honouring only the contract: replies from a script."""

    def __init__(self, reply: str):
        self.reply = reply

    model_name = "scripted"
    is_mllm = False
    tokenizer = None

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def generate(self, prompt, max_tokens=256, temperature=0.7, top_p=0.9, stop=None, **kw):
        return GenerationOutput(text=self.reply)

    async def stream_generate(
        self, prompt, max_tokens=256, temperature=0.7, top_p=0.9, stop=None, **kw
    ) -> AsyncIterator[GenerationOutput]:
        yield GenerationOutput(text=self.reply, new_text=self.reply)

    async def chat(
        self,
        messages,
        max_tokens=256,
        temperature=0.7,
        top_p=0.9,
        tools=None,
        images=None,
        videos=None,
        **kw,
    ):
        return GenerationOutput(text=self.reply)

    async def stream_chat(
        self,
        messages,
        max_tokens=256,
        temperature=0.7,
        top_p=0.9,
        tools=None,
        images=None,
        videos=None,
        **kw,
    ):
        text = ""
        for i, piece in enumerate(self.reply.split(" ")):
            piece = piece if i == 0 else " " + piece
            text += piece
            yield GenerationOutput(
                text=text,
                new_text=piece,
                finished=False,
                finish_reason=None,
                prompt_tokens=7,
                completion_tokens=i + 1,
            )
        yield GenerationOutput(text=text, prompt_tokens=7, completion_tokens=i + 1)


def test_any_contract_engine_plugs_in():
    llm = ChatMLX(engine=ScriptedEngine("Bonjour tout le monde"))
    assert llm.model == "scripted"
    assert llm.invoke("hi").content == "Bonjour tout le monde"
    chunks = list(llm.stream("hi"))
    assert "".join(c.content for c in chunks) == "Bonjour tout le monde"
    assert chunks[-1].usage_metadata["input_tokens"] == 7


def test_engine_instance_can_be_passed(tiny_qwen2):
    engine = SimpleEngine(tiny_qwen2)
    llm = ChatMLX(engine=engine, max_tokens=3)
    assert llm.invoke("hi").usage_metadata["output_tokens"] <= 3
    asyncio.run(engine.stop())


async def test_abatch_runs_concurrently_on_a_batched_engine(tiny_llama):
    llm = ChatMLX(model=str(tiny_llama), engine_type="batched", temperature=0, max_tokens=24)
    outs = await llm.abatch(["one", "two", "three", "four"])
    assert all(o.usage_metadata["output_tokens"] >= 1 for o in outs)
    stats = llm.get_stats()
    assert stats["engine_type"] == "batched"
    assert stats["peak_batch_size"] >= 2  # the requests shared decode steps


def test_per_call_model_uses_that_models_engine(llm, tiny_qwen2):
    msg = llm.invoke("Hi", model=str(tiny_qwen2), max_tokens=3)
    assert msg.response_metadata["model_name"] == str(tiny_qwen2)
    assert llm.invoke("Hi", max_tokens=2).response_metadata["model_name"] == llm.model


def test_malformed_call_stays_invalid_when_streamed():
    # A contract-only engine: no tokenizer, so no grammar repairs the call.
    reply = (
        'Checking. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}</tool_call>'
    )
    llm = ChatMLX(engine=ScriptedEngine(reply)).bind_tools([get_weather])
    msg = llm.invoke("Weather?")
    assert msg.tool_calls == [] and len(msg.invalid_tool_calls) == 1
    chunks = list(llm.stream("Weather?"))
    merged = sum(chunks[1:], chunks[0])
    assert merged.tool_calls == []  # not mistaken for a valid call with wrong arguments
    assert len(merged.invalid_tool_calls) == 1
    assert "Paris" in merged.invalid_tool_calls[0]["args"]
    with pytest.raises(ValueError, match="exposes none"):
        ChatMLX(engine=ScriptedEngine(reply)).bind_tools([get_weather], tool_choice="any").invoke(
            "Weather?"
        )


def test_interrupting_a_sync_stream_aborts_the_request(llm):
    before = llm.engine.get_stats()["num_requests_aborted"]
    stream = llm.stream("Go on", max_tokens=5000, **forced(llm, "y" * 3000))
    next(stream)
    stream.close()  # as when the caller breaks out of the loop
    msg = llm.invoke("Hi", max_tokens=2)
    assert msg.usage_metadata["output_tokens"] <= 2
    assert llm.engine.get_stats()["num_requests_aborted"] == before + 1


def test_copies_count_as_users_of_the_pooled_engine(tiny_qwen2):
    from mlx_integrations.engine import pool

    def refs(engine):
        return next(n for e, n in pool.shared_engines() if e is engine)

    llm = ChatMLX(model=str(tiny_qwen2), engine_options={"cache_memory_mb": 8})
    base = refs(llm.engine)
    copy = llm.model_copy(update={"temperature": 0.0})
    deep = llm.model_copy(deep=True)
    assert copy.engine is llm.engine and deep.engine is llm.engine
    assert refs(llm.engine) == base + 2
    del copy, deep
    import gc

    gc.collect()
    assert refs(llm.engine) == base


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_structured_output_with_a_non_object_schema(llm, method):
    """A top-level boolean, integer or enum schema keeps its type in every method."""
    flag = {"title": "Flag", "description": "Is it sunny?", "type": "boolean"}
    count = {"title": "Count", "type": "integer", "minimum": 0, "maximum": 9}
    color = {"title": "Color", "enum": ["red", "blue"]}
    for schema, kind in ((flag, bool), (count, int), (color, str)):
        runnable = llm.with_structured_output(schema, method=method)
        for seed in range(2):
            value = runnable.invoke("Answer.", seed=seed, temperature=1.0, max_tokens=40)
            assert isinstance(value, kind), (schema, value)
            if schema is count:
                assert 0 <= value <= 9 and not isinstance(value, bool)
            if schema is color:
                assert value in ("red", "blue")


class PlainOutput:
    """Another project's output type: the contract's fields, not a dataclass."""

    def __init__(self, text: str):
        self.text, self.new_text, self.tokens = text, "", [1, 2]
        self.prompt_tokens, self.completion_tokens = 3, 2
        self.finish_reason, self.finished = "stop", True
        self.mtp_drafts = self.mtp_accepted = 0


def test_a_whole_reply_of_any_output_type_is_parsed_at_once():
    engine = ScriptedEngine("Salut")

    async def chat(messages, **kwargs):
        return PlainOutput("Salut à tous")

    engine.chat = chat  # type: ignore[method-assign]
    message = ChatMLX(engine=engine).invoke("hi")
    assert message.content == "Salut à tous"
    assert message.usage_metadata["output_tokens"] == 2
    # The engine did not time its first token and the reply came whole: unknown.
    assert message.response_metadata["time_to_first_token_s"] == 0.0
