"""The engine the adapters make when none is named: BatchedEngine, unless only SimpleEngine
serves the model or the options."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage

from mlx_integrations.engine import BatchedEngine, SimpleEngine
from mlx_integrations.langchain import ChatMLX
from mlx_integrations.llama_index import MLXLLM
from mlx_integrations.runtime import quantized_attention_error
from tests.support.forcing import forcing
from tests.support.tiny_models import cached_tiny_model

CALLS = 4
REPLY = "one two three four five six"


class InFlight:
    """Logits processors that record which request each decode step served.

    The first decode step waits until the engine holds all ``CALLS`` requests
    (running or queued), so the requests overlap whatever the machine's speed: an
    engine that serves them together interleaves their steps, one that serves one at a
    time finishes each before the next starts.
    """

    def __init__(self, engine: Any, tokenizer: Any) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.steps: list[int] = []
        self.all_in = threading.Event()

    def processor(self, index: int) -> Callable[[Any, Any], Any]:
        force, _ = forcing(self.tokenizer, REPLY)  # several tokens, no early EOS

        def record(history: Any, logits: Any) -> Any:
            if not self.all_in.is_set():
                self._wait_for_all()
            self.steps.append(index)  # processors run on the engine's owner thread only
            return force(history, logits)

        return record

    def _wait_for_all(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            stats = self.engine.get_stats()
            if stats["num_running"] + stats["num_waiting"] >= CALLS:
                self.all_in.set()
                return
            time.sleep(0.005)  # the other calls are on their way to the engine
        raise TimeoutError(f"the engine never held {CALLS} requests at once")

    def interleaved(self) -> bool:
        """Whether a request decoded a step between two steps of another."""
        first = {i: self.steps.index(i) for i in set(self.steps)}
        last = {i: len(self.steps) - 1 - self.steps[::-1].index(i) for i in set(self.steps)}
        return any(first[j] < last[i] and first[i] < first[j] for i in first for j in first)


def _chat_mlx_call(llm: ChatMLX) -> Callable[[int, Any], Awaitable[str]]:
    async def call(i: int, processor: Any) -> str:
        reply = await llm.ainvoke(f"Question {i}", logits_processors=[processor])
        return str(reply.content)

    return call


def _mlxllm_call(llm: MLXLLM) -> Callable[[int, Any], Awaitable[str]]:
    async def call(i: int, processor: Any) -> str:
        message = ChatMessage(role="user", content=f"Question {i}")
        reply = await llm.achat([message], logits_processors=[processor])
        return str(reply.message.content)

    return call


@pytest.mark.parametrize(
    ("make", "call_of"),
    [(ChatMLX, _chat_mlx_call), (MLXLLM, _mlxllm_call)],
    ids=["ChatMLX.ainvoke", "MLXLLM.achat"],
)
async def test_a_default_adapter_serves_concurrent_calls_together(tiny_llama, make, call_of):
    llm = make(model=str(tiny_llama), temperature=0, max_tokens=64)
    assert llm.engine_type == "batched"
    probe = InFlight(llm.engine, llm.engine.tokenizer)
    call = call_of(llm)
    replies = await asyncio.gather(*[call(i, probe.processor(i)) for i in range(CALLS)])
    assert replies == [REPLY] * CALLS
    assert sorted(set(probe.steps)) == list(range(CALLS))
    assert probe.interleaved(), f"the requests ran one after the other: {probe.steps}"
    assert llm.get_stats()["peak_batch_size"] >= 2


def test_both_adapters_share_the_default_engine(tiny_llama):
    chat = ChatMLX(model=str(tiny_llama))
    llm = MLXLLM(model=str(tiny_llama))
    explicit = ChatMLX(model=str(tiny_llama), engine_type="batched")
    assert isinstance(chat.engine, BatchedEngine)
    assert llm.engine is chat.engine is explicit.engine
    simple = ChatMLX(model=str(tiny_llama), engine_type="simple")
    assert isinstance(simple.engine, SimpleEngine) and simple.engine_type == "simple"


def test_a_vision_model_gets_a_simple_engine_unless_batched_is_asked(tiny_vlm):
    chat = ChatMLX(model=str(tiny_vlm))
    llm = MLXLLM(model=str(tiny_vlm))
    assert isinstance(chat.engine, SimpleEngine) and chat.engine_type == "simple"
    assert llm.engine is chat.engine and llm.engine_type == "simple"
    with pytest.raises(ValueError, match=r"vision-language model.*engine_type='simple'"):
        ChatMLX(model=str(tiny_vlm), engine_type="batched")


def test_a_per_call_vision_model_gets_a_simple_engine(tiny_llama, tiny_vlm):
    llm = ChatMLX(model=str(tiny_llama), temperature=0, max_tokens=3)
    reply = llm.invoke("Hi", model=str(tiny_vlm))
    assert reply.response_metadata["model_name"] == str(tiny_vlm)
    assert reply.usage_metadata["output_tokens"] >= 1


@pytest.mark.skipif(
    quantized_attention_error("float32", 32, 8, 32) is not None,
    reason="this MLX backend has no kernel for attention over a quantized KV cache",
)
@pytest.mark.parametrize("make", [ChatMLX, MLXLLM], ids=["ChatMLX", "MLXLLM"])
def test_quantized_kv_start_gets_a_simple_engine_unless_batched_is_asked(make):
    wide_heads: Path = cached_tiny_model("tiny-llama-h32", hidden_size=128, num_attention_heads=4)
    kv = {"kv_bits": 8, "kv_group_size": 32, "quantized_kv_start": 16}
    llm = make(model=str(wide_heads), temperature=0, max_tokens=4, **kv)
    assert isinstance(llm.engine, SimpleEngine) and llm.engine_type == "simple"
    assert llm.engine.options.quantized_kv_start == 16
    before = llm.get_stats()["num_requests_processed"]  # the engine is pooled: shared
    if isinstance(llm, ChatMLX):
        llm.invoke("Hello")
    else:
        llm.chat([ChatMessage(role="user", content="Hello")])
    assert llm.get_stats()["num_requests_processed"] == before + 1
    with pytest.raises(
        ValueError, match=r"quantized_kv_start must be 0, got 16.*engine_type='simple'"
    ):
        make(model=str(wide_heads), engine_type="batched", **kv)
    # Without kv_bits nothing is quantized: the default stays batched.
    plain = make(model=str(wide_heads), quantized_kv_start=16)
    assert isinstance(plain.engine, BatchedEngine)


def test_max_num_seqs_is_an_option_of_the_default_engine_only(tiny_llama):
    llm = ChatMLX(model=str(tiny_llama), engine_options={"max_num_seqs": 2})
    assert isinstance(llm.engine, BatchedEngine) and llm.engine.max_num_seqs == 2
    with pytest.raises(ValueError, match=r"max_num_seqs.*engine_type='batched'"):
        MLXLLM(model=str(tiny_llama), engine_type="simple", engine_options={"max_num_seqs": 2})
