"""Drafting in a shared batch keeps the model's distribution: a goodness-of-fit test.

Four requests share ``BatchedEngine``'s batch in every round: three whose prompt ends
like an earlier turn, so that when the model starts its reply as that turn did, prompt
lookup drafts the rest (two sampled at temperature 1, sharing one sampler with the
fourth, a prompt without such a turn; one at temperature 0.7, a sampler of its own).
Every step where rows have drafts goes wide. The first three tokens of each reply
(``top_k=3``; the second and third are the drafted positions, where a row samples at
every position and keeps its drafts up to the first sample that differs) are compared,
by a chi-square statistic, with their exact distribution computed from the model's
logits. The owner thread's random state is seeded, so the outcome does not change from
run to run; the bound is far above the statistic's usual range, and far below what
drafts kept without checking give (their tokens would follow every drafted first token).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from mlx_integrations.engine import BatchedEngine
from tests.support.batch_drafting import record_wide_steps
from tests.support.prompts import conversation
from tests.support.sampling_fit import bound, chi_square, next_token_probs, sequence_probs

ROUNDS = 150
TOP_K = 3
LENGTH = 3
# Each round's requests: (prompt, temperature).
ROWS = [("echo", 1.0), ("echo", 1.0), ("plain", 1.0), ("echo", 0.7)]

Messages = list[dict[str, str]]


@pytest.fixture(scope="module")
def target(tiny_own_head: Path) -> Path:
    return tiny_own_head


@pytest.fixture(scope="module")
def setting(target: Path) -> tuple[dict[str, Messages], dict, dict[int, list[int]]]:
    """The prompts, the exact distribution of each row kind's first ``LENGTH`` tokens,
    and the drafts prompt lookup gives the echo prompt after each possible first token.
    """
    import mlx_lm

    from mlx_integrations.engine.speculative.prompt_lookup import NgramIndex

    model, tokenizer = mlx_lm.load(str(target))

    def render(messages: Messages) -> list[int]:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    # The earlier reply is what the model says next after the prompt it ends: taken from
    # greedy continuations until it stays the same.
    reply = "Hello"
    for _ in range(8):
        prompt = render(conversation(reply))
        tokens: list[int] = []
        for _ in range(LENGTH):
            probs = next_token_probs(model, [*prompt, *tokens], TOP_K)
            tokens.append(max(probs, key=probs.__getitem__))
        if tokenizer.decode(tokens) == reply:
            break
        reply = tokenizer.decode(tokens)
    messages = {"echo": conversation(reply), "plain": [{"role": "user", "content": reply}]}
    prompt = render(messages["echo"])
    first = next_token_probs(model, prompt, TOP_K)
    drafts = {a: NgramIndex([*prompt, a]).propose(LENGTH - 1) for a in first}
    exact = {
        (kind, temp): sequence_probs(model, render(messages[kind]), LENGTH, TOP_K, temp)
        for kind, temp in set(ROWS)
    }
    eos = set(tokenizer.eos_token_ids)
    assert not any(eos & set(seq) for probs in exact.values() for seq in probs)
    return messages, exact, drafts


def pairs_of(probs: dict[tuple[int, ...], float]) -> dict[tuple[int, ...], float]:
    out: dict[tuple[int, ...], float] = {}
    for seq, p in probs.items():
        out[seq[:2]] = out.get(seq[:2], 0.0) + p
    return out


def test_drafting_in_a_shared_batch_follows_the_models_distribution(target, setting, monkeypatch):
    import mlx.core as mx

    messages, exact, drafts = setting
    steps = record_wide_steps(monkeypatch)

    async def run() -> tuple[dict[tuple[str, float], list[tuple[int, ...]]], dict]:
        eng = BatchedEngine(target, prompt_lookup=4, cache_memory_mb=0)
        eng.prepare_for_start()
        assert eng._executor is not None
        # Unseeded rows draw from the random state of the thread that steps the batch.
        eng._executor.submit(mx.random.seed, 0).result()
        samples: dict[tuple[str, float], list[tuple[int, ...]]] = {row: [] for row in ROWS}
        try:
            for _ in range(ROUNDS):
                outs = await asyncio.gather(
                    *[
                        eng.chat(messages[kind], max_tokens=LENGTH, temperature=t, top_k=TOP_K)
                        for kind, t in ROWS
                    ]
                )
                for row, out in zip(ROWS, outs, strict=True):
                    samples[row].append(tuple(out.tokens))
            return samples, dict(eng.get_stats())
        finally:
            await eng.stop()

    samples, stats = asyncio.run(run())
    # The rounds shared the batch, whose wide steps kept and cut drafts often (a row left
    # alone when the others end in a step goes on by itself).
    assert stats["peak_batch_size"] == len(ROWS)
    assert sum(steps.accepted) > ROUNDS // 4 and sum(steps.rejected) > ROUNDS // 4
    for row, seqs in samples.items():
        n = len(seqs)
        assert all(len(s) == LENGTH for s in seqs)
        stat, df = chi_square(Counter(s[:2] for s in seqs), pairs_of(exact[row]), n)
        assert df >= 2 and stat < bound(df), (row, "first two tokens", stat, df)
        stat, df = chi_square(Counter(seqs), exact[row], n)
        assert df >= 3 and stat < bound(df), (row, "first three tokens", stat, df)
    # What keeping every draft unchecked would give the echo rows at temperature 1: the
    # second token the draft's, after every first token that has one.
    pairs = pairs_of(exact[("echo", 1.0)])
    blind: dict[tuple[int, ...], float] = {}
    for (a, b), p in pairs.items():
        key = (a, drafts[a][0]) if drafts[a] else (a, b)
        blind[key] = blind.get(key, 0.0) + p
    n = len(samples[("echo", 1.0)])
    stat, df = chi_square(Counter({k: round(p * n) for k, p in blind.items()}), pairs, n)
    assert stat > 3 * bound(df), (stat, df)
