"""Speculative decoding and KV quantization as fields of both adapters."""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from llama_index.core.base.llms.types import ChatMessage

from mlx_integrations.engine import SimpleEngine
from mlx_integrations.langchain import ChatMLX
from mlx_integrations.llama_index import MLXLLM
from mlx_integrations.runtime import quantized_attention_error
from tests.support.tiny_models import cached_tiny_model

# Which steps draft must not depend on the machine's speed (see conftest).
pytestmark = pytest.mark.usefixtures("lookup_rounds")

QUOTE = (
    "Repeat exactly: the red fox jumps over the lazy dog. the red fox jumps over the "
    "lazy dog. the red fox jumps over the lazy dog."
)


def test_chat_mlx_prompt_lookup_field_drafts_and_keeps_the_greedy_reply(tiny_llama: Path):
    plain = ChatMLX(model=str(tiny_llama), temperature=0.0, max_tokens=40)
    looked = ChatMLX(model=str(tiny_llama), temperature=0.0, max_tokens=40, prompt_lookup=4)
    assert looked.engine is not plain.engine
    assert looked.engine.options.prompt_lookup == 4
    want = plain.invoke([HumanMessage(QUOTE)])
    got = looked.invoke([HumanMessage(QUOTE)])
    assert got.content == want.content
    stats = looked.get_stats()["speculative"]
    assert stats["mode"] == "prompt_lookup"
    assert got.response_metadata["draft_tokens"] == stats["drafted_tokens"] > 0


@pytest.mark.skipif(
    quantized_attention_error("float32", 32, 8, 32) is not None,
    reason="this MLX backend has no kernel for attention over a quantized KV cache",
)
def test_mlxllm_kv_bits_field_reaches_a_batched_engine():
    wide_heads = cached_tiny_model("tiny-llama-h32", hidden_size=128, num_attention_heads=4)
    llm = MLXLLM(
        model=str(wide_heads),
        engine_type="batched",
        kv_bits=8,
        kv_group_size=32,
        temperature=0.0,
        max_tokens=12,
    )
    options = llm.engine.options
    assert (options.kv_bits, options.kv_group_size) == (8, 32)
    reply = llm.chat([ChatMessage(role="user", content="Hello")])
    assert reply.raw["usage"]["completion_tokens"] > 0


def test_fields_join_engine_options(tiny_llama: Path):
    llm = ChatMLX(model=str(tiny_llama), prompt_lookup=3, engine_options={"cache_memory_mb": 64})
    assert (llm.engine.options.prompt_lookup, llm.engine.options.cache_memory_mb) == (3, 64)
    same = ChatMLX(
        model=str(tiny_llama), engine_options={"prompt_lookup": 3, "cache_memory_mb": 64}
    )
    assert same.engine is llm.engine  # the same options: one pooled engine


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"kv_bits": 4, "engine_options": {"kv_bits": 8}},
            r"kv_bits=4 and engine_options\['kv_bits'\]=8",
        ),
        ({"prompt_lookup": -1}, "prompt_lookup"),
        ({"kv_bits": 5}, "kv_bits"),
        ({"num_draft_tokens": 0, "draft_model": "x"}, "num_draft_tokens"),
    ],
)
def test_bad_engine_fields_are_refused_naming_them(tiny_llama: Path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ChatMLX(model=str(tiny_llama), **kwargs)
    with pytest.raises(ValueError, match=match):
        MLXLLM(model=str(tiny_llama), **kwargs)


def test_engine_fields_beside_a_given_engine_are_refused(tiny_llama: Path):
    engine = SimpleEngine(tiny_llama)
    with pytest.raises(ValueError, match=r"prompt_lookup=4.*SimpleEngine\(path, prompt_lookup=4\)"):
        ChatMLX(engine=engine, prompt_lookup=4)
    assert ChatMLX(engine=engine).engine is engine


def test_a_per_call_model_gets_the_engine_fields_too(tiny_llama: Path, tiny_qwen2: Path):
    from mlx_integrations.engine import pool

    llm = ChatMLX(model=str(tiny_llama), prompt_lookup=3, temperature=0.0, max_tokens=3)
    # The engine made from the per-call model is of the adapter's own kind and options.
    held = pool.acquire(str(tiny_qwen2), engine_type=llm.engine_type, prompt_lookup=3)
    try:
        msg = llm.invoke("Hi", model=str(tiny_qwen2))
        assert msg.response_metadata["model_name"] == str(tiny_qwen2)
        assert held.get_stats()["num_requests_processed"] == 1
    finally:
        pool.release(held)
