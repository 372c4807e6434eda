"""A draft model for the rows of BatchedEngine's shared batch: its cache stays in step.

On MLX's reference BLAS (a subprocess), every draft the batch's draft model proposes
must be what the draft model proposes on its own for that row's context, read from
scratch: rows joining, leaving, stepping plainly and keeping some of their drafts.
With the model itself as its draft (in this process, on OpenBLAS), a draft model whose cache holds exactly what each
row's context holds proposes what the model then picks: nearly every draft is kept (the
few that are not come from OpenBLAS rounding a wide step's logits differently in the
last bits, where two logits nearly tie). A draft cache that lost step with its row
(a joining row read wrongly, the tokens of plain steps not read, a rejected position
left in) proposes from the wrong context, and acceptance falls. Exactness of the replies
for both draft sources is in tests/engine/test_batched_speculation.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mlx_integrations.engine import BatchedEngine
from tests.support.batch_drafting import record_wide_steps
from tests.support.event_loop import wait_until
from tests.support.prompts import BRIEF, FOX
from tests.support.reference_blas import in_reference_blas
from tests.support.tiny_models import noisy_copy

PROMPTS = [
    FOX,
    [{"role": "user", "content": "What is the weather in Paris? It is sunny in Paris."}],
    BRIEF,
]


@pytest.fixture(scope="module")
def target(tiny_own_head: Path) -> Path:
    return tiny_own_head


FREE = [(m, {"max_tokens": 96}) for m in PROMPTS[:2]]
CONSTRAINED = [(PROMPTS[0], {"max_tokens": 20, "logit_bias": {118: -1.0 - i}}) for i in range(3)]
LATE = (PROMPTS[2], {"max_tokens": 48})


async def serve(engine: BatchedEngine, wait: bool) -> list:
    """Two free rows beside three constrained ones: fewer than half the rows can draft,
    so the batch steps plainly until the constrained rows end; then the free rows draft
    with many tokens the draft model has not read. A third free row joins after 30
    steps (``wait``) and drafts beside them."""
    first = asyncio.gather(*[engine.chat(m, temperature=0, **kw) for m, kw in FREE + CONSTRAINED])
    if wait:
        await wait_until(
            lambda: engine.get_stats()["steps_executed"] > 30, "30 steps", timeout=120.0
        )
    joined = await engine.chat(LATE[0], temperature=0, **LATE[1])
    return [*(await first), joined]


def check_proposals(target: str, draft: str) -> None:
    """Each proposal of the batch's draft model equals the draft model's greedy
    continuation of the row's context computed alone, from an empty cache."""
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.models.cache import make_prompt_cache

    from mlx_integrations.engine.batched import draft_model as batch_draft
    from mlx_integrations.engine.speculative.pace import StepPace

    StepPace.wide = lambda self: True  # type: ignore[method-assign]
    model, _ = mlx_lm.load(draft)
    propose = batch_draft.BatchDrafter.propose
    checked: list[int] = []

    def alone(context: list[int], count: int) -> list[int]:
        cache = make_prompt_cache(model)
        logits = model(mx.array(context, mx.uint32)[None], cache=cache)
        out = [int(mx.argmax(logits[0, -1]).item())]
        while len(out) < count:
            logits = model(mx.array([out[-1]], mx.uint32)[None], cache=cache)
            out.append(int(mx.argmax(logits[0, -1]).item()))
        return out

    def checking(self, batch, pending, limits):
        contexts = [[*t, p] for t, p in zip(batch.tokens, pending, strict=True)]
        drafts = propose(self, batch, pending, limits)
        for context, got, limit in zip(contexts, drafts, limits, strict=True):
            if limit:
                assert got == alone(context, self.num_draft)[:limit], (len(context), got)
                checked.append(limit)
        return drafts

    batch_draft.BatchDrafter.propose = checking  # type: ignore[method-assign]

    async def run() -> None:
        plain = BatchedEngine(target, cache_memory_mb=0)
        eng = BatchedEngine(target, draft_model=draft, num_draft_tokens=3, cache_memory_mb=0)
        try:
            refs = await serve(plain, wait=False)
            outs = await serve(eng, wait=True)
            rate = eng.get_stats()["speculative"]["acceptance_rate"]
        finally:
            await plain.stop()
            await eng.stop()
        assert [o.tokens for o in outs] == [r.tokens for r in refs]
        assert len(checked) > 40
        assert 0.05 < rate < 0.95  # rows keep some drafts and reject others

    asyncio.run(run())


def test_on_the_reference_blas_every_draft_is_the_draft_models_own(
    target: Path, tmp_path: Path
) -> None:
    draft = noisy_copy(target, tmp_path / "draft")
    in_reference_blas(__name__, f"check_proposals({str(target)!r}, {str(draft)!r})")


