"""BatchedEngine's lone request: decoded outside the batch, drafting, until others join.

Greedy replies must be token for token those of SimpleEngine decoding plainly, whether a
request ran alone, joined the batch when another arrived (at any point of its prefill
or decode, in the middle of a draft round or not), or shared the batch from the start.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from mlx_integrations.engine import BatchedEngine, SimpleEngine
from mlx_integrations.engine.batched.solo import SoloDecode
from tests.support.event_loop import wait_until
from tests.support.prompts import CHAT_PROMPTS

# Which steps draft must not depend on the machine's speed (see conftest).
pytestmark = pytest.mark.usefixtures("lookup_rounds")

PROMPTS = CHAT_PROMPTS


@pytest.fixture(scope="module")
def target(tiny_own_head: Path) -> Path:
    return tiny_own_head


@pytest.fixture(scope="module")
def plain(target: Path):
    eng = SimpleEngine(target, cache_memory_mb=0)
    yield eng
    asyncio.run(eng.stop())


@pytest.fixture(scope="module")
def lookup(target: Path):
    eng = BatchedEngine(target, prompt_lookup=4, cache_memory_mb=0)
    yield eng
    asyncio.run(eng.stop())


def handoffs_match_alone(model: Any, prompt: list[int], n: int, turns: range, **solo: Any) -> int:
    """Decode ``prompt`` alone (``SoloDecode`` with ``solo``), then again handing it to
    mlx-lm's batch generator after each number of ``turns``: every run's ``n`` tokens
    must equal the lone run's. Returns the tokens the lone run drafted."""
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    def fresh() -> SoloDecode:
        cache = make_prompt_cache(model)
        return SoloDecode(model, prompt, 0, cache, sampler=make_sampler(0.0), max_tokens=n, **solo)

    alone, reference, drafted = fresh(), [], 0
    while len(reference) < n:
        steps = alone.step()
        reference += [token for token, _, _ in steps]
        drafted += sum(d for _, d, _ in steps)
    for stop_after in turns:
        run, tokens = fresh(), []
        for _ in range(stop_after):
            tokens += [token for token, _, _ in run.step()]
        if len(tokens) >= n:  # it ended alone, in fewer turns
            assert tokens[:n] == reference, stop_after
            continue
        steps, rest, cached = run.handoff()
        tokens += [token for token, _, _ in steps]
        assert cached + rest == prompt + tokens  # nothing lost, nothing repeated
        generator = BatchGenerator(model, prefill_step_size=8)
        generator.insert([rest], max_tokens=[n - len(tokens)], caches=[run.cache])
        with mx.stream(generator.stream):
            while len(tokens) < n:
                tokens += [r.token for r in generator.next()[1]]
        generator.close()
        assert tokens == reference, stop_after
    return drafted


