"""ChatMLX and MLXLLM refuse what they would silently ignore or get wrong: unknown
constructor fields, non-finite numbers, template variables that are not a dict."""

from __future__ import annotations

import math
from pathlib import Path

import pytest


def chatmlx(**fields):
    from mlx_integrations.langchain import ChatMLX

    return ChatMLX(**fields)


def mlxllm(**fields):
    from mlx_integrations.llama_index import MLXLLM

    return MLXLLM(**fields)


def chatmlx_call(llm, **kwargs):
    return llm.invoke("Hi", **kwargs)


def mlxllm_call(llm, **kwargs):
    from llama_index.core.base.llms.types import ChatMessage

    return llm.chat([ChatMessage(role="user", content="Hi")], **kwargs)


ADAPTERS = [
    pytest.param(chatmlx, chatmlx_call, "ChatMLX", id="ChatMLX"),
    pytest.param(mlxllm, mlxllm_call, "MLXLLM", id="MLXLLM"),
]


@pytest.mark.parametrize(("make", "call", "name"), ADAPTERS)
@pytest.mark.parametrize(
    ("field", "value"), [("n", 2), ("temprature", 0), ("best_of", 3), ("top_n", 5)]
)
def test_unknown_constructor_fields_are_an_error(tiny_llama: Path, make, call, name, field, value):
    with pytest.raises(ValueError, match=rf"{name} got unknown field\(s\) \['{field}'\]") as info:
        make(model=str(tiny_llama), **{field: value})
    message = str(info.value)
    assert "Known fields:" in message and "'temperature'" in message and "'max_tokens'" in message
    if field == "n":
        assert "one generation per call" in message


@pytest.mark.parametrize(("make", "call", "name"), ADAPTERS)
def test_known_fields_and_aliases_still_construct(tiny_llama: Path, make, call, name):
    llm = make(model=str(tiny_llama), temperature=0, max_tokens=3, top_k=5, stop=["x"])
    assert llm.temperature == 0 and llm.max_tokens == 3
    if name == "ChatMLX":
        llm = make(model_name=str(tiny_llama), stop_sequences=["x"], timeout=5, max_retries=1)
        assert llm.stop == ["x"]


FLOAT_FIELDS = ["temperature", "top_p", "min_p", "repetition_penalty"]


@pytest.mark.parametrize(("make", "call", "name"), ADAPTERS)
@pytest.mark.parametrize("value", [math.inf, math.nan], ids=["inf", "nan"])
@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_non_finite_constructor_fields_are_refused(tiny_llama, make, call, name, field, value):
    # (pydantic's own bounds on MLXLLM fields catch nan first, naming the field too)
    with pytest.raises(ValueError, match=rf"{field}(.|\n)*(finite number|Input should be)"):
        make(model=str(tiny_llama), **{field: value})


@pytest.fixture(scope="module")
def adapters(tiny_llama: Path):
    return {"ChatMLX": chatmlx(model=str(tiny_llama)), "MLXLLM": mlxllm(model=str(tiny_llama))}


def served(llm) -> int:
    return llm.get_stats()["num_requests_processed"] + llm.get_stats()["num_requests_failed"]


@pytest.mark.parametrize(("make", "call", "name"), ADAPTERS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_non_finite_call_arguments_are_refused(adapters, make, call, name, field, value):
    llm = adapters[name]
    before = served(llm)
    with pytest.raises(ValueError, match=rf"{field} must be a finite number"):
        call(llm, max_tokens=2, **{field: value})
    assert served(llm) == before  # refused before reaching the engine


@pytest.mark.parametrize(("make", "call", "name"), ADAPTERS)
@pytest.mark.parametrize("value", ["x", ["a"], {1: 2}], ids=["str", "list", "int-key"])
def test_chat_template_kwargs_must_be_a_dict(tiny_llama, adapters, make, call, name, value):
    with pytest.raises(TypeError, match=r"chat_template_kwargs must be a dict .*got"):
        make(model=str(tiny_llama), chat_template_kwargs=value)
    llm = adapters[name]
    before = served(llm)
    with pytest.raises(TypeError, match=r"chat_template_kwargs must be a dict .*got"):
        call(llm, max_tokens=2, chat_template_kwargs=value)
    assert served(llm) == before
