"""Prompt lookup for a request alone: rounds where a match pays, pipelined steps elsewhere.

Greedy tokens must be those of plain decoding whichever steps verify drafts; a round
is chosen by what its match is expected to emit against what it costs; and the
expectation is learned from rounds that ran and from the rounds plain steps skipped.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from mlx_integrations.engine import BatchedEngine, SimpleEngine
from mlx_integrations.engine.speculative.pace import LookupPace
from mlx_integrations.engine.speculative.prompt_lookup import prompt_lookup_steps
from tests.support.prompts import CHAT_PROMPTS, RAG_MESSAGES, conversation


class ScriptedPace(LookupPace):
    """Answers ``worth`` from a repeating script instead of timing, and records what
    the pace is told: every ``(n, emitted)`` observed, and at each ``worth`` call how
    many observations came before it."""

    def __init__(self, script: Sequence[bool]):
        super().__init__()
        self._script = itertools.cycle(script)
        self.observed: list[tuple[int, int]] = []
        self.asked: list[int] = []

    def worth(self, n: int) -> bool:
        self.asked.append(len(self.observed))
        return next(self._script)

    def observe(self, n: int, emitted: int) -> None:
        self.observed.append((n, emitted))
        super().observe(n, emitted)


SCRIPTS = [(True,), (False,), (True, False), (False, False, True), (True, True, False)]


@pytest.fixture(scope="module")
def loaded(tiny_own_head: Path) -> tuple[Any, Any]:
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(tiny_own_head))
    return model, tokenizer


def prompt_tokens(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def plain_greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    steps = generate_step(
        mx.array(prompt), model, max_tokens=n, prompt_cache=make_prompt_cache(model)
    )
    return [int(token) for token, _ in steps]


def lookup(
    model: Any, prompt: list[int], n: int, pace: LookupPace | None, stop_after: int | None = None
):
    """Decode with prompt lookup; returns (steps, cache), closing after ``stop_after`` tokens."""
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    cache = make_prompt_cache(model)
    gen = prompt_lookup_steps(
        model,
        prompt,
        len(prompt),
        cache,
        max_draft=4,
        max_tokens=n,
        sampler=make_sampler(0.0),
        prefill_step_size=16,
        pace=pace,
    )
    steps = []
    for step in gen:
        steps.append(step)
        if stop_after is not None and len(steps) >= stop_after:
            break
    gen.close()
    return steps, cache


@pytest.mark.parametrize("script", SCRIPTS)
def test_greedy_tokens_equal_plain_decoding_whichever_steps_draft(loaded, script):
    from mlx_integrations.engine.cache.prefix_cache import cache_offset

    model, tokenizer = loaded
    drafted = accepted = plain = 0
    for messages in [*CHAT_PROMPTS, conversation("The quick brown fox. The quick brown fox.")]:
        prompt = prompt_tokens(tokenizer, messages)
        reference = plain_greedy(model, prompt, 40)
        for n in (1, 2, 7, 40):
            steps, cache = lookup(model, prompt, n, ScriptedPace(script))
            assert [t for t, _, _ in steps] == reference[:n], (script, n)
            # The cache holds the context but the last token (never fed, or dropped).
            assert cache_offset(cache) == len(prompt) + n - 1
            drafts = list(itertools.accumulate(d for _, d, _ in steps))
            kept = list(itertools.accumulate(int(a) for _, _, a in steps))
            assert all(k <= d for k, d in zip(kept, drafts, strict=True))
            drafted, accepted = drafted + drafts[-1], accepted + kept[-1]
            # Tokens past the first that no round drafted: plain steps.
            plain += sum(1 for _, d, a in steps[1:] if not d and not a)
    if True in script:
        assert accepted > 0  # rounds ran and kept drafts
    else:
        assert drafted == 0
    if False in script:
        assert plain > 0


@pytest.mark.parametrize("script", SCRIPTS)
def test_closed_anywhere_the_cache_holds_a_prefix_of_the_context(loaded, script):
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    from mlx_integrations.engine.cache.prefix_cache import cache_offset

    model, tokenizer = loaded
    prompt = prompt_tokens(tokenizer, CHAT_PROMPTS[1])
    closed_on_a_draft = 0
    for stop_after in range(1, 20):
        steps, cache = lookup(model, prompt, 40, ScriptedPace(script), stop_after)
        tokens = [t for t, _, _ in steps]
        held = cache_offset(cache)
        assert held == len(prompt) + len(tokens) - 1, stop_after  # all but the last
        closed_on_a_draft += steps[-1][2]  # drafts kept past it were in the cache
        # It holds that context: decoding on from it gives plain decoding's tokens.
        follow = generate_step(
            mx.array((prompt + tokens)[held:]), model, max_tokens=5, prompt_cache=cache
        )
        assert [int(t) for t, _ in follow] == plain_greedy(model, prompt + tokens, 5)
    assert closed_on_a_draft > 0 or True not in script


def test_a_skipped_round_is_counted_as_the_round_would_have_emitted(loaded):
    """A shadow round (tokens checked against drafts not verified) reports what the
    real round at the same point emits: for each of the first shadows of a run that
    never verifies, a run that verifies there instead (and nowhere else) observes the
    same ``(n, emitted)``."""
    model, tokenizer = loaded
    compared = 0
    for messages in [*CHAT_PROMPTS, conversation("The quick brown fox. The quick brown fox.")]:
        prompt = prompt_tokens(tokenizer, messages)
        never = ScriptedPace((False,))
        steps, _ = lookup(model, prompt, 48, never)
        assert all(drafted == 0 for _, drafted, _ in steps)
        # A shadow starts at a call where every earlier one has been observed.
        starts, shadows = [], 0
        for call, seen in enumerate(never.asked):
            if seen == shadows and shadows < len(never.observed):
                starts.append((call, seen))
                shadows += 1
        for call, seen in starts[:4]:
            there = ScriptedPace([i == call for i in range(len(never.asked) + 1)] + [False])
            lookup(model, prompt, 48, there)
            assert there.observed[: seen + 1] == never.observed[: seen + 1], (messages, call)
            compared += 1
    assert compared >= 6


def test_a_round_is_timed_first_then_a_plain_step():
    pace = LookupPace()
    assert pace.worth(3)  # nothing known: measure a round
    pace.timed("round", 0.03)
    assert not pace.worth(3)  # then a plain step
    pace.timed("pipelined", 0.01)
    assert pace.worth(3)  # a match length not seen yet is tried


def test_a_round_pays_where_its_match_is_followed_further_than_it_costs():
    pace = LookupPace()
    pace.timed("round", 0.03)  # a round costs three plain steps
    pace.timed("pipelined", 0.01)
    pace.observe(3, 6)
    pace.observe(1, 1)
    pace.observe(2, 2)
    assert pace.worth(3)
    assert not pace.worth(1)
    assert not pace.worth(2)  # two tokens for three steps' time
    for _ in range(10):  # 3-token matches stop being followed: rounds stop paying
        pace.observe(3, 1)
    assert not pace.worth(3)
    for _ in range(10):  # and 1-token ones start to be: rounds pay there
        pace.observe(1, 5)
    assert pace.worth(1)


def test_rounds_declined_many_times_in_a_row_are_tried_again():
    """A round timed in a busy moment must not rule rounds out for good."""
    pace = LookupPace(probe_every=8)
    pace.timed("round", 1.0)  # far slower than it will be
    pace.timed("pipelined", 0.01)
    pace.observe(3, 5)
    answers = [pace.worth(3) for _ in range(16)]
    assert answers.count(True) == 2 and answers[7] and answers[15]
    pace.timed("round", 0.02)  # the probe's own timing brings the figure back down
    for _ in range(12):
        pace.timed("round", 0.02)
    assert pace.worth(3)


def test_a_plain_step_nothing_ran_ahead_of_is_not_counted():
    pace = LookupPace()
    pace.timed("pipelined", 0.01)
    pace.timed("round", 0.05)
    pace.timed("step", 0.5)  # not pipelined: it waited for nothing ahead of it
    assert pace.step_s == pytest.approx(0.01)
    pace.timed("pipelined", 0.02)
    assert pace.step_s == pytest.approx(0.0125)


@pytest.mark.parametrize("script", [(True, False), (False, False, True)])
async def test_engines_stay_exact_over_turns_stops_and_cancellation(
    tiny_own_head, monkeypatch, script
):
    """SimpleEngine and a lone BatchedEngine request, with rounds and plain steps
    mixed: replies, stop strings, the next turn from the prefix cache, and a request
    cancelled mid-reply."""
    cycle = itertools.cycle(script)
    monkeypatch.setattr(LookupPace, "worth", lambda self, n: next(cycle))
    plain = SimpleEngine(tiny_own_head, cache_memory_mb=0)
    engines = [
        # All that is cached, on CUDA too (its default key step is longer than these prompts).
        SimpleEngine(tiny_own_head, prompt_lookup=4, prefix_key_step=1),
        BatchedEngine(tiny_own_head, prompt_lookup=4, prefix_key_step=1),
    ]
    try:
        for eng in engines:
            history = list(CHAT_PROMPTS[1])
            for turn in range(3):
                ref = await plain.chat(history, max_tokens=32, temperature=0)
                out = await eng.chat(history, max_tokens=32, temperature=0)
                assert out.tokens == ref.tokens, (type(eng).__name__, turn)
                if turn:
                    assert out.cached_tokens > 0
                history += [
                    {"role": "assistant", "content": out.text},
                    {"role": "user", "content": f"Again, turn {turn}: the lazy dog"},
                ]
            stop = ref.text[len(ref.text) // 2 : len(ref.text) // 2 + 3]
            stopped_ref = await plain.chat(history, max_tokens=32, temperature=0, stop=[stop])
            stopped = await eng.chat(history, max_tokens=32, temperature=0, stop=[stop])
            assert stopped.text == stopped_ref.text
            stream = eng.stream_chat(CHAT_PROMPTS[0], max_tokens=200, temperature=0)
            async for out in stream:
                if out.completion_tokens >= 5:
                    break
            await stream.aclose()
            again = await eng.chat(CHAT_PROMPTS[0], max_tokens=24, temperature=0)
            ref = await plain.chat(CHAT_PROMPTS[0], max_tokens=24, temperature=0)
            assert again.tokens == ref.tokens
    finally:
        for eng in [plain, *engines]:
            await eng.stop()


@pytest.mark.parametrize("script", [(True, False), (False, False, True)])
def test_a_lone_request_hands_over_to_the_batch_at_any_turn(loaded, script):
    from tests.engine.test_batched_solo import handoffs_match_alone

    model, tokenizer = loaded
    for messages in CHAT_PROMPTS[1:]:
        prompt = prompt_tokens(tokenizer, messages)
        handoffs_match_alone(
            model,
            prompt,
            24,
            range(1, 24),
            prefill_step_size=8,
            prompt_lookup=3,
            pace=ScriptedPace(script),
        )


async def test_seeded_sampling_drafts_by_its_tokens_alone(tiny_own_head, monkeypatch):
    """A seeded request's draws do not depend on timing: the pace is not asked."""
    asked: list[int] = []

    def worth(self, n: int) -> bool:
        asked.append(n)
        return False

    monkeypatch.setattr(LookupPace, "worth", worth)
    eng = SimpleEngine(tiny_own_head, prompt_lookup=4)
    try:
        runs = [
            await eng.chat(CHAT_PROMPTS[1], max_tokens=32, temperature=0.8, seed=3)
            for _ in range(2)
        ]
        assert runs[0].tokens == runs[1].tokens and runs[0].mtp_drafts > 0
        assert asked == []
        await eng.chat(CHAT_PROMPTS[1], max_tokens=8, temperature=0)
        assert asked  # an unseeded request asks
    finally:
        await eng.stop()


