"""The first token goes out before the second step starts, and decoding stays mlx-lm's.

Every decode loop of a request alone (``SimpleEngine``'s plain loop and prompt lookup,
``BatchedEngine``'s lone request) starts each step before reading the previous token,
as mlx-lm does, except for the reply's first token: it is read and handed out before
the second step is built and launched, which is where a host-bound device (a small
model on a GPU) would otherwise keep the first token back for a whole step. The order
is checked by counting the model's forward passes at each token handed out; the tokens
by comparing with mlx-lm's ``generate_step``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mlx_integrations.engine import BatchedEngine, SimpleEngine
from mlx_integrations.engine.batched.solo import SoloDecode
from mlx_integrations.engine.decoding import plain_steps
from mlx_integrations.engine.speculative.prompt_lookup import prompt_lookup_steps

STEP = 16  # prefill pieces of 16 tokens: a 40-token prompt takes three


class Counted:
    """The real model, counting its forward passes."""

    def __init__(self, model: Any):
        self.model = model
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.model(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


@pytest.fixture(scope="module")
def loaded(tiny_own_head: Path) -> tuple[Any, Any]:
    import mlx_lm

    return mlx_lm.load(str(tiny_own_head))


def distinct_prompt(n: int) -> list[int]:
    """``n`` different tokens: no n-gram repeats, so prompt lookup has nothing to draft."""
    return [(7 * i + 3) % 250 + 2 for i in range(n)]


def echo_prompt(model: Any) -> list[int]:
    """20 tokens and the model's own 20-token greedy reply to them: a repetition
    penalty over the last 20 tokens changes what it says next."""
    return distinct_prompt(20) + reference(model, distinct_prompt(20), 20)


def reference(
    model: Any,
    prompt: list[int],
    n: int,
    sampler: Callable[[Any], Any] | None = None,
    processors: list[Any] | None = None,
) -> list[int]:
    """mlx-lm's own loop over the whole prompt."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    steps = generate_step(
        mx.array(prompt),
        model,
        max_tokens=n,
        sampler=sampler,
        logits_processors=processors,
        prefill_step_size=STEP,
    )
    return [int(token) for token, _ in steps]


def plain(model: Any, prompt: list[int], n: int, **kwargs: Any) -> Iterator[tuple[int, int, bool]]:
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    cache = kwargs.pop("cache", None) or make_prompt_cache(model)
    kwargs.setdefault("sampler", make_sampler(0.0))
    kwargs.setdefault("processors", [])
    new_tokens = kwargs.pop("new_tokens", len(prompt))
    return plain_steps(
        model, prompt, new_tokens, cache, max_tokens=n, prefill_step_size=STEP, **kwargs
    )


@pytest.mark.parametrize("length", [1, 5, 40])
@pytest.mark.parametrize("n", [1, 2, 3, 17])
def test_plain_steps_give_generate_steps_tokens(loaded, length, n):
    model, _ = loaded
    prompt = distinct_prompt(length)
    assert [t for t, _, _ in plain(model, prompt, n)] == reference(model, prompt, n)


def test_sampled_tokens_and_processors_are_generate_steps_too(loaded):
    import mlx.core as mx
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    model, _ = loaded
    prompt = echo_prompt(model)
    processors = make_logits_processors({5: 3.0, 9: -100.0}, 1.3, 20)
    sampler = make_sampler(0.9, top_p=0.95)
    mx.random.seed(11)
    expected = reference(model, prompt, 24, sampler, processors)
    mx.random.seed(11)
    got = [t for t, _, _ in plain(model, prompt, 24, sampler=sampler, processors=processors)]
    assert got == expected
    # The penalty and the bias did act: sampling without them draws otherwise.
    mx.random.seed(11)
    assert got != reference(model, prompt, 24, sampler)


