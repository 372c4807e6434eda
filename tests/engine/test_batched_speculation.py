"""Speculation for requests that share BatchedEngine's batch: greedy tokens are exact.

Every request in a shared batch must get, token for token, what the same requests get
with speculation off: across stop strings, max_tokens, a request cancelled mid-draft,
requests joining and leaving, and constrained or seeded requests beside drafting ones.
Each test runs for both draft sources: prompt lookup, and a draft model (a copy of the
model with noise on its output head, so it agrees on some tokens and not others).
The model has its own output head (``tie_word_embeddings=False``), so greedy replies
vary and repeat n-grams of the prompt: drafts are accepted (each test checks that wide
batch steps accepted drafts, ``batch_accepted``, so none passes without speculating in
the batch).

Why equality holds (float32 on MLX's CPU backend): a speculative step feeds a row
``[pending, drafts..., padding]`` where a plain step feeds ``[pending]``. With MLX's
reference BLAS each matrix product accumulates every output over K in order whatever
the number of rows, and a masked key adds an exact 0 to the attention sums, so the
logits of the positions a row keeps are bit for bit those of one-token steps, and
argmax must pick the same token (checked there, in a subprocess:
tests/support/reference_blas.py).
The OpenBLAS that ``mlx_integrations`` preloads on Linux picks kernels by shape, so
there a wide step's logits differ in the last bits (about 6e-7 on the tiny model); the
tests in this process check that greedy tokens are still equal, which holds while no
two top logits are that close.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mlx_integrations.engine import BatchedEngine, SimpleEngine
from tests.support.event_loop import wait_until
from tests.support.prompts import BRIEF, FOX
from tests.support.reference_blas import in_reference_blas
from tests.support.tiny_models import noisy_copy

# Replies that copy their prompt: drafts are found and accepted.
PROMPTS = [
    FOX,
    [{"role": "user", "content": "What is the weather in Paris? It is sunny in Paris."}],
    [
        {
            "role": "user",
            "content": "The capital of France is Paris. The capital of Italy is Rome. The",
        }
    ],
    BRIEF,
]


@pytest.fixture(scope="module")
def target(tiny_own_head: Path) -> Path:
    return tiny_own_head


@pytest.fixture(scope="module")
def plain(target: Path):
    """The same engine with speculation off."""
    eng = BatchedEngine(target, cache_memory_mb=0)
    yield eng
    asyncio.run(eng.stop())


@pytest.fixture(scope="module")
def draft(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return noisy_copy(target, tmp_path_factory.mktemp("noisy") / "draft")


@pytest.fixture(params=["prompt_lookup", "draft_model"])
def source(request: pytest.FixtureRequest, draft: Path) -> dict:
    """The options of one draft source."""
    if request.param == "prompt_lookup":
        return {"prompt_lookup": 4}
    return {"draft_model": str(draft), "num_draft_tokens": 3}


@pytest.fixture
def spec(target: Path, source: dict):
    eng = BatchedEngine(target, cache_memory_mb=0, **source)
    yield eng
    asyncio.run(eng.stop())


@pytest.fixture(scope="module")
def simple(target: Path):
    """One request at a time, plainly: the reference where arrival times differ."""
    eng = SimpleEngine(target, cache_memory_mb=0)
    yield eng
    asyncio.run(eng.stop())


@pytest.fixture
def batch_accepted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Drafts accepted in each wide batch step (not a request's lone decoding).

    Every step where enough rows can draft goes wide: otherwise timing picks the kind
    of step (``StepPace``, tested on its own below), and which steps go wide would
    depend on the machine's speed. Tokens must be exact either way.
    """
    from tests.support.batch_drafting import record_wide_steps

    return record_wide_steps(monkeypatch).accepted


async def together(eng, requests: list[tuple[list[dict], dict]]):
    """The requests sent at once (one asyncio.gather: prefilled and decoded together)."""
    return await asyncio.gather(*[eng.chat(m, temperature=0, **kw) for m, kw in requests])


async def wait_idle(eng) -> None:
    await wait_until(
        lambda: eng.get_stats()["num_running"] == 0, "the engine is idle", timeout=120.0
    )