async def test_with_itself_as_draft_nearly_every_draft_is_kept(
    target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wide = record_wide_steps(monkeypatch)
    plain = BatchedEngine(target, cache_memory_mb=0)
    eng = BatchedEngine(target, draft_model=str(target), num_draft_tokens=3, cache_memory_mb=0)
    try:
        refs = await serve(plain, wait=False)
        outs = await serve(eng, wait=True)
        stats = eng.get_stats()
    finally:
        await plain.stop()
        await eng.stop()
    assert [o.tokens for o in outs] == [r.tokens for r in refs]
    assert all(r.completion_tokens == 20 for r in refs[2:5])  # they end before the free rows
    assert stats["peak_batch_size"] >= 5
    spec = stats["speculative"]
    assert spec["mode"] == "draft_model" and sum(wide.accepted) > 0
    assert spec["drafted_tokens"] > 100
    assert spec["acceptance_rate"] >= 0.95, spec
    assert all(o.mtp_drafts == 0 for o in outs[2:5])  # constrained rows never draft
    assert stats["speculation_off_requests"] == 3


def drafter_rows(engine: BatchedEngine) -> tuple[list[int], bool]:
    """The rows the batch's draft model keeps a cache for, and whether it holds one
    (read once the engine is idle: the owner thread is not stepping)."""
    drafter = engine._spec._drafter
    assert drafter is not None
    return list(drafter._uids), drafter._cache is not None


@pytest.mark.parametrize("last", ["alone", "aborted"])
async def test_the_draft_cache_goes_with_the_batch(
    target: Path, monkeypatch: pytest.MonkeyPatch, last: str
) -> None:
    """Once the batch is empty the draft model holds no row: not while the last row
    decodes alone (it left by generator.remove, with no step of the batch after), nor
    once a constrained row, which never goes on alone, is aborted (generator.remove
    again) or ends."""
    wide = record_wide_steps(monkeypatch)
    eng = BatchedEngine(target, draft_model=str(target), num_draft_tokens=3, cache_memory_mb=0)
    try:
        kw = {} if last == "alone" else {"logit_bias": {118: -1.0}}
        stream = eng.stream_chat(PROMPTS[0], max_tokens=80, temperature=0, **kw)
        short = asyncio.ensure_future(eng.chat(PROMPTS[1], max_tokens=12, temperature=0))
        async for _ in stream:
            if short.done():
                break
        await short
        if last == "aborted":
            await stream.aclose()
        else:
            async for _ in stream:
                pass
        await wait_until(
            lambda: eng.get_stats()["num_running"] == 0, "the engine is idle", timeout=120.0
        )
        assert sum(wide.accepted) > 0  # the draft model drafted in the batch
        assert drafter_rows(eng) == ([], False)
        if last == "alone":
            assert eng.get_stats()["solo_requests"] >= 1
    finally:
        await eng.stop()


async def test_a_wide_step_is_timed_without_the_draft_models_prefill(
    target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row's context is read by the draft model once, in the first wide step after it
    joined; that one-off cost is not what a wide step costs, so the step pace leaves it
    out (else the first wide step of every batch, which reads every row, makes wide
    steps look slow and probes of them rare). The draft model's prefill is made to take
    1000 s of a shifted clock; the wide steps' time must not include it."""
    import time

    from mlx_integrations.engine.batched import draft_model as batch_draft

    record_wide_steps(monkeypatch)
    shift = [0.0]
    real_clock, real_prefill = time.perf_counter, batch_draft.prefill

    def slow_prefill(*args, **kwargs):
        real_prefill(*args, **kwargs)
        shift[0] += 1000.0

    monkeypatch.setattr(time, "perf_counter", lambda: real_clock() + shift[0])
    monkeypatch.setattr(batch_draft, "prefill", slow_prefill)
    eng = BatchedEngine(target, draft_model=str(target), num_draft_tokens=3, cache_memory_mb=0)
    try:
        await asyncio.gather(
            *[eng.chat(m, temperature=0, max_tokens=24) for m in PROMPTS[:2]],
        )
        pace = eng._spec.pace
    finally:
        await eng.stop()
    assert shift[0] >= 2000.0  # both rows were read by the draft model
    assert pace.step_s[True] is not None and pace.step_s[True] < 100.0, pace.step_s


@pytest.mark.parametrize("source", ["draft_model", "prompt_lookup"])
async def test_stop_frees_the_models(target: Path, source: str) -> None:
    """Once the engine stops, neither the model nor the draft model is held by what
    the batch's speculation remembers of them (whether the model's cache can roll back)."""
    import gc
    import weakref

    kw = {"draft_model": str(target)} if source == "draft_model" else {"prompt_lookup": 4}
    eng = BatchedEngine(target, cache_memory_mb=0, **kw)
    await asyncio.gather(*[eng.chat(m, temperature=0, max_tokens=8) for m in PROMPTS[:2]])
    models = [weakref.ref(m) for m in (eng._model, eng._draft.model) if m is not None]
    await eng.stop()
    gc.collect()
    assert [m() for m in models] == [None] * len(models)
