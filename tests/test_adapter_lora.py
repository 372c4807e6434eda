"""``adapter_path`` on ChatMLX and MLXLLM: mlx-lm's replies with the adapter, one pooled
engine per (model, adapter)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from llama_index.core.base.llms.types import ChatMessage
from pydantic import ValidationError

from mlx_integrations.engine import SimpleEngine
from mlx_integrations.langchain import ChatMLX
from mlx_integrations.llama_index import MLXLLM
from tests.support.tiny_adapter import build_lora_adapter

PROMPT = "What is the capital of France?"
N = 16


@pytest.fixture(scope="module")
def adapter(tiny_own_head: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_lora_adapter(tiny_own_head, tmp_path_factory.mktemp("adapter") / "lora")


def reference_text(model: Path, adapter_path: Path | None) -> str:
    """mlx-lm's greedy reply (``stream_generate``), with the adapter loaded by mlx-lm."""
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    loaded = mlx_lm.load(
        str(model), adapter_path=None if adapter_path is None else str(adapter_path)
    )
    net, tokenizer = loaded[0], loaded[1]
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True
    )
    chunks = mlx_lm.stream_generate(net, tokenizer, ids, max_tokens=N, sampler=make_sampler(0.0))
    return "".join(c.text for c in chunks)


@pytest.fixture(scope="module")
def expected(tiny_own_head: Path, adapter: Path) -> str:
    want = reference_text(tiny_own_head, adapter)
    assert want != reference_text(tiny_own_head, None)  # the adapter changes the reply
    return want


@pytest.mark.parametrize("engine_type", ["batched", "simple"])
def test_chat_mlx_with_an_adapter_answers_as_mlx_lm(tiny_own_head, adapter, expected, engine_type):
    llm = ChatMLX(
        model=str(tiny_own_head),
        adapter_path=str(adapter),
        engine_type=engine_type,
        temperature=0.0,
        max_tokens=N,
    )
    assert llm.adapter_path == str(adapter)
    assert llm.engine.options.adapter_path == str(adapter)
    assert llm.invoke([HumanMessage(PROMPT)]).content == expected


def test_mlxllm_with_an_adapter_answers_as_mlx_lm(tiny_own_head, adapter, expected):
    llm = MLXLLM(model=str(tiny_own_head), adapter_path=adapter, temperature=0.0, max_tokens=N)
    reply = llm.chat([ChatMessage(role="user", content=PROMPT)])
    assert reply.message.content == expected


def test_a_model_with_and_without_an_adapter_are_two_engines(tiny_own_head, adapter, monkeypatch):
    plain = ChatMLX(model=str(tiny_own_head))
    tuned = ChatMLX(model=str(tiny_own_head), adapter_path=str(adapter))
    assert tuned.engine is not plain.engine
    assert plain.engine.options.adapter_path is None
    # One folder, however it is spelled (relative, or in engine_options): one engine.
    monkeypatch.chdir(adapter.parent)
    relative = MLXLLM(model=str(tiny_own_head), adapter_path=os.path.join(".", adapter.name))
    assert relative.adapter_path == str(adapter) and relative.engine is tuned.engine
    in_options = ChatMLX(model=str(tiny_own_head), engine_options={"adapter_path": adapter.name})
    assert in_options.engine is tuned.engine


def test_a_bad_adapter_path_is_refused_when_the_adapter_is_made(tiny_own_head, tmp_path):
    with pytest.raises(ValidationError, match=r"adapter_path='.*missing' does not exist"):
        ChatMLX(model=str(tiny_own_head), adapter_path=str(tmp_path / "missing"))
    with pytest.raises(ValidationError, match=r"has no adapter_config.json and no adapters"):
        MLXLLM(model=str(tiny_own_head), adapter_path=str(tmp_path))


def test_adapter_path_beside_a_given_engine_is_refused(tiny_own_head, adapter):
    engine = SimpleEngine(tiny_own_head)
    with pytest.raises(ValueError, match=r"engine= was given: pass them when you make that engine"):
        ChatMLX(engine=engine, adapter_path=str(adapter))


def test_adapter_path_and_engine_options_must_agree(tiny_own_head, adapter, tmp_path):
    other = build_lora_adapter(tiny_own_head, tmp_path / "other", seed=2)
    with pytest.raises(
        ValueError, match=r"got adapter_path=.* and engine_options\['adapter_path'\]"
    ):
        ChatMLX(
            model=str(tiny_own_head),
            adapter_path=str(adapter),
            engine_options={"adapter_path": str(other)},
        )


def test_langchains_cache_keeps_replies_with_and_without_the_adapter_apart(
    tiny_own_head, adapter, expected
):
    from langchain_core.caches import InMemoryCache

    cache = InMemoryCache()
    common = {"model": str(tiny_own_head), "temperature": 0.0, "max_tokens": N, "cache": cache}
    plain = ChatMLX(**common).invoke([HumanMessage(PROMPT)])
    assert plain.content != expected
    tuned = ChatMLX(**common, adapter_path=str(adapter)).invoke([HumanMessage(PROMPT)])
    assert tuned.content == expected  # its own reply, not the plain model's cached one