@pytest.mark.smollm
async def test_smollm2_drafts_where_its_reply_quotes_and_hardly_elsewhere(
    smollm2_path, monkeypatch
):
    """With a round costing two plain steps (fixed, so the choice does not depend on this
    machine's speed): a reply quoting a passage is mostly drafted and kept, a story
    is decoded plainly but for the rounds that measure; replies equal plain decoding."""
    timed = LookupPace.timed
    monkeypatch.setattr(
        LookupPace, "timed", lambda self, round_, s: timed(self, round_, 2.0 if round_ else 1.0)
    )
    story = [{"role": "user", "content": "Write a short story about a dragon who bakes bread."}]
    plain = SimpleEngine(smollm2_path, cache_memory_mb=0)
    fast = SimpleEngine(smollm2_path, cache_memory_mb=0, prompt_lookup=8)
    try:
        for messages in (RAG_MESSAGES, story):
            ref = await plain.chat(messages, max_tokens=60, temperature=0)
            out = await fast.chat(messages, max_tokens=60, temperature=0)
            assert out.tokens == ref.tokens
            if messages is RAG_MESSAGES:
                assert out.mtp_accepted >= 0.7 * out.mtp_drafts
                assert out.mtp_accepted >= 0.5 * out.completion_tokens, out.text
            else:
                assert out.mtp_drafts <= 4 * 8, out.text  # a few measuring rounds
    finally:
        await plain.stop()
        await fast.stop()
