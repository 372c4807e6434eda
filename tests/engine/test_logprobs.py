"""Token log-probabilities: the engines report, for each token of a reply, its
log-probability and the most likely alternatives of its step, equal to mlx-lm's own."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mlx_integrations.chat.fields import RequestError
from mlx_integrations.engine import BatchedEngine, SimpleEngine

PROMPT = "The weather in Paris is"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def mlx_lm_steps(path: Path, prompt: str, tokens: int) -> list[tuple[int, list[float]]]:
    """mlx-lm's greedy tokens with the log-probabilities it reports at each step."""
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = mlx_lm.load(str(path))
    steps = []
    for response in mlx_lm.stream_generate(
        model, tokenizer, prompt, max_tokens=tokens, sampler=make_sampler(0.0)
    ):
        steps.append((response.token, response.logprobs.tolist()))
    return steps


@pytest.mark.parametrize("engine_cls", [SimpleEngine, BatchedEngine])
async def test_logprobs_equal_mlx_lms_for_the_same_tokens(tiny_own_head, engine_cls):
    reference = mlx_lm_steps(tiny_own_head, PROMPT, 12)
    engine = engine_cls(tiny_own_head)
    try:
        out = await engine.generate(
            PROMPT, max_tokens=12, temperature=0.0, logprobs=True, top_logprobs=5
        )
    finally:
        await engine.stop()
    assert out.tokens == [token for token, _ in reference]
    assert len(out.logprobs) == len(out.tokens)
    for entry, (token, row) in zip(out.logprobs, reference, strict=True):
        assert entry.token_id == token
        assert entry.logprob == pytest.approx(row[token], abs=1e-4)
        best = sorted(range(len(row)), key=lambda i: -row[i])[:5]
        assert [i for i, _ in entry.top] == best
        assert [v for _, v in entry.top] == pytest.approx([row[i] for i in best], abs=1e-4)
        assert entry.top[0][0] == token  # greedy: the sampled token is the most likely


async def test_streamed_chunks_carry_the_logprobs_of_their_tokens(tiny_llama):
    engine = SimpleEngine(tiny_llama)
    try:
        chunks = [
            c
            async for c in engine.stream_chat(
                MESSAGES, max_tokens=16, temperature=0.0, logprobs=True
            )
        ]
        entries = [e for c in chunks for e in (c.logprobs or [])]
        assert [e.token_id for e in entries] == chunks[-1].tokens
        assert all(e.top == () and e.logprob <= 0 for e in entries)
        # Not asked for: none.
        out = await engine.chat(MESSAGES, max_tokens=4, temperature=0.0)
        assert out.logprobs is None
        # Batched requests each get their own.
        many = await asyncio.gather(
            *[
                engine.chat(MESSAGES, max_tokens=6, temperature=0.0, top_logprobs=2)
                for _ in range(3)
            ]
        )
        for out in many:
            assert [e.token_id for e in out.logprobs] == out.tokens
            assert all(len(e.top) == 2 for e in out.logprobs)
    finally:
        await engine.stop()


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"logprobs": "yes"}, "logprobs"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": -1}, "top_logprobs"),
        ({"logprobs": False, "top_logprobs": 3}, "top_logprobs"),
    ],
)
def test_bad_logprobs_settings_name_their_field(fields, path):
    from mlx_integrations.chat.request import ChatRequest

    with pytest.raises(RequestError) as caught:
        ChatRequest.build(MESSAGES, **fields)
    assert caught.value.path == path


def test_the_adapters_report_logprobs_as_their_frameworks_do(tiny_llama):
    from llama_index.core.llms import ChatMessage

    from mlx_integrations.langchain import ChatMLX
    from mlx_integrations.llama_index import MLXLLM

    llm = ChatMLX(model=str(tiny_llama), temperature=0, max_tokens=8, logprobs=True)
    message = llm.invoke("Hello", top_logprobs=3)
    content = message.response_metadata["logprobs"]["content"]
    assert len(content) == message.usage_metadata["output_tokens"]
    assert all(len(c["top_logprobs"]) == 3 and c["logprob"] <= 0 for c in content)
    # Each token's bytes, joined, are the reply's (the end-of-sequence token aside).
    text = b"".join(bytes(c["bytes"]) for c in content).decode("utf-8", "replace")
    assert text.startswith(message.content)
    assert "logprobs" not in ChatMLX(engine=llm.engine, max_tokens=4).invoke("Hi").response_metadata

    li = MLXLLM(model=str(tiny_llama), temperature=0, max_tokens=8, top_logprobs=2)
    response = li.chat([ChatMessage(role="user", content="Hello")])
    assert response.logprobs and all(len(top) == 2 for top in response.logprobs)
    assert len(response.raw["logprobs"]["content"]) == response.raw["usage"]["completion_tokens"]
