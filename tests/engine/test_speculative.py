"""Speculative decoding in SimpleEngine: greedy replies equal plain decoding, for both sources.

The models have their own output head (``tie_word_embeddings=False``) so that greedy
replies vary instead of repeating one token, and repeat n-grams that prompt lookup finds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mlx_integrations.engine import BatchedEngine, SimpleEngine
from tests.support.pool_keys import assert_pool_keys_by
from tests.support.tiny_models import build_tiny_model

# Which steps draft must not depend on the machine's speed (see conftest).
pytestmark = pytest.mark.usefixtures("lookup_rounds")

PROMPTS = [
    [{"role": "user", "content": "What is the weather in Paris?"}],
    [
        {
            "role": "user",
            "content": "The quick brown fox jumps over the lazy dog. Repeat it: The quick",
        }
    ],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello! 東京?"}],
]
SOURCES = ["prompt_lookup", "same_draft", "other_draft"]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("target"), tie_word_embeddings=False)


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same tokenizer and shape, other weights: a draft the target mostly rejects."""
    return build_tiny_model(tmp_path_factory.mktemp("other"), seed=5, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def plain(target: Path):
    eng = SimpleEngine(target)
    yield eng
    asyncio.run(eng.stop())


@pytest.fixture(scope="module")
def engines(target: Path, other: Path):
    # prefix_key_step=1: the prompts here are shorter than CUDA's default key step, and
    # the tests check that what is cached is reused exactly.
    made = {
        "prompt_lookup": SimpleEngine(target, prompt_lookup=4, prefix_key_step=1),
        "same_draft": SimpleEngine(target, draft_model=str(target), prefix_key_step=1),
        "other_draft": SimpleEngine(
            target, draft_model=str(other), num_draft_tokens=2, prefix_key_step=1
        ),
    }
    yield made
    for eng in made.values():
        asyncio.run(eng.stop())


async def collect(stream):
    return [out async for out in stream]


@pytest.mark.parametrize("source", SOURCES)
async def test_greedy_tokens_equal_plain_decoding(plain, engines, source):
    eng = engines[source]
    drafted = accepted = 0
    for messages in PROMPTS:
        ref = await plain.chat(messages, max_tokens=48, temperature=0)
        out = await eng.chat(messages, max_tokens=48, temperature=0)
        assert out.tokens == ref.tokens
        assert out.text == ref.text and out.finish_reason == ref.finish_reason
        drafted += out.mtp_drafts
        accepted += out.mtp_accepted
    assert drafted > 0
    if source == "same_draft":
        assert accepted == drafted  # a model agrees with itself
    elif source == "other_draft":
        assert accepted < drafted / 2
    else:
        assert accepted > 0  # the replies repeat n-grams


@pytest.mark.parametrize("source", SOURCES)
async def test_stop_strings_and_max_tokens_end_where_plain_decoding_does(plain, engines, source):
    eng = engines[source]
    messages = PROMPTS[1]
    ref = await plain.chat(messages, max_tokens=48, temperature=0)
    stop = ref.text[len(ref.text) // 2 : len(ref.text) // 2 + 3]
    assert stop.strip(), ref.text
    stopped_ref = await plain.chat(messages, max_tokens=48, temperature=0, stop=[stop])
    stopped = await eng.chat(messages, max_tokens=48, temperature=0, stop=[stop])
    assert stopped.text == stopped_ref.text and stop not in stopped.text
    assert stopped.finish_reason == "stop"
    for n in (1, 2, 3, 5, 8):
        out = await eng.chat(messages, max_tokens=n, temperature=0)
        assert out.tokens == ref.tokens[:n]
        assert out.finish_reason == "length" and out.completion_tokens == n


@pytest.mark.parametrize("source", SOURCES)
async def test_cancelled_mid_draft_then_the_next_request_is_exact(plain, engines, source):
    eng = engines[source]
    messages = PROMPTS[1]
    stream = eng.stream_chat(messages, max_tokens=200, temperature=0)
    async for out in stream:
        if out.mtp_drafts > 0:
            break  # leaves the request in the middle of a verification round
    await stream.aclose()
    for _ in range(100):  # the owner thread ends the request at its next token
        if eng.get_stats()["num_running"] == 0:
            break
        await asyncio.sleep(0.01)
    assert eng.get_stats()["last_request"]["finish_reason"] == "abort"
    # The same prompt again reuses the aborted request's KV cache.
    ref = await plain.chat(messages, max_tokens=40, temperature=0)
    again = await eng.chat(messages, max_tokens=40, temperature=0)
    assert again.tokens == ref.tokens and again.cached_tokens > 0
    other = await eng.chat(PROMPTS[0], max_tokens=40, temperature=0)
    assert other.tokens == (await plain.chat(PROMPTS[0], max_tokens=40, temperature=0)).tokens


@pytest.mark.parametrize("source", SOURCES)
async def test_turns_reuse_the_prefix_cache_and_stay_exact(target, engines, source):
    eng = engines[source]
    fresh = SimpleEngine(target, cache_memory_mb=0)
    try:
        history = list(PROMPTS[1])
        for turn in range(3):
            ref = await fresh.chat(history, max_tokens=24, temperature=0)
            out = await eng.chat(history, max_tokens=24, temperature=0)
            assert out.tokens == ref.tokens
            if turn:
                assert out.cached_tokens > 0
            if source == "same_draft":  # the draft's own cache followed the turns
                assert out.mtp_accepted == out.mtp_drafts > 0
            history += [
                {"role": "assistant", "content": out.text},
                {"role": "user", "content": f"Again, turn {turn}: the lazy dog"},
            ]
    finally:
        await fresh.stop()


@pytest.mark.parametrize("source", SOURCES)
async def test_requests_with_logits_processors_decode_without_speculation(plain, engines, source):
    import mlx.core as mx

    eng = engines[source]
    messages = PROMPTS[1]
    calls: list[int] = []

    def ban_118(tokens, logits):
        calls.append(int(tokens.size))
        return mx.where(mx.arange(logits.shape[-1]) == 118, -mx.inf, logits)

    for kwargs in (
        {"logit_bias": {118: -100.0, 383: 5.0}},
        {"repetition_penalty": 1.3},
        {"logits_processors": [ban_118]},
        {"response_format": {"type": "json_object"}},
    ):
        ref = await plain.chat(messages, max_tokens=24, temperature=0, **kwargs)
        out = await eng.chat(messages, max_tokens=24, temperature=0, **kwargs)
        assert out.tokens == ref.tokens, kwargs
        assert out.mtp_drafts == 0 and out.mtp_accepted == 0
    assert len(calls) >= 2 * 24  # at every decode step of both requests


@pytest.mark.parametrize("source", SOURCES)
async def test_sampling_is_reproducible_with_a_seed(engines, source):
    eng = engines[source]
    runs = [
        await eng.chat(PROMPTS[0], max_tokens=32, temperature=0.8, top_p=0.95, seed=11)
        for _ in range(2)
    ]
    assert runs[0].tokens == runs[1].tokens and runs[0].mtp_drafts > 0


async def test_every_chunk_carries_cumulative_counts_and_stats_report_them(target):
    eng = SimpleEngine(target, prompt_lookup=3)
    try:
        chunks = await collect(eng.stream_chat(PROMPTS[1], max_tokens=48, temperature=0))
        drafts = [c.mtp_drafts for c in chunks]
        accepted = [c.mtp_accepted for c in chunks]
        assert drafts == sorted(drafts) and accepted == sorted(accepted)
        assert all(a <= d for a, d in zip(accepted, drafts, strict=True))
        last = chunks[-1]
        assert last.mtp_drafts > 0
        second = await eng.chat(PROMPTS[0], max_tokens=16, temperature=0)
        stats = eng.get_stats()
        spec = stats["speculative"]
        assert spec["mode"] == "prompt_lookup" and spec["max_draft_tokens"] == 3
        assert spec["drafted_tokens"] == last.mtp_drafts + second.mtp_drafts
        assert spec["accepted_tokens"] == last.mtp_accepted + second.mtp_accepted
        assert spec["acceptance_rate"] == pytest.approx(
            spec["accepted_tokens"] / spec["drafted_tokens"]
        )
        assert stats["last_request"]["mtp_drafts"] == second.mtp_drafts
    finally:
        await eng.stop()


async def test_plain_engines_report_the_same_keys(target, plain):
    batched = BatchedEngine(target)
    try:
        await batched.chat(PROMPTS[0], max_tokens=4, temperature=0)
        await plain.chat(PROMPTS[0], max_tokens=4, temperature=0)
        simple_stats, batched_stats = plain.get_stats(), batched.get_stats()
        assert simple_stats["speculative"].keys() == batched_stats["speculative"].keys()
        assert batched_stats["speculative"]["mode"] == "off"
        assert batched_stats["last_request"]["mtp_drafts"] == 0
        assert simple_stats["speculative"]["drafted_tokens"] == 0
    finally:
        await batched.stop()


@pytest.mark.parametrize(
    ("options", "exc", "match"),
    [
        ({"num_draft_tokens": 0}, ValueError, "num_draft_tokens must be >= 1, got 0"),
        ({"num_draft_tokens": 2.5}, TypeError, "num_draft_tokens must be an integer"),
        ({"prompt_lookup": -1}, ValueError, "prompt_lookup must be >= 0, got -1; 0 turns"),
        ({"prompt_lookup": True}, TypeError, "prompt_lookup must be an integer, got True"),
        ({"draft_model": ""}, TypeError, "draft_model must be a model folder"),
        ({"draft_model": "./nowhere", "prompt_lookup": 3}, ValueError, "pick one"),
        ({"draft_model": "./no/such/model"}, FileNotFoundError, "no/such/model"),
    ],
)
def test_bad_options_are_refused_at_construction(target, options, exc, match):
    with pytest.raises(exc, match=match):
        SimpleEngine(target, **options)


def test_batched_engine_checks_its_draft_model_at_construction(target):
    with pytest.raises(FileNotFoundError, match="no/such/model"):
        BatchedEngine(target, draft_model="./no/such/model")
    BatchedEngine(target, draft_model=str(target))  # tests/engine/test_batched_solo.py
    BatchedEngine(target, num_draft_tokens=4)  # without a draft source there is nothing to do
    BatchedEngine(target, prompt_lookup=3)  # tests/engine/test_batched_solo.py


async def test_a_draft_model_with_another_vocabulary_is_refused(target, tmp_path):
    wider = build_tiny_model(tmp_path / "wider", special_tokens=["<extra_1>", "<extra_2>"])
    eng = SimpleEngine(target, draft_model=str(wider))
    with pytest.raises(ValueError, match=r"vocabulary of \d+ tokens but the target model has"):
        await eng.start()
    assert not eng.is_loaded
    await eng.stop()


def test_the_pool_keys_engines_by_their_speculative_options(target):
    assert_pool_keys_by(target, "prompt_lookup", 4, 2)
