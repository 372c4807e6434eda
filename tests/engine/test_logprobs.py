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


# --------------------------------------------------------------- prompt scoring


@pytest.mark.parametrize("engine_cls", [SimpleEngine, BatchedEngine])
async def test_a_prompts_scores_equal_the_logprobs_of_its_greedy_reply(tiny_own_head, engine_cls):
    """Scoring a prompt and its greedy reply gives the reply's tokens the log-probabilities
    that decoding reported for them (one forward pass over the text vs. step by step),
    and each is the most likely of its position."""
    engine = engine_cls(tiny_own_head)
    try:
        out = await engine.generate(
            PROMPT, max_tokens=10, temperature=0.0, logprobs=True, top_logprobs=3
        )
        prompt_ids = engine.tokenizer.encode(PROMPT)
        scored = await engine.prompt_logprobs(prompt_ids + out.tokens, top_logprobs=3)
    finally:
        await engine.stop()
    assert scored.tokens == prompt_ids + out.tokens
    assert len(scored.logprobs) == len(scored.tokens) - 1
    reply = scored.logprobs[len(prompt_ids) - 1 :]
    for entry, decoded in zip(reply, out.logprobs, strict=True):
        assert entry.token_id == decoded.token_id
        assert entry.logprob == pytest.approx(decoded.logprob, abs=1e-4)
        assert [i for i, _ in entry.top] == [i for i, _ in decoded.top]
        assert entry.top[0] == (entry.token_id, entry.logprob)  # greedy: the same float


async def test_prompt_scores_equal_one_forward_pass_of_mlx_lm(tiny_own_head):
    """Every position, in pieces of 512 (a prompt longer than one piece): the log-softmax
    of mlx-lm's model over the whole prompt, read at the next token."""
    import mlx.core as mx
    import mlx_lm

    engine = SimpleEngine(tiny_own_head)
    model, tokenizer = mlx_lm.load(str(tiny_own_head))
    ids = tokenizer.encode(" ".join(["the weather in Paris is mild"] * 120))[:700]
    try:
        scored = await engine.prompt_logprobs(ids)
    finally:
        await engine.stop()
    logits = model(mx.array(ids)[None])[0].astype(mx.float32)
    rows = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    expected = [rows[i, ids[i + 1]].item() for i in range(len(ids) - 1)]
    assert [e.token_id for e in scored.logprobs] == ids[1:]
    assert [e.logprob for e in scored.logprobs] == pytest.approx(expected, abs=1e-4)
    assert all(e.top == () for e in scored.logprobs)  # top_logprobs=0: the tokens alone


async def test_a_text_prompt_is_scored_as_generate_encodes_it(tiny_llama):
    engine = SimpleEngine(tiny_llama)
    try:
        scored = await engine.prompt_logprobs(PROMPT, top_logprobs=2)
        expected = engine.tokenizer.encode(PROMPT)  # the tokenizer's own special tokens
    finally:
        await engine.stop()
    assert scored.tokens == expected
    assert len(scored.logprobs) == len(expected) - 1
    assert all(len(e.top) == 2 and e.logprob <= e.top[0][1] for e in scored.logprobs)


async def test_a_scored_prompt_serves_its_generate_from_the_prefix_cache(tiny_llama):
    engine = SimpleEngine(tiny_llama)
    try:
        scored = await engine.prompt_logprobs(PROMPT)
        out = await engine.generate(scored.tokens, max_tokens=2, temperature=0.0)
        cold = SimpleEngine(tiny_llama, cache_memory_mb=0)
        try:
            plain = await cold.generate(scored.tokens, max_tokens=2, temperature=0.0)
        finally:
            await cold.stop()
    finally:
        await engine.stop()
    assert out.cached_tokens == len(scored.tokens) - 1
    assert out.tokens == plain.tokens


