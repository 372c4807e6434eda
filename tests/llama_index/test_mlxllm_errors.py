"""Bad input to MLXLLM is rejected before generation, and the engine keeps serving."""

from __future__ import annotations

import pytest
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, TextBlock

from mlx_integrations.llama_index import MLXLLM

USER = [ChatMessage(role="user", content="Hi")]


@pytest.fixture(scope="module")
def llm(tiny_llama) -> MLXLLM:
    return MLXLLM(model=str(tiny_llama), temperature=0, max_tokens=4)


def served(llm: MLXLLM) -> int:
    return llm.get_stats()["num_requests_processed"]


def test_unknown_role(llm):
    odd = ChatMessage.model_construct(
        role="wizard", blocks=[TextBlock(text="hi")], additional_kwargs={}
    )
    before = served(llm)
    with pytest.raises(ValueError, match="role 'wizard'"):
        llm.chat([odd])
    assert served(llm) == before
    assert llm.chat(USER).raw["usage"]["completion_tokens"] >= 1


def test_image_to_a_text_model(llm):
    image = ChatMessage(
        role="user",
        blocks=[TextBlock(text="What is this?"), ImageBlock(url="https://example.com/cat.png")],
    )
    with pytest.raises(ValueError, match="text-only model"):
        llm.chat([image])


@pytest.mark.parametrize(
    ("tools", "match"),
    [
        ([{"type": "function", "function": {"name": "f", "parameters": "nope"}}], "JSON schema"),
        ([{"type": "function", "function": {"parameters": {"type": "object"}}}], "no name"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
            "type 'object'",
        ),
    ],
)
def test_bad_tools(llm, tools, match):
    # A value of the wrong type is a TypeError, a wrong value a ValueError.
    with pytest.raises((TypeError, ValueError), match=match):
        llm.chat(USER, tools=tools)


def test_tool_choice_naming_an_unknown_tool(llm):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(ValueError, match="not bound"):
        llm.chat(USER, tools=tools, tool_choice="g")


def test_unexpected_argument(llm):
    with pytest.raises(TypeError, match="unexpected arguments"):
        llm.chat(USER, temprature=0.3)


def test_tool_without_fn_schema_warns_and_takes_the_default_input(llm):
    from llama_index.core.tools import FunctionTool, ToolMetadata

    tool = FunctionTool(
        fn=lambda input: input,
        metadata=ToolMetadata(description="Echo.", name="echo", fn_schema=None),
    )
    with pytest.warns(UserWarning, match="'echo' has fn_schema=None"):
        prepared = llm._prepare_chat_with_tools([tool], user_msg="hi")
    (spec,) = prepared["tools"]
    assert list(spec["function"]["parameters"]["properties"]) == ["input"]


def test_a_stop_string_is_one_sequence_not_its_characters(llm):
    from tests.support.forcing import forcing

    def forced() -> dict:
        processor, _ = forcing(llm.engine.tokenizer, "Paris is nice. END here")
        return {"logits_processors": [processor], "max_tokens": 24}

    # "here" split into characters would stop at the first "e" (after "Paris is nic").
    want = "Paris is nice. END "
    assert llm.chat(USER, stop="here", **forced()).message.content == want
    assert llm.complete("x", stop="here", **forced()).text == want
    assert llm.complete("x", formatted=True, stop="here", **forced()).text == want
    streamed = "".join(r.delta or "" for r in llm.stream_chat(USER, stop="here", **forced()))
    assert streamed == want


def test_no_tool_call_names_the_fix(llm):
    from llama_index.core.tools import FunctionTool

    def get_weather(city: str) -> str:
        """Get the weather of a city."""
        return f"sunny in {city}"

    tool = FunctionTool.from_defaults(get_weather)
    with pytest.raises(ValueError, match=r"answered in text instead: .*tool_required=True"):
        llm.predict_and_call([tool], user_msg="Weather in Paris?", tool_choice="none")
    forced = llm.predict_and_call(
        [tool], user_msg="Weather in Paris?", tool_required=True, max_tokens=40
    )
    assert forced.sources[0].tool_name == "get_weather"


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"context_window": -5}, "context_window must be a positive number of tokens, got -5"),
        ({"context_window": 0}, "context_window must be a positive number of tokens, got 0"),
        ({"response_format": {"type": "bogus"}}, "response_format type 'bogus' is unknown"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "x"}}}},
            "not a valid JSON schema",
        ),
        ({"response_format": {"type": "grammar", "grammar": "start: ((("}}, "grammar is not valid"),
    ],
)
def test_bad_fields_fail_at_construction(tiny_llama, fields, match):
    # Not at every later call (a negative window also broke LlamaIndex's prompt packing).
    with pytest.raises(ValueError, match=match):
        MLXLLM(model=str(tiny_llama), **fields)


def test_good_fields_are_kept(tiny_llama):
    llm = MLXLLM(
        model=str(tiny_llama), context_window=2048, response_format={"type": "json_object"}
    )
    assert llm.metadata.context_window == 2048
    assert llm.response_format == {"type": "json_object"}
