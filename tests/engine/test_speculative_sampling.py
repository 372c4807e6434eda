"""Sampling with speculation keeps the model's distribution: a goodness-of-fit test.

The prompt repeats an earlier assistant reply, so drafts are proposed from the very
first token. Many two-token samples (``top_k=3`` at temperature 1, seeds 0..N-1) are
drawn with and without speculation and compared, by a chi-square statistic, with the
exact distribution of the first token and of the pair, computed from the model's
logits. The seeds are fixed, so the outcome does not change from run to run; the bound
is far above the statistic's usual range, and far below what drafts accepted without
checking give (they pin the first token to the draft's).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from mlx_integrations.engine import BatchedEngine, SimpleEngine
from tests.support.prompts import conversation
from tests.support.sampling_fit import bound, chi_square, next_token_probs

SAMPLES = 200
TOP_K = 3


@pytest.fixture(scope="module")
def target(tiny_own_head: Path) -> Path:
    return tiny_own_head


@pytest.fixture(scope="module")
def setting(target: Path) -> tuple[list[dict[str, str]], int, dict[tuple[int, int], float]]:
    """A conversation whose drafted first token the model gives a fair chance.

    Returns the messages, the first token prompt lookup drafts, and the model's exact
    probability of each pair of first two tokens (``top_k=3``, temperature 1).
    """
    import mlx_lm

    from mlx_integrations.engine.speculative.prompt_lookup import NgramIndex

    model, tokenizer = mlx_lm.load(str(target))

    def next_probs(tokens: list[int]) -> dict[int, float]:
        return next_token_probs(model, tokens, TOP_K)

    # The earlier reply is the next turn's draft: pick one the model may well repeat.
    words = sorted({w.lstrip("\u0120") for w in tokenizer.vocab if w.lstrip("\u0120").isalpha()})
    for word in words:
        messages = conversation(f"{word} {word}")
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        drafts = NgramIndex(prompt).propose(1)
        if drafts and 0.3 < next_probs(prompt).get(drafts[0], 0.0) < 0.7:
            break
    else:
        pytest.fail("no reply the model repeats with a fair chance")
    joint = {
        (a, b): pa * pb
        for a, pa in next_probs(prompt).items()
        for b, pb in next_probs([*prompt, a]).items()
    }
    return messages, drafts[0], joint


async def draw(engine, messages, n: int) -> tuple[list[tuple[int, int]], int]:
    pairs, accepted = [], 0
    for seed in range(n):
        out = await engine.chat(messages, max_tokens=2, temperature=1.0, top_k=TOP_K, seed=seed)
        pairs.append(tuple(out.tokens))
        accepted += out.mtp_accepted
    return pairs, accepted


@pytest.mark.parametrize("kind", ["simple", "batched", "simple_draft"])
def test_speculative_sampling_follows_the_models_distribution(target, setting, kind):
    messages, draft, joint = setting
    first: dict[int, float] = {}
    for (a, _), p in joint.items():
        first[a] = first.get(a, 0.0) + p

    async def run() -> dict[str, tuple[list[tuple[int, int]], int]]:
        engines = {
            "off": SimpleEngine(target, cache_memory_mb=0),
            "on": {
                "simple": lambda: SimpleEngine(target, prompt_lookup=4, cache_memory_mb=0),
                "batched": lambda: BatchedEngine(target, prompt_lookup=4, cache_memory_mb=0),
                "simple_draft": lambda: SimpleEngine(
                    target, draft_model=str(target), num_draft_tokens=2, cache_memory_mb=0
                ),
            }[kind](),
        }
        try:
            return {name: await draw(eng, messages, SAMPLES) for name, eng in engines.items()}
        finally:
            for eng in engines.values():
                await eng.stop()

    results = asyncio.run(run())
    assert results["on"][1] > SAMPLES // 4  # drafts were accepted, often
    for name, (pairs, _) in results.items():
        assert all(len(p) == 2 for p in pairs)
        stat, df = chi_square(Counter(a for a, _ in pairs), first, SAMPLES)
        assert df >= 1 and stat < bound(df), (name, "first token", stat, df)
        stat, df = chi_square(Counter(pairs), joint, SAMPLES)
        assert df >= 2 and stat < bound(df), (name, "pair", stat, df)
    # What accepting every draft unchecked would give: the draft first, every time.
    blind = Counter({draft: SAMPLES})
    assert chi_square(blind, first, SAMPLES)[0] > 3 * bound(len(first))