def check_wide_step(target: str) -> None:
    """The premise of exactness: positions fed together in a padded batch, after rows
    dropped different numbers of positions, equal bit for bit those fed one at a time."""
    import copy

    import mlx.core as mx
    import mlx_lm
    from mlx_lm.generate import _merge_caches
    from mlx_lm.models.cache import make_prompt_cache

    from mlx_integrations.engine.batched.kv_cache import roll_back_rows

    model, _ = mlx_lm.load(target)
    caches = []
    for n in (37, 20, 55, 9):
        cache = make_prompt_cache(model)
        model(mx.arange(5, 5 + n)[None], cache=cache)
        mx.eval([c.state for c in cache])
        caches.append(cache)
    feed = mx.array([[7, 8, 9, 10, 11], [12, 13, 14, 15, 16], [7, 9, 11, 13, 15], [3, 4, 5, 6, 7]])
    kept = [2, 5, 1, 3]  # positions each row keeps of a first wide step

    def batch():
        return _merge_caches([copy.deepcopy(c) for c in caches])

    # One token per step (a row past its kept positions goes on with the next input).
    narrow, step_logits = batch(), []
    for j in range(5):
        step_logits.append(model(feed[:, j : j + 1], cache=narrow)[:, 0])
    narrow_logits = mx.stack(step_logits, axis=1)
    wide = batch()
    wide_logits = model(feed, cache=wide)
    assert mx.array_equal(wide_logits, narrow_logits)
    # Drop each row's rejected positions, then feed every row what follows its kept ones.
    roll_back_rows(wide, [5 - k for k in kept])
    again = mx.array([[20 + r, 1, 2] for r in range(len(kept))])
    after_wide = model(again, cache=wide)
    rows = []
    for r, k in enumerate(kept):
        cache = copy.deepcopy(caches[r])
        for j in range(k):
            model(feed[r : r + 1, j : j + 1], cache=cache)
        rows.append(model(again[r : r + 1], cache=cache)[0])
    assert mx.array_equal(after_wide, mx.stack(rows))


def check_shared_batch(target: str, draft: str) -> None:
    """Greedy tokens of requests sharing a batch, speculation off, by prompt lookup and
    by a draft model (every step that can draft goes wide, as with ``batch_accepted``)."""
    from mlx_integrations.engine.speculative.pace import StepPace

    StepPace.wide = lambda self: True  # type: ignore[method-assign]

    async def run() -> None:
        sources: list[dict] = [{}, {"prompt_lookup": 4}, {"draft_model": draft}]
        engines = [BatchedEngine(target, cache_memory_mb=0, **kw) for kw in sources]
        requests = [(m, {"max_tokens": 64}) for m in PROMPTS]
        requests += [(PROMPTS[i % 3], {"max_tokens": n}) for i, n in enumerate((1, 3, 8))]
        try:
            refs, *outs = [await together(eng, requests) for eng in engines]
            steps = [eng.get_stats()["steps_executed"] for eng in engines]
        finally:
            for eng in engines:
                await eng.stop()
        for drafted, step_count in zip(outs, steps[1:], strict=True):
            assert [o.tokens for o in drafted] == [r.tokens for r in refs]
            assert sum(o.mtp_accepted for o in drafted) > 0
            assert step_count < steps[0]  # drafts were accepted in batch steps

    asyncio.run(run())


def test_a_wide_step_gives_the_logits_of_one_token_steps(target):
    in_reference_blas(__name__, f"check_wide_step({str(target)!r})")


def test_on_the_reference_blas_a_shared_batch_is_exact(target, draft):
    in_reference_blas(__name__, f"check_shared_batch({str(target)!r}, {str(draft)!r})")


