"""ChatMLX's profile read from the served model, and its reasoning controls:
reasoning_effort through the template's own switch, a thinking budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest

from mlx_integrations.langchain import ChatMLX
from tests.support.thinking import (
    EFFORT_TEMPLATE,
    QWEN3_TEMPLATE,
    build_thinking_model,
    endless_thinker,
    prompt_recorder,
)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_thinking_model(tmp_path_factory.mktemp("lc-qwen3"), QWEN3_TEMPLATE)


@pytest.fixture(scope="module")
def effort(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_thinking_model(tmp_path_factory.mktemp("lc-effort"), EFFORT_TEMPLATE)


def test_profile_of_a_thinking_model_lists_its_levels_without_loading_it(qwen3):
    llm = ChatMLX(model=str(qwen3), engine_type="simple")
    profile = llm.profile
    assert profile is not None
    assert profile["reasoning_output"] is True
    assert profile["reasoning_effort_levels"] == ["none", "high"]
    assert profile["reasoning_effort_default"] == "high"  # Qwen3 thinks unless told not to
    assert profile["max_input_tokens"] == profile["max_output_tokens"] == 4096
    assert profile["tool_calling"] and profile["tool_choice"] and profile["tool_call_streaming"]
    assert profile["structured_output"] and profile["open_weights"]
    assert profile["image_inputs"] is False and profile["video_inputs"] is False
    assert llm.get_stats()["loaded"] is False  # read from the tokenizer alone


def test_profile_of_an_effort_template(effort):
    profile = ChatMLX(model=str(effort)).profile
    assert profile["reasoning_effort_levels"] == ["low", "medium", "high"]
    assert profile["reasoning_effort_default"] == "medium"  # what the template falls back to


def test_a_template_that_does_not_think_has_no_reasoning(tiny_plain):
    # Its tokenizer has <think> tokens, but its template never thinks.
    profile = ChatMLX(model=str(tiny_plain)).profile
    assert profile["reasoning_output"] is False
    assert "reasoning_effort_levels" not in profile
    assert "reasoning_effort_default" not in profile
    with pytest.raises(ValueError, match="does not think"):
        ChatMLX(model=str(tiny_plain), reasoning_effort="low")


def test_profile_of_a_vision_model_takes_images_everywhere(tiny_vlm):
    # An engine of its own: another test's adapter may have loaded the shared one.
    llm = ChatMLX(model=str(tiny_vlm), engine_type="simple", engine_options={"cache_memory_mb": 7})
    profile = llm.profile
    assert profile is not None
    for key in ("image_inputs", "image_url_inputs", "video_inputs", "image_tool_message"):
        assert profile[key] is True, key
    assert profile["pdf_inputs"] is False and profile["audio_inputs"] is False
    assert profile["max_input_tokens"] == llm.engine.context_length


def test_a_level_the_model_does_not_take_is_refused_when_made(qwen3):
    with pytest.raises(ValueError, match=r"takes 'none', 'high'"):
        ChatMLX(model=str(qwen3), reasoning_effort="medium")
    with pytest.raises(ValueError, match="reasoning_effort"):
        ChatMLX(model=str(qwen3), reasoning_effort="max")


def prompt(llm: ChatMLX, **kwargs: Any) -> str:
    recorder, seen = prompt_recorder()
    llm.invoke("Hi?", max_tokens=1, logits_processors=[recorder], **kwargs)
    return llm.engine.tokenizer.decode(seen[0])


def test_reasoning_effort_as_a_field_and_per_call(qwen3):
    off = ChatMLX(model=str(qwen3), reasoning_effort="none")
    assert prompt(off).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert prompt(off, reasoning_effort="high").endswith("<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="disagree"):
        off.invoke("Hi?", reasoning=True)
    with pytest.raises(ValueError, match="takes reasoning_effort 'none', 'high', not 'low'"):
        off.invoke("Hi?", reasoning_effort="low")


@pytest.mark.parametrize("stream", [False, True])
def test_thinking_budget_caps_the_reasoning(qwen3, stream):
    llm = ChatMLX(model=str(qwen3), temperature=0, max_tokens=20, thinking_budget=3)
    thinker = endless_thinker(llm.engine.tokenizer, open_first=True)
    if stream:
        chunks = list(llm.stream("Hi?", logits_processors=[thinker]))
        msg = sum(chunks[1:], chunks[0])
    else:
        msg = llm.invoke("Hi?", logits_processors=[thinker])
    assert msg.usage_metadata["output_token_details"]["reasoning"] == 3
    reasoning = msg.additional_kwargs["reasoning_content"]
    assert len(llm.engine.tokenizer.encode(reasoning, add_special_tokens=False)) <= 3
    assert msg.content  # the answer after the forced </think>
    assert [b["type"] for b in msg.content_blocks] == ["reasoning", "text"]


def test_a_budget_on_a_model_that_does_not_think_is_refused(tiny_plain):
    llm = ChatMLX(model=str(tiny_plain), max_tokens=4)
    with pytest.raises(ValueError, match="does not think"):
        llm.invoke("Hi?", thinking_budget=8)
    assert isinstance(llm.invoke("Hi?").content, str)  # the engine serves on


def test_after_the_budget_a_forced_call_follows_the_tools_schema(qwen3):
    """The budget writes </think>; the forced call's grammar holds from there on."""

    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """Get the weather of a city."""
        return "sunny"

    llm = ChatMLX(model=str(qwen3), temperature=0, max_tokens=60, thinking_budget=4)
    thinker = endless_thinker(llm.engine.tokenizer, open_first=True, ban_eos=False)
    bound = llm.bind_tools([get_weather], tool_choice="any")
    msg = bound.invoke("Weather in Paris?", logits_processors=[thinker])
    assert msg.usage_metadata["output_token_details"]["reasoning"] == 4
    assert msg.additional_kwargs["reasoning_content"]
    assert [c["name"] for c in msg.tool_calls] == ["get_weather"]
    assert msg.tool_calls[0]["args"]["city"] in ("Paris", "Rome")
    assert msg.invalid_tool_calls == []
