"""One typed request from the edge to the engine: checked once, errors carrying the path
of the field at fault, our engines taking it whole and any other engine the contract's
plain keywords."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlx_integrations.chat import tools as tools_module
from mlx_integrations.chat.fields import RequestError, RequestTypeError
from mlx_integrations.chat.request import ChatRequest, RequestEngine
from mlx_integrations.engine import BatchedEngine, SimpleEngine
from mlx_integrations.engine.base import BaseEngine
from tests.support.forcing import forcing

USER = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def _tool(name: str, parameters: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


@pytest.fixture(scope="module")
def engine(tiny_llama: Path) -> Iterator[SimpleEngine]:
    eng = SimpleEngine(tiny_llama)
    yield eng
    asyncio.run(eng.stop())


# ------------------------------------------------------------- field paths


BAD_REQUESTS = [
    ({"temperature": -1}, RequestError, "temperature"),
    ({"top_p": 0}, RequestError, "top_p"),
    ({"top_k": "5"}, RequestTypeError, "top_k"),
    ({"max_tokens": 0}, RequestError, "max_tokens"),
    ({"stop": [""]}, RequestError, "stop"),
    ({"logit_bias": {"x": 1}}, RequestTypeError, "logit_bias"),
    ({"seed": 1.5}, RequestTypeError, "seed"),
    ({"thinking_budget": -3}, RequestError, "thinking_budget"),
    ({"reasoning_effort": "extreme"}, RequestError, "reasoning_effort"),
    ({"reasoning_effort": "none", "enable_thinking": True}, RequestError, "reasoning_effort"),
    ({"chat_template_kwargs": ["x"]}, RequestTypeError, "chat_template_kwargs"),
    ({"timeout": 0}, RequestError, "timeout"),
    ({"tool_format": "no-such-family"}, RequestError, "tool_format"),
    ({"response_format": "json"}, RequestTypeError, "response_format"),
    ({"response_format": {"type": "yaml"}}, RequestError, "response_format"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
        RequestError,
        "response_format.json_schema.schema",
    ),
    ({"tools": {"a": 1}}, RequestTypeError, "tools"),
    ({"tools": [WEATHER, "f"]}, RequestTypeError, "tools[1]"),
    ({"tools": [WEATHER, {"type": "retrieval"}]}, RequestError, "tools[1].type"),
    ({"tools": [_tool("", {})]}, RequestError, "tools[0].function.name"),
    (
        {"tools": [WEATHER, WEATHER, _tool("f", [])]},
        RequestTypeError,
        "tools[2].function.parameters",
    ),
    (
        {"tools": [_tool("f", {"type": "object", "properties": {"a": {"type": "nope"}}})]},
        RequestError,
        "tools[0].function.parameters",
    ),
    (
        {"tools": [_tool("f", {"type": "object", "properties": {}, "required": ["a"]})]},
        RequestError,
        "tools[0].function.parameters",
    ),
    ({"tools": [WEATHER], "tool_choice": "other"}, RequestError, "tool_choice"),
    ({"tool_choice": "required"}, RequestError, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, RequestTypeError, "parallel_tool_calls"),
    ({"messages": []}, RequestError, "messages"),
    ({"messages": [USER[0], "hi"]}, RequestTypeError, "messages[1]"),
    ({"messages": [{"role": "robot", "content": "x"}]}, RequestError, "messages[0].role"),
    (
        {"messages": [USER[0], {"role": "user", "content": 5}]},
        RequestTypeError,
        "messages[1].content",
    ),
    (
        {"messages": [{"role": "user", "content": ["ok", {"type": "hologram"}]}]},
        RequestError,
        "messages[0].content[1]",
    ),
    (
        {"messages": [{"role": "user", "content": "ok \udcff"}]},
        RequestError,
        "messages[0].content",
    ),
    (
        {
            "messages": [
                USER[0],
                {"role": "assistant", "content": "", "tool_calls": [{"id": "a"}, {"function": 3}]},
            ]
        },
        RequestError,
        "messages[1].tool_calls[0]",
    ),
]


@pytest.mark.parametrize(("fields", "kind", "path"), BAD_REQUESTS)
def test_a_bad_value_is_one_typed_error_carrying_its_path(fields, kind, path):
    fields = dict(fields)
    messages = fields.pop("messages", USER)
    with pytest.raises(kind) as caught:
        ChatRequest.build(messages, **fields)
    assert caught.value.path == path
    assert str(caught.value) == caught.value.message  # the message is the plain text


def test_a_type_error_is_both_a_request_error_and_a_type_error():
    with pytest.raises(TypeError):
        ChatRequest.build(USER, top_k="5")
    with pytest.raises(ValueError):
        ChatRequest.build(USER, top_k="5")


def test_the_path_does_not_come_from_the_message(monkeypatch):
    # The wording of a check is free to change: the path stays where the check is.
    from mlx_integrations.chat import fields

    def reworded(name: str, value: Any) -> float:
        raise RequestError("quite another wording, naming nothing", name)

    monkeypatch.setattr(fields, "_number", reworded)
    with pytest.raises(RequestError) as caught:
        ChatRequest.build(USER, temperature="hot")
    assert caught.value.path == "temperature"
    assert "wording" in str(caught.value)


def test_a_request_holds_checked_values():
    request = ChatRequest.build(
        USER,
        tools=[WEATHER],
        tool_choice="get_weather",
        temperature=0,
        top_k=5,
        stop="END",
        logit_bias={"42": 1},
        response_format={"type": "json_object"},
    )
    assert request.tools.forced and request.tools.tool_name == "get_weather"
    assert request.tools.parallel is False  # a forced call is one call unless asked
    assert request.sampling.temperature == 0.0 and request.sampling.top_k == 5
    assert request.sampling.logit_bias == {42: 1.0}
    assert request.stop == ("END",)
    assert request.format_constraint is not None


def test_a_contract_keyword_no_engine_takes_is_refused_by_name():
    with pytest.raises(
        RequestTypeError, match=r"unexpected keyword argument\(s\) \['temprature'\]"
    ):
        ChatRequest.from_kwargs(USER, temprature=0.2)


# ------------------------------------------------------- checked once


@pytest.fixture
def tool_checks(monkeypatch) -> list[str]:
    """The names of the tools read (each ``ToolSpec.from_openai`` of a dict)."""
    seen: list[str] = []
    original = tools_module.ToolSpec.from_openai.__func__  # type: ignore[attr-defined]

    def counted(cls: Any, tool: Any, index: int = 0) -> Any:
        if isinstance(tool, dict):
            seen.append(tool.get("function", tool).get("name"))
        return original(cls, tool, index)

    monkeypatch.setattr(tools_module.ToolSpec, "from_openai", classmethod(counted))
    return seen


def test_a_bound_tool_list_is_checked_once_from_bind_to_the_engine(tiny_llama, tool_checks):
    from mlx_integrations.langchain import ChatMLX

    llm = ChatMLX(model=str(tiny_llama), temperature=0, max_tokens=24, engine_type="simple")
    bound = llm.bind_tools([WEATHER], tool_choice="get_weather")
    assert tool_checks == ["get_weather"]  # at bind time: a bad tool fails there
    message = bound.invoke("Weather in Paris?")
    assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather"
    assert tool_checks == ["get_weather"]  # the call took the checked tools as they are


def test_mlxllm_tools_are_checked_once(tiny_llama, tool_checks):
    from llama_index.core.tools import FunctionTool

    from mlx_integrations.llama_index import MLXLLM

    def get_weather(city: str) -> str:
        """Weather of a city."""
        return city

    llm = MLXLLM(model=str(tiny_llama), temperature=0, max_tokens=24, engine_type="simple")
    tool = FunctionTool.from_defaults(fn=get_weather)
    response = llm.chat_with_tools([tool], "Weather in Paris?", tool_required=True)
    assert llm.get_tool_calls_from_response(response)[0].tool_name == "get_weather"
    assert tool_checks == ["get_weather"]


# ------------------------------------------------ our engines and the others


async def test_our_engines_take_the_request_whole(engine):
    assert isinstance(engine, RequestEngine)
    processor, _ = forcing(engine.tokenizer, "Paris")
    request = ChatRequest.build(USER, temperature=0, max_tokens=8, logits_processors=[processor])
    chunks = [out async for out in engine.stream_request(request)]
    assert "".join(c.new_text for c in chunks) == "Paris"
    assert chunks[-1].finished


async def test_the_contract_keywords_build_the_same_request(engine):
    # The shim: an engine written against the contract's stream_chat(**kwargs) gets
    # the same checks, and the same reply, as a request built at the edge.
    processor, _ = forcing(engine.tokenizer, "Lyon")
    out = await engine.chat(USER, max_tokens=8, temperature=0, logits_processors=[processor])
    assert out.text == "Lyon"
    with pytest.raises(RequestError) as caught:
        await engine.chat(USER, max_tokens=8, top_p=5)
    assert caught.value.path == "top_p"


async def test_the_engine_names_what_only_the_model_can_tell(engine, tiny_llama):
    vocab = json.loads((tiny_llama / "config.json").read_text())["vocab_size"]
    request = ChatRequest.build(USER, logit_bias={vocab + 5: 1.0})  # no vocabulary yet
    with pytest.raises(RequestError) as caught:
        await anext(aiter(engine.stream_request(request)))
    assert caught.value.path == "logit_bias"
    long = [{"role": "user", "content": "word " * 5000}]
    with pytest.raises(RequestError) as caught:
        await engine.chat(long, max_tokens=2)
    assert caught.value.path == "messages"
    with pytest.raises(RequestError) as caught:
        await engine.chat(USER, images=["a.png"])
    assert caught.value.path == "images"
    assert (await engine.chat(USER, max_tokens=2, temperature=0)).finished  # serves on


class Contractual(BaseEngine):
    """Another project's engine: the contract's methods only, passed to a SimpleEngine;
    it records the keywords it is given."""

    def __init__(self, inner: SimpleEngine) -> None:
        self.inner = inner
        self.seen: list[dict[str, Any]] = []

    model_name = "contractual"
    is_mllm = False

    @property
    def tokenizer(self) -> Any:
        return self.inner.tokenizer

    async def start(self) -> None:
        await self.inner.start()

    async def stop(self) -> None:
        pass

    async def generate(self, prompt: str, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def stream_generate(self, prompt: str, **kwargs: Any) -> Any:
        raise NotImplementedError
        yield

    async def chat(self, messages: Any, **kwargs: Any) -> Any:
        self.seen.append(kwargs)
        return await self.inner.chat(messages, **kwargs)

    async def stream_chat(self, messages: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.seen.append(kwargs)
        async for out in self.inner.stream_chat(messages, **kwargs):
            yield out


def test_an_engine_from_outside_gets_plain_keywords_and_the_constraint_as_a_processor(engine):
    from mlx_integrations.langchain import ChatMLX

    other = Contractual(engine)
    assert not isinstance(other, RequestEngine)
    llm = ChatMLX(engine=other, temperature=0, max_tokens=48)
    message = llm.bind_tools([WEATHER], tool_choice="get_weather").invoke("Weather in Paris?")
    assert message.tool_calls[0]["name"] == "get_weather"
    assert isinstance(message.tool_calls[0]["args"]["city"], str)
    kwargs = other.seen[-1]
    # The contract's keywords only: the choice came as a logits processor, the tools as
    # the plain dicts a chat template takes.
    assert "tool_choice" not in kwargs and "response_format" not in kwargs
    assert kwargs["tools"] == [WEATHER] and type(kwargs["tools"][0]) is dict
    assert len(kwargs["logits_processors"]) == 1
    assert kwargs["temperature"] == 0.0 and kwargs["max_tokens"] == 48


# -------------------------------------------------------- the adapters


@pytest.mark.parametrize("adapter", ["ChatMLX", "MLXLLM"])
def test_the_adapters_raise_the_typed_error_with_the_path(tiny_llama, adapter):
    if adapter == "ChatMLX":
        from mlx_integrations.langchain import ChatMLX

        llm: Any = ChatMLX(model=str(tiny_llama), max_tokens=4)
        call = llm.invoke
        prompt: Any = "hi"
    else:
        from llama_index.core.llms import ChatMessage

        from mlx_integrations.llama_index import MLXLLM

        llm = MLXLLM(model=str(tiny_llama), max_tokens=4)
        call = llm.chat
        prompt = [ChatMessage(role="user", content="hi")]
    with pytest.raises(RequestError) as caught:
        call(prompt, top_p=3)
    assert caught.value.path == "top_p"
    with pytest.raises(RequestError) as caught:
        call(prompt, tools=[WEATHER, _tool("g", {"type": "array"})])
    assert caught.value.path == "tools[1].function.parameters"
    with pytest.raises(RequestTypeError) as caught:
        call(prompt, temprature=0.1)
    assert caught.value.path == "temprature" and "did you mean 'temperature'" in str(caught.value)


# ------------------------------------------------------ engine options


@pytest.mark.parametrize(
    ("engine_cls", "options", "kind", "path"),
    [
        (SimpleEngine, {"cache_memory_mb": -1}, RequestError, "cache_memory_mb"),
        (SimpleEngine, {"kv_group_size": 7}, RequestError, "kv_group_size"),
        (SimpleEngine, {"num_draft_tokens": "3"}, RequestTypeError, "num_draft_tokens"),
        (SimpleEngine, {"turbo": True}, RequestTypeError, "turbo"),
        (BatchedEngine, {"max_num_seqs": 0}, RequestError, "max_num_seqs"),
        (
            BatchedEngine,
            {"kv_bits": 4, "quantized_kv_start": 8},
            RequestError,
            "quantized_kv_start",
        ),
    ],
)
def test_engine_options_are_checked_once_with_the_field_path(
    tiny_llama, engine_cls, options, kind, path
):
    with pytest.raises(kind) as caught:
        engine_cls(tiny_llama, **options)
    assert caught.value.path == path


def test_an_option_of_another_engine_type_names_the_type_that_takes_it(tiny_llama):
    from mlx_integrations.engine import pool

    with pytest.raises(
        RequestError, match=r"max_num_seqs=4 is an option of engine_type='batched'"
    ) as caught:
        pool.engine_options("simple", {"max_num_seqs": 4})
    assert caught.value.path == "max_num_seqs"
    assert pool.engine_options("batched", {"max_num_seqs": 4}).max_num_seqs == 4


# ------------------------------------------------------------ announce


@pytest.mark.parametrize("outside", [False, True], ids=["ours", "outside"])
async def test_a_turn_can_announce_its_prompt_before_the_first_token(engine, outside):
    from mlx_integrations.chat.completion import Finished, Started, stream_chat_events

    served: BaseEngine = Contractual(engine) if outside else engine
    processor, _ = forcing(engine.tokenizer, "Paris is nice")
    request = ChatRequest.build(USER, temperature=0, max_tokens=8, logits_processors=[processor])
    events = [e async for e in stream_chat_events(served, request, announce=True)]
    assert isinstance(events[0], Started)
    assert isinstance(events[-1], Finished)
    assert events[0].prompt_tokens == events[-1].prompt_tokens > 0
    assert not any(isinstance(e, Started) for e in events[1:])
    assert events[-1].text == "Paris is nice"
    # Not asked for: no Started.
    events = [e async for e in stream_chat_events(served, request)]
    assert not any(isinstance(e, Started) for e in events)


# ------------------------------------------- keywords the grammar cannot express

# Claude Code's TaskCreate tool, as it sends it: ``propertyNames`` has no grammar.
TASK_CREATE = {
    "type": "function",
    "function": {
        "name": "TaskCreate",
        "description": "Create a task.",
        "parameters": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "subject": {"type": "string"},
                "description": {"type": "string"},
                "metadata": {
                    "type": "object",
                    "propertyNames": {"type": "string"},
                    "additionalProperties": {},
                },
            },
            "required": ["subject", "description"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.parametrize("choice", ["auto", "required", "TaskCreate"])
async def test_a_schema_keyword_the_grammar_lacks_never_refuses_a_request(engine, choice):
    from mlx_integrations.chat.completion import Finished, stream_chat_events

    request = ChatRequest.build(
        USER, tools=[WEATHER, TASK_CREATE], tool_choice=choice, temperature=0, max_tokens=64
    )
    events = [e async for e in stream_chat_events(engine, request)]
    assert isinstance(events[-1], Finished)
    if choice != "auto":  # a forced call still comes, held to what the grammar can hold
        calls = [e for e in events if type(e).__name__ in ("ParsedToolCall", "InvalidToolCall")]
        assert calls


def test_a_call_is_checked_against_the_whole_schema_where_the_grammar_left_a_keyword_out():
    from mlx_integrations.chat.completion import _checked_call
    from mlx_integrations.chat.tool_formats import InvalidToolCall, ParsedToolCall

    schema = {
        "type": "object",
        "properties": {"tags": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}},
        "required": ["tags"],
    }
    tools = ChatRequest.build(USER, tools=[_tool("tag", schema)]).tools
    good = ParsedToolCall(name="tag", arguments={"tags": {"red": 1}}, id="call_1")
    assert _checked_call(good, tools) is good
    bad = ParsedToolCall(name="tag", arguments={"tags": {"RED!": 1}}, id="call_2")
    checked = _checked_call(bad, tools)
    assert isinstance(checked, InvalidToolCall)
    assert checked.id == "call_2" and checked.name == "tag"
    assert "do not match its schema at tags" in checked.error
    # A schema the grammar enforces whole is not checked again.
    weather = ChatRequest.build(USER, tools=[WEATHER]).tools
    call = ParsedToolCall(name="get_weather", arguments={"city": 5}, id="call_3")
    assert _checked_call(call, weather) is call


def test_a_call_of_a_tool_the_request_does_not_have_is_an_invalid_call():
    from mlx_integrations.chat.completion import _checked_call
    from mlx_integrations.chat.tool_formats import InvalidToolCall, ParsedToolCall

    tools = ChatRequest.build(USER, tools=[WEATHER]).tools
    call = ParsedToolCall(name="sunshine", arguments={"city": "Paris"}, id="call_9")
    checked = _checked_call(call, tools)
    assert isinstance(checked, InvalidToolCall)
    assert checked.id == "call_9" and checked.name == "sunshine"
    assert "not among the request's tools (get_weather)" in checked.error


async def test_a_consumer_gone_right_after_the_announcement_aborts_its_request(engine):
    before = engine.get_stats()["num_requests_aborted"]
    request = ChatRequest.build(USER, max_tokens=500, logit_bias={7: 100.0})
    stream = engine.stream_request(request, announce=True)
    first = await anext(stream)
    assert not first.finished and first.prompt_tokens > 0
    await stream.aclose()
    out = await asyncio.wait_for(engine.chat(USER, max_tokens=2), 30)
    assert out.finished
    assert engine.get_stats()["num_requests_aborted"] == before + 1