@pytest.mark.parametrize("max_tokens", [24, 64])
async def test_a_shared_batch_decodes_the_tokens_of_plain_decoding(
    plain, spec, source, batch_accepted, max_tokens
):
    requests = [(m, {"max_tokens": max_tokens}) for m in PROMPTS]
    refs = await together(plain, requests)
    before = spec.get_stats()
    outs = await together(spec, requests)
    after = spec.get_stats()
    for out, ref in zip(outs, refs, strict=True):
        assert out.tokens == ref.tokens
        assert out.text == ref.text and out.finish_reason == ref.finish_reason
        assert out.mtp_accepted <= out.mtp_drafts
    assert sum(o.mtp_accepted for o in outs) > 0 and sum(batch_accepted) > 0
    assert after["speculation_off_requests"] == before["speculation_off_requests"]
    rate = after["speculative"]
    assert rate["mode"] == next(iter(source)) and rate["drafted_tokens"] > 0
    assert rate["acceptance_rate"] == pytest.approx(
        rate["accepted_tokens"] / rate["drafted_tokens"]
    )


async def test_stop_strings_and_max_tokens_end_where_plain_decoding_does(
    plain, spec, batch_accepted
):
    (long_ref,) = await together(plain, [(PROMPTS[0], {"max_tokens": 48})])
    stop = long_ref.text[len(long_ref.text) // 2 : len(long_ref.text) // 2 + 3]
    assert stop.strip(), long_ref.text
    requests = [(PROMPTS[0], {"max_tokens": 48, "stop": [stop]})]
    requests += [(PROMPTS[i % 3], {"max_tokens": n}) for i, n in enumerate((1, 2, 3, 5, 8, 13))]
    requests += [(PROMPTS[2], {"max_tokens": 40})]
    refs = await together(plain, requests)
    outs = await together(spec, requests)
    for out, ref, (_, kw) in zip(outs, refs, requests, strict=True):
        assert out.tokens == ref.tokens, kw
        assert out.text == ref.text and out.finish_reason == ref.finish_reason, kw
    assert outs[0].finish_reason == "stop" and stop not in outs[0].text
    for out, (_, kw) in zip(outs[1:7], requests[1:7], strict=True):
        assert out.completion_tokens == kw["max_tokens"] or out.finish_reason == "stop"
    assert sum(batch_accepted) > 0


async def test_a_request_cancelled_mid_draft_leaves_the_batch_exact(
    target, source, simple, batch_accepted
):
    eng = BatchedEngine(target, prefix_key_step=1, **source)  # all of its prefix cache
    try:
        pair = PROMPTS[1:3]
        refs = [(await simple.chat(m, max_tokens=200, temperature=0)).tokens for m in pair]
        others = asyncio.ensure_future(together(eng, [(m, {"max_tokens": 200}) for m in pair]))
        # Both decode in the batch before the third arrives.
        await wait_until(
            lambda: eng.get_stats()["steps_executed"] > 2, "the pair decodes", timeout=120.0
        )
        stream = eng.stream_chat(PROMPTS[0], max_tokens=200, temperature=0)
        async for out in stream:
            if out.mtp_accepted > 0:
                break  # right after a step that kept drafts of this row
        assert not others.done()  # it is cancelled inside the batch
        await stream.aclose()
        outs = await others
        assert [o.tokens for o in outs] == refs
        assert sum(batch_accepted) > 0
        await wait_idle(eng)
        assert eng.get_stats()["last_request"]["finish_reason"] in ("stop", "length")
        # Its KV cache went to the prefix cache with the cancelled request's tokens: the
        # same prompt again reuses it, in a batch again.
        again = await together(
            eng, [(PROMPTS[0], {"max_tokens": 40}), (PROMPTS[3], {"max_tokens": 40})]
        )
        for out, m in zip(again, (PROMPTS[0], PROMPTS[3]), strict=True):
            assert out.tokens == (await simple.chat(m, max_tokens=40, temperature=0)).tokens
        assert again[0].cached_tokens > 0
    finally:
        await eng.stop()


async def test_requests_joining_and_leaving_the_batch_stay_exact(spec, simple, batch_accepted):
    refs = {
        n: [(await simple.chat(m, max_tokens=n, temperature=0)).tokens for m in PROMPTS]
        for n in (5, 9, 200)
    }
    before = spec.get_stats()
    # Long enough that the short ones join while both run, however slow the machine.
    first = spec.stream_chat(PROMPTS[0], max_tokens=200, temperature=0)
    chunks = [await anext(first)]  # alone: it drafts outside the batch
    second = asyncio.ensure_future(spec.chat(PROMPTS[2], max_tokens=200, temperature=0))
    short = None
    async for out in first:
        chunks.append(out)
        if short is None and out.completion_tokens >= 12:
            # Two short requests join the running pair and leave before it ends.
            short = asyncio.gather(
                spec.chat(PROMPTS[1], max_tokens=5, temperature=0),
                spec.chat(PROMPTS[3], max_tokens=9, temperature=0),
            )
    assert chunks[-1].tokens == refs[200][0]
    assert (await second).tokens == refs[200][2]
    assert short is not None
    a, b = await short
    assert a.tokens == refs[5][1] and b.tokens == refs[9][3]
    stats = spec.get_stats()
    assert stats["peak_batch_size"] >= 3
    assert stats["solo_requests"] > before["solo_requests"]
    assert sum(batch_accepted) > 0


async def test_a_constrained_request_shares_the_batch_plainly(plain, spec, batch_accepted):
    seen: list[int] = []

    def record(tokens, logits):  # a caller's processor: it sees one more token each time
        seen.append(int(tokens.size))
        return logits

    constrained = [
        {"response_format": {"type": "json_object"}},
        {"logit_bias": {118: -100.0}},
        {"logits_processors": [record]},
    ]
    requests = [(PROMPTS[0], {"max_tokens": 32}), (PROMPTS[2], {"max_tokens": 32})]
    requests += [(PROMPTS[0], {"max_tokens": 32, **kw}) for kw in constrained]
    refs = await together(plain, requests)
    ref_seen, seen[:] = list(seen), []
    before = spec.get_stats()["speculation_off_requests"]
    outs = await together(spec, requests)
    for out, ref, (_, kw) in zip(outs, refs, requests, strict=True):
        assert out.tokens == ref.tokens, kw
    assert seen == ref_seen and len(seen) >= outs[-1].completion_tokens
    assert seen == list(range(seen[0], seen[0] + len(seen)))
    assert all(o.mtp_drafts == 0 for o in outs[2:])
    assert outs[0].mtp_accepted + outs[1].mtp_accepted > 0 and sum(batch_accepted) > 0
    assert spec.get_stats()["speculation_off_requests"] == before + len(constrained)


async def test_a_step_speculates_only_when_half_the_rows_can_draft(plain, spec, batch_accepted):
    # Three constrained rows decode; a free one joins them and ends first: never enough
    # drafting rows for a wide step.
    constrained = [
        (PROMPTS[0], {"max_tokens": 40, "logit_bias": {118: -1.0 - i}}) for i in range(3)
    ]
    free = (PROMPTS[0], {"max_tokens": 16})
    refs = await together(plain, [free, *constrained])
    assert all(r.completion_tokens == 40 for r in refs[1:])  # none ends before the free one
    running = asyncio.ensure_future(together(spec, constrained))
    await wait_until(
        lambda: spec.get_stats()["steps_executed"] > 1, "the constrained rows decode", timeout=120.0
    )
    outs = [await spec.chat(free[0], temperature=0, **free[1]), *(await running)]
    assert [o.tokens for o in outs] == [r.tokens for r in refs]
    assert batch_accepted == []  # not one wide step


async def test_sampled_rows_draft_and_seeded_rows_do_not(plain, spec, batch_accepted):
    # top_k=1: the sampler's path (one call per sampler, each row's positions) with a
    # deterministic pick, so the tokens must equal greedy decoding's.
    greedy = await together(plain, [(m, {"max_tokens": 32}) for m in PROMPTS[:3]])
    top1 = {"max_tokens": 32, "temperature": 0.7, "top_k": 1}
    outs = await asyncio.gather(*[spec.chat(m, **top1) for m in PROMPTS[:3]])
    assert [o.tokens for o in outs] == [g.tokens for g in greedy]
    assert sum(batch_accepted) > 0
    # A seeded request draws from its own key, one draw per step, whatever runs beside it.
    seeded = {"max_tokens": 32, "temperature": 0.8, "seed": 7}
    before = spec.get_stats()["speculation_off_requests"]
    runs = []
    for eng in (plain, spec):
        group = await asyncio.gather(
            eng.chat(PROMPTS[1], **seeded),
            *[eng.chat(m, max_tokens=32, temperature=0) for m in PROMPTS[:3:2]],
        )
        runs.append(group)
    assert runs[1][0].tokens == runs[0][0].tokens and runs[1][0].mtp_drafts == 0
    assert [o.tokens for o in runs[1][1:]] == [o.tokens for o in runs[0][1:]]
    assert spec.get_stats()["speculation_off_requests"] == before + 1


async def test_the_batch_cache_stays_as_long_as_its_longest_row(
    plain, spec, batch_accepted, monkeypatch: pytest.MonkeyPatch
):
    # Rows keep different numbers of drafts, and which row keeps the most changes from
    # step to step: without cutting the padding every row shares, the cache grows past
    # its longest row with each such step.
    from mlx_integrations.engine.batched import speculation as batch_spec

    roll_back = batch_spec.roll_back_rows
    extra: list[int] = []  # positions of the cache beyond its longest row, per wide step

    def measured(cache, drop):
        roll_back(cache, drop)
        extra.append(cache[0]._idx - max(cache[0].offset.tolist()))

    monkeypatch.setattr(batch_spec, "roll_back_rows", measured)
    requests = [(m, {"max_tokens": 160}) for m in PROMPTS * 2]
    refs = await together(plain, requests)
    outs = await together(spec, requests)
    assert [o.tokens for o in outs] == [r.tokens for r in refs]
    assert len(extra) > 10 and sum(batch_accepted) > 0
    assert max(extra) == 0, extra


def test_the_pace_goes_the_faster_way_and_probes_the_other():
    from mlx_integrations.engine.speculative.pace import StepPace

    def run(pace: StepPace, steps: int, tokens: dict[bool, int], seconds: float) -> list[bool]:
        kinds = []
        for _ in range(steps):
            wide = pace.wide()
            pace.record(wide, tokens[wide], seconds)
            kinds.append(wide)
        return kinds

    # Wide steps emit 3 tokens where plain ones emit 4, in the same time: plain wins.
    slow = run(StepPace(probe_every=8, run=3), 200, {True: 3, False: 4}, 0.01)
    assert slow[:3] == [True, False, False]  # each kind measured, wide first
    # Runs of 3 probes after every 8 plain steps.
    assert 0 < slow[4:].count(True) <= 3 * (len(slow[4:]) // 11 + 1)
    # Wide steps emit 20 tokens to plain's 4: wide wins, and plain is probed more rarely.
    fast = run(StepPace(probe_every=8, run=3), 200, {True: 20, False: 4}, 0.01)
    # A lead of 5 times: runs of 3 probes after every 8 * 5 wide steps.
    assert 0 < fast[4:].count(False) <= 3 * (len(fast[4:]) // 43 + 1)


def test_the_pace_keeps_costly_probes_to_a_small_share_of_the_time():
    from mlx_integrations.engine.speculative.pace import StepPace

    # A wide step takes 20 times a plain one and emits 3 times its tokens (a draft model
    # as large as the model): wide loses, and its probes must stay rare.
    pace, spent = StepPace(probe_every=8, run=3, probe_share=0.05), {True: 0.0, False: 0.0}
    for _ in range(3000):
        wide = pace.wide()
        seconds = 0.2 if wide else 0.01
        pace.record(wide, 12 if wide else 4, seconds)
        spent[wide] += seconds
    assert pace.rate[False] > pace.rate[True]  # type: ignore[operator]
    assert spent[True] / (spent[True] + spent[False]) < 0.08


def test_the_pace_measures_steps_that_can_draft_only_every_other_step():
    from mlx_integrations.engine.speculative.pace import StepPace

    # Rows have n-gram matches on every other step, so no two wide steps are adjacent;
    # a wide step emits 3 tokens in 1 s, a plain one 4 tokens in 10 ms.
    pace, kinds = StepPace(), []
    for step in range(400):
        wide = pace.wide() if step % 2 == 0 else False
        if step % 2 == 0:
            kinds.append(wide)
        pace.record(wide, 3 if wide else 4, 1.0 if wide else 0.01)
    assert pace.rate[True] is not None and pace.rate[False] is not None
    assert kinds.count(True) <= 3 * (len(kinds) // 32 + 1)  # plain, but for the probes