@pytest.mark.parametrize("prompt_lookup", [0, 3])
def test_a_handoff_at_any_turn_continues_in_the_batch_token_for_token(target, prompt_lookup):
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(target))
    prompt = tokenizer.apply_chat_template(PROMPTS[1], add_generation_prompt=True)
    turns = range(len(prompt) // 8 + 6)  # through the prefill and into the decode
    # Prefill steps of 8 tokens: several prefill turns.
    drafted = handoffs_match_alone(
        model, prompt, 24, turns, prefill_step_size=8, prompt_lookup=prompt_lookup
    )
    assert drafted > 0 or not prompt_lookup


async def test_a_lone_request_decodes_outside_the_batch_then_joins_it(target, plain):
    batched = BatchedEngine(target, cache_memory_mb=0)
    try:
        ref = [(await plain.chat(m, max_tokens=40, temperature=0)).tokens for m in PROMPTS]
        alone = await batched.chat(PROMPTS[1], max_tokens=40, temperature=0)
        assert alone.tokens == ref[1]
        stats = batched.get_stats()
        assert stats["solo_requests"] == 1 and stats["solo_tokens"] == 40
        assert stats["steps_executed"] == 0  # no batch step for a request alone
        # A first request streams alone; two more join while it decodes.
        stream = batched.stream_chat(PROMPTS[1], max_tokens=40, temperature=0)
        first = await anext(stream)
        joined = asyncio.gather(
            *[batched.chat(m, max_tokens=40, temperature=0) for m in (PROMPTS[0], PROMPTS[2])]
        )
        rest = [out async for out in stream]
        outs = await joined
        assert (rest or [first])[-1].tokens == ref[1]
        assert [o.tokens for o in outs] == [ref[0], ref[2]]
        stats = batched.get_stats()
        assert stats["peak_batch_size"] >= 2 and stats["solo_requests"] == 2
        assert stats["speculation_off_requests"] == 0  # prompt lookup is off
    finally:
        await batched.stop()


async def test_prompt_lookup_alone_is_exact_and_counted(lookup, plain):
    drafted = accepted = 0
    for messages in PROMPTS:
        ref = await plain.chat(messages, max_tokens=48, temperature=0)
        out = await lookup.chat(messages, max_tokens=48, temperature=0)
        assert out.tokens == ref.tokens and out.text == ref.text
        assert out.finish_reason == ref.finish_reason
        drafted, accepted = drafted + out.mtp_drafts, accepted + out.mtp_accepted
    assert drafted > 0 and accepted > 0
    spec = lookup.get_stats()["speculative"]
    assert spec["mode"] == "prompt_lookup" and spec["max_draft_tokens"] == 4
    assert spec["drafted_tokens"] >= drafted and spec["acceptance_rate"] > 0


async def test_prompt_lookup_stops_where_plain_decoding_does(lookup, plain):
    messages = PROMPTS[1]
    ref = await plain.chat(messages, max_tokens=48, temperature=0)
    stop = ref.text[len(ref.text) // 2 : len(ref.text) // 2 + 3]
    assert stop.strip(), ref.text
    stopped_ref = await plain.chat(messages, max_tokens=48, temperature=0, stop=[stop])
    stopped = await lookup.chat(messages, max_tokens=48, temperature=0, stop=[stop])
    assert stopped.tokens == stopped_ref.tokens and stopped.text == stopped_ref.text
    assert stopped.finish_reason == "stop"
    for n in (1, 2, 3, 5, 8):
        out = await lookup.chat(messages, max_tokens=n, temperature=0)
        assert out.tokens == ref.tokens[:n]
        assert out.finish_reason == "length" and out.completion_tokens == n


async def test_cancelled_mid_draft_then_the_next_requests_are_exact(target, plain):
    eng = BatchedEngine(target, prompt_lookup=4, prefix_key_step=1)  # with its prefix cache
    try:
        messages = PROMPTS[1]
        stream = eng.stream_chat(messages, max_tokens=200, temperature=0)
        async for out in stream:
            if out.mtp_drafts > 0:
                break  # in the middle of a verification round
        await stream.aclose()
        await wait_until(
            lambda: eng.get_stats()["num_running"] == 0, "the engine is idle", timeout=120.0
        )
        assert eng.get_stats()["last_request"]["finish_reason"] == "abort"
        ref = await plain.chat(messages, max_tokens=40, temperature=0)
        again = await eng.chat(messages, max_tokens=40, temperature=0)
        assert again.tokens == ref.tokens and again.cached_tokens > 0
        other = await eng.chat(PROMPTS[0], max_tokens=40, temperature=0)
        assert other.tokens == (await plain.chat(PROMPTS[0], max_tokens=40, temperature=0)).tokens
    finally:
        await eng.stop()


async def test_constrained_requests_decode_plainly_and_are_counted(lookup, plain):
    # Requests sharing the batch draft there (tests/engine/test_batched_speculation.py).
    before = lookup.get_stats()["speculation_off_requests"]
    refs = [(await plain.chat(m, max_tokens=32, temperature=0)).tokens for m in PROMPTS]
    outs = await asyncio.gather(*[lookup.chat(m, max_tokens=32, temperature=0) for m in PROMPTS])
    assert [o.tokens for o in outs] == refs
    assert lookup.get_stats()["speculation_off_requests"] == before
    for kwargs in (
        {"response_format": {"type": "json_object"}},
        {"logit_bias": {118: -100.0}},
    ):
        before = lookup.get_stats()["speculation_off_requests"]
        ref = await plain.chat(PROMPTS[1], max_tokens=24, temperature=0, **kwargs)
        out = await lookup.chat(PROMPTS[1], max_tokens=24, temperature=0, **kwargs)
        assert out.tokens == ref.tokens, kwargs
        assert out.mtp_drafts == 0
        assert lookup.get_stats()["speculation_off_requests"] == before + 1


async def test_seeded_sampling_alone_is_reproducible(lookup, target):
    batched = BatchedEngine(target, cache_memory_mb=0)
    try:
        for eng in (lookup, batched):
            runs = [
                await eng.chat(PROMPTS[0], max_tokens=24, temperature=0.8, seed=11)
                for _ in range(2)
            ]
            assert runs[0].tokens == runs[1].tokens
    finally:
        await batched.stop()


async def test_a_draft_model_drafts_alone_and_hands_over_to_the_batch(target, plain):
    # The model as its own draft: every draft is accepted, so rounds span many tokens.
    eng = BatchedEngine(target, draft_model=str(target), num_draft_tokens=3, cache_memory_mb=0)
    try:
        refs = [(await plain.chat(m, max_tokens=24, temperature=0)).tokens for m in PROMPTS]
        alone = await eng.chat(PROMPTS[1], max_tokens=24, temperature=0)
        assert alone.tokens == refs[1]
        assert alone.mtp_drafts > 0 and alone.mtp_accepted == alone.mtp_drafts
        spec = eng.get_stats()["speculative"]
        assert spec["mode"] == "draft_model" and spec["draft_model"] == str(target)
        assert spec["max_draft_tokens"] == 3 and spec["acceptance_rate"] == 1.0
        # Another request arrives while the first is drafting: both are exact.
        stream = eng.stream_chat(PROMPTS[1], max_tokens=24, temperature=0)
        first = await anext(stream)
        assert first.mtp_drafts > 0  # in the middle of its draft rounds
        joined = asyncio.ensure_future(eng.chat(PROMPTS[0], max_tokens=24, temperature=0))
        rest = [out async for out in stream]
        assert (rest or [first])[-1].tokens == refs[1]
        assert (await joined).tokens == refs[0]
        stats = eng.get_stats()
        # In the batch both rows can draft with the draft model: none decodes plainly.
        assert stats["peak_batch_size"] >= 2 and stats["speculation_off_requests"] == 0
    finally:
        await eng.stop()


def test_a_draft_model_solo_handoff_at_any_turn_is_token_for_token(target):
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(target))
    draft, _ = mlx_lm.load(str(target))
    prompt = tokenizer.apply_chat_template(PROMPTS[0], add_generation_prompt=True)
    turns = range(len(prompt) // 8 + 1, len(prompt) // 8 + 5)
    drafted = handoffs_match_alone(
        model, prompt, 16, turns, prefill_step_size=8, draft_model=draft, num_draft_tokens=3
    )
    assert drafted > 0


async def test_a_draft_model_cancelled_mid_draft_then_exact(target, plain):
    eng = BatchedEngine(target, draft_model=str(target), prefix_key_step=1)  # prefix cache
    try:
        stream = eng.stream_chat(PROMPTS[1], max_tokens=200, temperature=0)
        async for out in stream:
            if out.mtp_drafts > 0:
                break
        await stream.aclose()
        await wait_until(
            lambda: eng.get_stats()["num_running"] == 0, "the engine is idle", timeout=120.0
        )
        assert eng.get_stats()["last_request"]["finish_reason"] == "abort"
        ref = await plain.chat(PROMPTS[1], max_tokens=24, temperature=0)
        again = await eng.chat(PROMPTS[1], max_tokens=24, temperature=0)
        assert again.tokens == ref.tokens and again.cached_tokens > 0
        assert again.mtp_drafts > 0
    finally:
        await eng.stop()


async def test_the_last_request_of_a_batch_goes_on_alone_and_drafts(target, plain):
    eng = BatchedEngine(target, prompt_lookup=4, cache_memory_mb=0)
    try:
        ref = await plain.chat(PROMPTS[1], max_tokens=64, temperature=0)
        assert ref.finish_reason == "length"  # no early end: it outlives the others
        short_refs = [(await plain.chat(m, max_tokens=4, temperature=0)).tokens for m in PROMPTS]
        stream = eng.stream_chat(PROMPTS[1], max_tokens=64, temperature=0)
        first = await anext(stream)
        shorts = await asyncio.gather(*[eng.chat(m, max_tokens=4, temperature=0) for m in PROMPTS])
        chunks = [first] + [out async for out in stream]
        assert chunks[-1].tokens == ref.tokens
        assert [s.tokens for s in shorts] == short_refs
        stats = eng.get_stats()
        assert stats["peak_batch_size"] >= 2
        # Alone at its start, then again once the short ones ended.
        assert stats["solo_requests"] == 2
        drafted_in_batch = [c.mtp_drafts for c in chunks if c.completion_tokens <= 8]
        assert chunks[-1].mtp_drafts > max(drafted_in_batch)
    finally:
        await eng.stop()


async def test_the_next_turn_alone_takes_the_draft_models_cache_of_the_last(
    target, plain, monkeypatch
):
    from mlx_integrations.engine.speculative.draft_model import DraftCache

    held: list[int] = []
    take_shared = DraftCache.take_shared

    def recording(self, model, tokens):  # the real method; what it kept is recorded
        cache, keep = take_shared(self, model, tokens)
        held.append(keep)
        return cache, keep

    monkeypatch.setattr(DraftCache, "take_shared", recording)
    eng = BatchedEngine(target, draft_model=str(target), num_draft_tokens=3)
    try:
        first = await eng.chat(PROMPTS[1], max_tokens=24, temperature=0)
        turn = [*PROMPTS[1], {"role": "assistant", "content": first.text}]
        turn.append({"role": "user", "content": "Once more, please."})
        ref = await plain.chat(turn, max_tokens=24, temperature=0)
        second = await eng.chat(turn, max_tokens=24, temperature=0)
        assert first.tokens == (await plain.chat(PROMPTS[1], max_tokens=24, temperature=0)).tokens
        assert second.tokens == ref.tokens and second.mtp_drafts > 0
        # The first turn found nothing; the second started from the first's draft KV.
        assert held[0] == 0 and held[1] >= first.prompt_tokens
        eng.clear_runtime_caches()
        await eng.chat(turn, max_tokens=4, temperature=0)
        assert held[2] == 0  # cleared with the prefix cache
    finally:
        await eng.stop()