def test_processors_see_the_cached_part_of_the_prompt_too(loaded):
    """With part of the prompt in the cache already, the processors still see it all:
    a repetition penalty gives the reply of a prompt prefilled from scratch."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    model, _ = loaded
    prompt = echo_prompt(model)
    processors = make_logits_processors(None, 1.5, 20)
    expected = reference(model, prompt, 24, processors=processors)

    def cached() -> list[Any]:
        cache = make_prompt_cache(model)
        model(mx.array(prompt[:36])[None], cache=cache)
        return cache

    got = plain_steps(
        model,
        prompt,
        4,
        cached(),
        processors=processors,
        max_tokens=24,
        sampler=make_sampler(0.0),
        prefill_step_size=STEP,
    )
    assert [t for t, _, _ in got] == expected
    # mlx-lm's loop, given that cache and the 4 tokens left, shows its processors only
    # those 4 and the reply: the penalty misses the repeats, and the reply differs.
    partial = generate_step(
        mx.array(prompt[36:]),
        model,
        max_tokens=24,
        logits_processors=processors,
        prompt_cache=cached(),
    )
    assert [int(t) for t, _ in partial] != expected


@pytest.mark.parametrize("length", [5, 40])
def test_plain_steps_hand_out_the_first_token_before_the_second_step(loaded, length):
    from mlx_lm.models.cache import make_prompt_cache

    model, _ = loaded
    counted, cache = Counted(model), make_prompt_cache(model)
    prompt = distinct_prompt(length)
    pieces = -(-(length - 1) // STEP)  # prefill passes over all but the last token
    steps = plain(counted, prompt, 6, cache=cache)
    next(steps)
    assert counted.calls == pieces + 1  # the prefill, then the step that chose it
    next(steps)
    # The second token's step, then the third's, started before the second was read.
    assert counted.calls == pieces + 3
    rest = list(steps)
    assert len(rest) == 4
    # No step after the last token: the cache holds all but it.
    assert counted.calls == pieces + 6
    assert cache[0].offset == length + 6 - 1


def test_prompt_lookup_hands_out_the_first_token_before_the_second_step(loaded):
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    model, _ = loaded
    counted, cache = Counted(model), make_prompt_cache(model)
    prompt = distinct_prompt(40)
    steps = prompt_lookup_steps(
        counted,
        prompt,
        len(prompt),
        cache,
        max_draft=4,
        max_tokens=12,
        sampler=make_sampler(0.0),
        prefill_step_size=STEP,
    )
    first = next(steps)
    assert counted.calls == 3 + 1 and first[1] == 0  # three prefill pieces, one step
    tokens = [first[0], *(t for t, _, _ in steps)]
    assert tokens == reference(model, prompt, 12)


def test_a_lone_batched_request_hands_out_the_first_token_before_the_second_step(loaded):
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    model, _ = loaded
    counted = Counted(model)
    prompt = distinct_prompt(40)
    solo = SoloDecode(
        counted,
        prompt,
        0,
        make_prompt_cache(model),
        sampler=make_sampler(0.0),
        max_tokens=8,
        prefill_step_size=STEP,
    )
    tokens: list[int] = []
    calls_at: list[int] = []
    while len(tokens) < 8:
        for token, _, _ in solo.step():
            tokens.append(token)
            calls_at.append(counted.calls)
    assert tokens == reference(model, prompt, 8)
    # Three prefill pieces; the first token alone; later each token's step and the
    # next one's; no step after the last.
    assert calls_at == [4, 6, 7, 8, 9, 10, 11, 11]


def test_a_lone_request_handed_to_the_batch_after_its_first_token_loses_nothing(loaded):
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    model, _ = loaded
    prompt = distinct_prompt(40)
    solo = SoloDecode(
        model,
        prompt,
        0,
        make_prompt_cache(model),
        sampler=make_sampler(0.0),
        max_tokens=8,
        prefill_step_size=STEP,
    )
    first: list[int] = []
    while not first:
        first = [token for token, _, _ in solo.step()]
    steps, rest, cached = solo.handoff()
    assert steps == []  # nothing was computed beyond the token handed out
    assert rest == first and cached == prompt
    assert solo.cache[0].offset == len(prompt)


@pytest.mark.parametrize("engine_class", [SimpleEngine, BatchedEngine])
@pytest.mark.parametrize("lookup", [0, 4])
async def test_engines_reply_as_mlx_lm_over_turns(tiny_llama, engine_class, lookup):
    """Through the engines (prefix cache, chat template, several turns): greedy replies
    are mlx-lm's own, cold, whether or not prompt lookup is on."""
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(tiny_llama))
    engine = engine_class(tiny_llama, prompt_lookup=lookup)
    try:
        messages: list[dict[str, str]] = []
        for question in ("What is the weather in Paris?", "And in Rome?", "Say it again."):
            messages.append({"role": "user", "content": question})
            out = await engine.chat(messages, max_tokens=12, temperature=0)
            prompt = engine.render_prompt(messages)
            expected = reference(model, tokenizer.encode(prompt, add_special_tokens=False), 12)
            if out.finish_reason == "length":
                assert out.tokens == expected
            else:  # stopped at the end-of-sequence token, which it does not show
                assert out.tokens == expected[: len(out.tokens)]
                assert expected[len(out.tokens)] in tokenizer.eos_token_ids
            messages.append({"role": "assistant", "content": out.text})
    finally:
        await engine.stop()