async def test_token_id_prompts_generate_as_their_text_does(tiny_llama):
    engine = SimpleEngine(tiny_llama, cache_memory_mb=0)
    try:
        ids = engine.tokenizer.encode(PROMPT)
        by_ids = await engine.generate(ids, max_tokens=6, temperature=0.0)
        by_text = await engine.generate(PROMPT, max_tokens=6, temperature=0.0)
    finally:
        await engine.stop()
    assert by_ids.prompt_tokens == len(ids)
    assert by_ids.tokens == by_text.tokens


@pytest.mark.parametrize(
    ("prompt", "top", "path", "words"),
    [
        ([], 0, "prompt", "empty"),
        ([1, "2"], 0, "prompt[1]", "token id"),
        ([1, 10**9], 0, "prompt[1]", "outside the vocabulary"),
        ("", 0, "prompt", "empty"),
        ("hello", 21, "top_logprobs", "0 to 20"),
    ],
)
async def test_bad_prompts_to_score_are_refused_and_the_engine_serves_on(
    tiny_llama, prompt, top, path, words
):
    engine = SimpleEngine(tiny_llama)
    try:
        with pytest.raises(RequestError, match=words) as caught:
            await engine.prompt_logprobs(prompt, top_logprobs=top)
        assert caught.value.path == path
        scored = await engine.prompt_logprobs("hello there")
    finally:
        await engine.stop()
    assert scored.logprobs


async def test_a_cancelled_scoring_frees_the_engine(tiny_llama):
    """A caller that leaves while a long prompt is scored: the owner thread stops after
    its piece and serves the next request."""
    engine = SimpleEngine(tiny_llama, prefill_step_size=16)
    try:
        ids = engine.tokenizer.encode(" ".join(["word"] * 3000))[:4000]
        task = asyncio.create_task(engine.prompt_logprobs(ids))
        await asyncio.sleep(0.05)  # under way, or on its way to the owner thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        out = await asyncio.wait_for(engine.generate(PROMPT, max_tokens=3), 60)
    finally:
        await engine.stop()
    assert out.completion_tokens == 3


async def test_a_prompt_the_size_of_the_window_is_scored_but_leaves_no_room(tiny_llama):
    engine = SimpleEngine(tiny_llama)
    try:
        ids = [5] * engine.context_length
        scored = await engine.prompt_logprobs(ids)
        with pytest.raises(RequestError, match="context window") as caught:
            await engine.generate(ids, max_tokens=1)
        too_long = [*ids, 5]
        with pytest.raises(RequestError, match="context window"):
            await engine.prompt_logprobs(too_long)
    finally:
        await engine.stop()
    assert len(scored.logprobs) == len(ids) - 1
    assert caught.value.path == "prompt"


async def test_scoring_beside_a_running_batch_changes_neither(tiny_llama):
    """A BatchedEngine scores a long prompt in pieces between the decode steps of the
    requests it is running: their replies are those they give alone, and the scores
    are SimpleEngine's."""
    ids = None
    engine = BatchedEngine(tiny_llama, prefill_step_size=64)
    try:
        alone = await engine.generate(PROMPT, max_tokens=40, temperature=0.0)
        ids = engine.tokenizer.encode(" ".join(["word"] * 1200))[:1024]
        replies = [engine.generate(PROMPT, max_tokens=40, temperature=0.0) for _ in range(2)]
        *outs, scored = await asyncio.gather(*replies, engine.prompt_logprobs(ids, 2))
    finally:
        await engine.stop()
    simple = SimpleEngine(tiny_llama)
    try:
        reference = await simple.prompt_logprobs(ids, 2)
    finally:
        await simple.stop()
    assert [out.tokens for out in outs] == [alone.tokens, alone.tokens]
    assert [e.token_id for e in scored.logprobs] == [e.token_id for e in reference.logprobs]
    assert [e.logprob for e in scored.logprobs] == pytest.approx(
        [e.logprob for e in reference.logprobs], abs=1e-4
    )
