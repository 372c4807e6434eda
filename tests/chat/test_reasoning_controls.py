"""Reasoning controls on the engines: reasoning_effort through each template's own
switch, and a thinking budget that writes the end marker for the model."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from mlx_integrations.chat.reasoning import reasoning_switch, reasoning_token_count
from mlx_integrations.engine import BaseEngine, BatchedEngine, SimpleEngine
from tests.support.thinking import (
    EFFORT_TEMPLATE,
    FLAGS_TEMPLATE,
    OPENING_TEMPLATE,
    QWEN3_TEMPLATE,
    build_thinking_model,
    endless_thinker,
    prompt_recorder,
)

QUESTION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
TEMPLATES = {
    "qwen3": QWEN3_TEMPLATE,
    "opening": OPENING_TEMPLATE,
    "effort": EFFORT_TEMPLATE,
    "flags": FLAGS_TEMPLATE,
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        name: build_thinking_model(tmp_path_factory.mktemp(f"think-{name}"), template)
        for name, template in TEMPLATES.items()
    }


@pytest.fixture(scope="module")
def engines(models: dict[str, Path], tiny_plain: Path) -> Iterator[dict[str, SimpleEngine]]:
    made = {name: SimpleEngine(path) for name, path in {**models, "plain": tiny_plain}.items()}
    yield made
    for engine in made.values():
        asyncio.run(engine.stop())


def prompt_of(engine: SimpleEngine, **kwargs: Any) -> str:
    recorder, seen = prompt_recorder()
    asyncio.run(engine.chat(QUESTION, max_tokens=1, logits_processors=[recorder], **kwargs))
    return engine.tokenizer.decode(seen[0])


@pytest.mark.parametrize(
    ("name", "kind", "levels", "default"),
    [
        ("qwen3", "enable_thinking", ("none", "high"), "high"),
        ("opening", "enable_thinking", ("none", "high"), "high"),
        ("effort", "reasoning_effort", ("low", "medium", "high"), "medium"),
        ("flags", "flags", ("none", "high"), "high"),
        ("plain", "none", (), None),
    ],
)
def test_each_template_is_read_for_its_switch(engines, name, kind, levels, default):
    switch = reasoning_switch(engines[name].tokenizer)
    assert (switch.kind, switch.levels, switch.thinks) == (kind, levels, bool(levels))
    assert switch.default == default  # the level a request without a switch gets


def test_qwen3_none_turns_thinking_off_and_high_on(engines):
    qwen3 = engines["qwen3"]
    assert prompt_of(qwen3, reasoning_effort="none").endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert prompt_of(qwen3, reasoning_effort="high").endswith("<|im_start|>assistant\n")


def test_effort_goes_to_a_template_that_reads_it(engines):
    for level in ("low", "high"):
        assert f"Reasoning: {level}" in prompt_of(engines["effort"], reasoning_effort=level)


def test_flags_go_into_the_system_message(engines):
    off = prompt_of(engines["flags"], reasoning_effort="none")
    assert off.endswith("<think>\n\n</think>\n\n") and "/no_think" not in off
    assert prompt_of(engines["flags"], reasoning_effort="high").endswith("<think>\n")


@pytest.mark.parametrize(
    ("name", "level", "says"),
    [
        ("qwen3", "medium", "takes reasoning_effort 'none', 'high', not 'medium'"),
        ("effort", "none", "takes reasoning_effort 'low', 'medium', 'high', not 'none'"),
        ("plain", "high", "does not think"),
    ],
)
def test_a_level_the_model_does_not_take_is_refused_and_the_engine_serves_on(
    engines, name, level, says
):
    engine = engines[name]
    with pytest.raises(ValueError, match=says):
        asyncio.run(engine.chat(QUESTION, max_tokens=1, reasoning_effort=level))
    assert asyncio.run(engine.chat(QUESTION, max_tokens=2)).completion_tokens >= 1


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"reasoning_effort": "max"}, "reasoning_effort must be one of"),
        ({"thinking_budget": -1}, "thinking_budget must be >= 0"),
        ({"thinking_budget": 2.5}, "thinking_budget must be a number of tokens"),
    ],
)
def test_bad_values_are_refused_at_the_boundary(engines, kwargs, error):
    with pytest.raises((TypeError, ValueError), match=error):
        asyncio.run(engines["qwen3"].chat(QUESTION, max_tokens=1, **kwargs))


def test_a_budget_needs_a_model_that_thinks(engines):
    with pytest.raises(ValueError, match="does not think"):
        asyncio.run(engines["plain"].chat(QUESTION, max_tokens=1, thinking_budget=4))


@pytest.mark.parametrize("engine_class", [SimpleEngine, BatchedEngine])
@pytest.mark.parametrize("budget", [0, 5])
def test_the_budget_closes_the_thinking_the_model_opened(models, engine_class, budget):
    """Qwen3: the model writes <think> itself and would think to the end of its tokens;
    the budget writes </think> after N reasoning tokens, then the answer follows."""
    engine = engine_class(models["qwen3"])
    try:
        tok = engine.tokenizer
        thinker = endless_thinker(tok, open_first=True)
        unbounded = asyncio.run(
            engine.chat(QUESTION, max_tokens=24, temperature=0, logits_processors=[thinker])
        )
        assert tok.think_end_tokens[0] not in unbounded.tokens  # it never closes by itself
        thinker = endless_thinker(tok, open_first=True)
        out = asyncio.run(
            engine.chat(
                QUESTION,
                max_tokens=24,
                temperature=0,
                logits_processors=[thinker],
                thinking_budget=budget,
            )
        )
        start, end = tok.think_start_tokens[0], tok.think_end_tokens[0]
        assert out.tokens[0] == start
        assert out.tokens.index(end) == 1 + budget  # N reasoning tokens, then the marker
        assert reasoning_token_count(out.tokens, tok, False) == budget
        answer = out.text.split("</think>", 1)[1]
        assert answer.strip() and len(out.tokens) == 24  # the answer goes on after it
    finally:
        asyncio.run(engine.stop())


SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["city", "days"],
}


@pytest.mark.parametrize("engine_class", [SimpleEngine, BatchedEngine])
@pytest.mark.parametrize("name", ["opening", "qwen3"])
def test_after_the_budget_the_answer_follows_the_schema(models, engine_class, name):
    """The JSON constraint holds from the end marker the budget wrote: for a prompt that
    opened the block, and for Qwen3, whose model may open one first."""
    engine = engine_class(models[name])
    try:
        tok = engine.tokenizer
        out = asyncio.run(
            engine.chat(
                QUESTION,
                max_tokens=80,
                temperature=0,
                logits_processors=[endless_thinker(tok, open_first=name == "qwen3", ban_eos=False)],
                thinking_budget=6,
                response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}},
            )
        )
        starts_open = name == "opening"
        assert reasoning_token_count(out.tokens, tok, starts_open) == 6
        answer = out.text.split("</think>", 1)[1]
        jsonschema.validate(json.loads(answer), SCHEMA)
        assert out.finish_reason == "stop"
    finally:
        asyncio.run(engine.stop())


class Delegating(BaseEngine):
    """Another project's engine: it knows no reasoning controls, only the contract
    (chat template variables and logits processors, passed on to a SimpleEngine)."""

    def __init__(self, inner: SimpleEngine) -> None:
        self.inner = inner
        self.seen: list[dict[str, Any]] = []

    model_name = "delegating"
    is_mllm = False

    @property
    def tokenizer(self) -> Any:
        return self.inner.tokenizer

    async def start(self) -> None:
        await self.inner.start()

    async def stop(self) -> None:
        await self.inner.stop()

    async def generate(self, prompt: str, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def stream_generate(self, prompt: str, **kwargs: Any) -> Any:
        raise NotImplementedError
        yield

    def _passed(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        self.seen.append(kwargs)
        allowed = {"max_tokens", "temperature", "top_p", "tools", "stop"}
        allowed |= {"chat_template_kwargs", "logits_processors"}
        return {k: v for k, v in kwargs.items() if k in allowed}

    async def chat(self, messages: Any, **kwargs: Any) -> Any:
        return await self.inner.chat(messages, **self._passed(kwargs))

    async def stream_chat(self, messages: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        async for out in self.inner.stream_chat(messages, **self._passed(kwargs)):
            yield out


def test_an_engine_without_reasoning_controls_gets_them_from_the_chat_core(models):
    from mlx_integrations.langchain import ChatMLX

    inner = SimpleEngine(models["qwen3"])
    try:
        engine = Delegating(inner)
        llm = ChatMLX(engine=engine, temperature=0, max_tokens=16)
        recorder, seen = prompt_recorder()
        llm.invoke("Hi?", reasoning_effort="none", logits_processors=[recorder])
        assert engine.seen[-1]["chat_template_kwargs"] == {"enable_thinking": False}
        assert inner.tokenizer.decode(seen[0]).endswith("<think>\n\n</think>\n\n")
        thinker = endless_thinker(inner.tokenizer, open_first=True)
        msg = llm.invoke("Hi?", thinking_budget=3, logits_processors=[thinker])
        assert msg.usage_metadata["output_token_details"]["reasoning"] == 3
        assert msg.content
    finally:
        asyncio.run(inner.stop())