@pytest.mark.parametrize("loop", ["plain", "prompt lookup", "lone batched request"])
def test_the_prefills_buffers_go_back_to_the_system_after_the_first_token(loaded, loop):
    """mlx-lm returns MLX's buffer pool after each prefill piece and the first token:
    a long prompt's attention buffers (17 MiB here) are not kept for the whole reply."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    model, _ = loaded
    prompt = distinct_prompt(1200)
    cache, greedy = make_prompt_cache(model), make_sampler(0.0)
    steps: Iterator[tuple[int, int, bool]]
    if loop == "plain":
        steps = plain_steps(
            model, prompt, len(prompt), cache, processors=[], max_tokens=4,
            sampler=greedy, prefill_step_size=256,
        )  # fmt: skip
    elif loop == "prompt lookup":
        steps = prompt_lookup_steps(
            model, prompt, len(prompt), cache, max_draft=4, max_tokens=4,
            sampler=greedy, prefill_step_size=256,
        )  # fmt: skip
    else:
        solo = SoloDecode(
            model, prompt, 0, cache, sampler=greedy, max_tokens=4, prefill_step_size=256
        )
        steps = (step for _ in range(20) for step in solo.step())  # prefill pieces first
    # The same pieces' buffers, kept: what the pool held before it was given back.
    mx.clear_cache()
    other = make_prompt_cache(model)
    for start in range(0, len(prompt), 256):
        model(mx.array(prompt[start : start + 256])[None], cache=other)
        mx.eval([c.state for c in other])
    kept = mx.get_cache_memory()
    mx.clear_cache()
    next(steps)
    next(steps)
    assert kept > 8 * 2**20
    assert mx.get_cache_memory() < kept / 10


@pytest.mark.parametrize("loop", ["plain", "prompt lookup"])
@pytest.mark.parametrize("stop", [1, 2, 5, 16, 17])
def test_a_reply_stopped_early_leaves_a_cache_the_next_turn_can_use(loaded, loop, stop):
    """Closed after its first tokens (a stop string, a cancelled request), the loop
    leaves a cache that holds a prefix of prompt + reply, and the next turn decoded
    from that cache says what a cold run of the whole context says."""
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    from mlx_integrations.engine.cache.prefix_cache import cache_offset

    model, _ = loaded
    prompt = (distinct_prompt(12) * 4)[:40]  # repeated n-grams: prompt lookup drafts
    cache, greedy = make_prompt_cache(model), make_sampler(0.0)
    if loop == "plain":
        steps = plain(model, prompt, 30, cache=cache)
    else:
        steps = prompt_lookup_steps(
            model, prompt, len(prompt), cache, max_draft=4, max_tokens=30,
            sampler=greedy, prefill_step_size=STEP,
        )  # fmt: skip
    reply = [token for token, _, _ in itertools.islice(steps, stop)]
    steps.close()
    assert reply == reference(model, prompt, stop)
    context = prompt + reply
    held = cache_offset(cache)
    assert len(prompt) <= held <= len(context)
    if loop == "prompt lookup":  # rejected and unread drafts are dropped
        assert held == len(context) - 1
    # A turn feeds at least its last token, as the prefix cache leaves it.
    trim_prompt_cache(cache, held - min(held, len(context) - 1))
    following = plain(
        model, context, 12, cache=cache, new_tokens=len(context) - cache_offset(cache)
    )
    assert [token for token, _, _ in following] == reference(model, context, 12)
