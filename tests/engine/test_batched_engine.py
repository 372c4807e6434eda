"""BatchedEngine on real (tiny, random) models: batching, joins, aborts, failures, caches."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from mlx_integrations.engine import BatchedEngine, EngineBusy, SimpleEngine
from tests.engine.test_simple_engine import BAD_CALLS, MESSAGES, forcing
from tests.support.event_loop import loop_ticks_while, wait_until

QUESTIONS = [
    "What is the weather in Paris?",
    "Hello!",
    "The capital of France is Paris. The capital of Italy is",
    "Call get_weather for Rome, in celsius please.",
    "Unicode: café, naïve, 東京",
    "0123456789 + - * /",
]


def convo(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


@pytest.fixture(scope="module")
def engine(tiny_llama: Path):
    eng = BatchedEngine(tiny_llama)
    yield eng
    asyncio.run(eng.stop())


@pytest.fixture(scope="module")
def reference(tiny_llama: Path):
    """SimpleEngine on the same model, without prefix cache: the one-by-one baseline."""
    eng = SimpleEngine(tiny_llama, cache_memory_mb=0)
    yield eng
    asyncio.run(eng.stop())


async def one_by_one(engine, calls: list[dict]) -> list[list[int]]:
    return [(await engine.chat(**call)).tokens for call in calls]


async def collect(stream):
    return [out async for out in stream]


@pytest.mark.parametrize("arch", ["tiny_llama", "tiny_qwen2"])
async def test_concurrent_greedy_equals_one_by_one(arch, request):
    # Prompts of different lengths: the batch is left-padded and masked. Greedy
    # tokens on these models come out identical; a float-noise flip of a near-tie
    # argmax would show here first.
    path = request.getfixturevalue(arch)
    batched = BatchedEngine(path)
    simple = SimpleEngine(path, cache_memory_mb=0)
    try:
        calls = [dict(messages=convo(q), max_tokens=24, temperature=0) for q in QUESTIONS]
        outs = await asyncio.gather(*[batched.chat(**c) for c in calls])
        expected = [await simple.chat(**c) for c in calls]
        assert [o.tokens for o in outs] == [e.tokens for e in expected]
        assert [o.text for o in outs] == [e.text for e in expected]
        assert len({tuple(e.tokens) for e in expected}) > 1  # the prompts lead different ways
        assert all(o.finished and o.completion_tokens == len(o.tokens) for o in outs)
        stats = batched.get_stats()
        assert stats["peak_batch_size"] >= 2  # they really ran together
        assert stats["num_requests_processed"] == len(calls)
        assert stats["num_running"] == stats["num_waiting"] == 0
    finally:
        await batched.stop()
        await simple.stop()


async def test_streamed_chunks_add_up(engine):
    chunks = await collect(engine.stream_chat(MESSAGES, max_tokens=24, temperature=0))
    last = chunks[-1]
    assert last.finished and all(not c.finished for c in chunks[:-1])
    assert "".join(c.new_text for c in chunks) == last.text
    prompt = engine.render_prompt(MESSAGES)
    assert last.prompt_tokens == len(engine.tokenizer.encode(prompt, add_special_tokens=False))


async def test_requests_sent_together_are_prefilled_and_decoded_together(tiny_llama, reference):
    eng = BatchedEngine(tiny_llama, cache_memory_mb=0)
    try:
        eos = next(iter(eng.tokenizer.eos_token_ids))
        calls = [
            dict(messages=convo(q), max_tokens=6, temperature=0, logit_bias={eos: -1e9})
            for q in QUESTIONS
        ]
        for _ in range(2):  # from an idle engine, then right after a batch ended
            before = eng.get_stats()["steps_executed"]
            outs = await asyncio.gather(*[eng.chat(**c) for c in calls])
            stats = eng.get_stats()
            # Six steps of six sequences: none prefilled or decoded apart from the others.
            assert stats["steps_executed"] - before == 6
            assert stats["batch_size"] == stats["peak_batch_size"] == len(calls)
            assert stats["solo_requests"] == 0
        assert [o.tokens for o in outs] == await one_by_one(reference, calls)
    finally:
        await eng.stop()


async def test_requests_join_a_running_batch(engine, reference):
    eos = next(iter(engine.tokenizer.eos_token_ids))
    long_call = dict(
        messages=convo(QUESTIONS[0]), max_tokens=120, temperature=0, logit_bias={eos: -1e9}
    )
    short_calls = [dict(messages=convo(q), max_tokens=8, temperature=0) for q in QUESTIONS[1:4]]
    order: list[str] = []
    long_chunks = []

    async def run_long():
        async for chunk in engine.stream_chat(**long_call):
            long_chunks.append(chunk)
        order.append("long")

    async def run_short(i, call):
        out = await engine.chat(**call)
        order.append(f"short{i}")
        return out

    long_task = asyncio.create_task(run_long())
    await wait_until(lambda: len(long_chunks) >= 5)
    shorts = await asyncio.gather(*[run_short(i, c) for i, c in enumerate(short_calls)])
    await long_task
    # The short ones joined while the long one decoded, and finished first.
    assert order[-1] == "long"
    assert long_chunks[-1].completion_tokens == 120
    assert [s.tokens for s in shorts] == await one_by_one(reference, short_calls)
    assert long_chunks[-1].tokens == (await reference.chat(**long_call)).tokens


async def test_abort_one_request_mid_batch_leaves_the_others_intact(engine, reference):
    calls = [dict(messages=convo(q), max_tokens=40, temperature=0) for q in QUESTIONS[:3]]
    calls[1].update(max_tokens=500, request_id="victim", logit_bias={7: 100.0})
    firsts: dict[int, asyncio.Event] = {i: asyncio.Event() for i in range(3)}

    async def run(i, call):
        chunks = []
        async for chunk in engine.stream_chat(**call):
            chunks.append(chunk)
            firsts[i].set()
        return chunks

    tasks = [asyncio.create_task(run(i, c)) for i, c in enumerate(calls)]
    await asyncio.gather(*[e.wait() for e in firsts.values()])
    assert await engine.abort_request("victim") is True
    results = await asyncio.gather(*tasks)
    victim = results[1][-1]
    assert victim.finish_reason == "abort" and victim.finished
    assert 1 <= victim.completion_tokens < 500
    assert await engine.abort_request("victim") is False  # gone now
    assert await engine.abort_request("never-seen") is False
    expected = await one_by_one(reference, [calls[0], calls[2]])
    assert [results[0][-1].tokens, results[2][-1].tokens] == expected


async def test_max_num_seqs_bounds_the_batch_and_queued_requests_can_be_aborted(
    tiny_llama, reference
):
    eng = BatchedEngine(tiny_llama, max_num_seqs=2)
    try:
        await eng.start()  # requests then reach the engine in the order they are made
        endless = dict(messages=MESSAGES, max_tokens=4000, temperature=0, logit_bias={7: 100.0})
        running = [asyncio.create_task(eng.chat(**endless, request_id=f"run{i}")) for i in range(2)]
        queued_call = dict(messages=convo(QUESTIONS[2]), max_tokens=6, temperature=0)
        queued = asyncio.create_task(eng.chat(**queued_call, request_id="queued"))
        dropped = asyncio.create_task(eng.chat(**queued_call, request_id="dropped"))
        await wait_until(lambda: eng.get_stats()["num_running"] == 2)
        await asyncio.sleep(0.05)
        stats = eng.get_stats()
        assert (stats["num_running"], stats["num_waiting"]) == (2, 2)
        assert await eng.abort_request("dropped") is True
        out = await dropped
        assert out.finish_reason == "abort" and out.completion_tokens == 0
        assert not queued.done()
        assert await eng.abort_request("run0") is True  # frees a place for "queued"
        done = await queued
        assert done.tokens == (await reference.chat(**queued_call)).tokens
        assert eng.get_stats()["peak_batch_size"] == 2
        await eng.abort_request("run1")
        outs = await asyncio.gather(*running)
        assert [o.finish_reason for o in outs] == ["abort", "abort"]
    finally:
        await eng.stop()


async def test_cancelled_and_closed_consumers_abort_their_requests(engine, reference):
    before = engine.get_stats()["num_requests_aborted"]
    keep_call = dict(messages=convo(QUESTIONS[3]), max_tokens=30, temperature=0)
    keeper = asyncio.create_task(engine.chat(**keep_call))
    got_one = asyncio.Event()

    async def consume():
        async for _ in engine.stream_chat(
            MESSAGES, max_tokens=5000, temperature=0, logit_bias={7: 100.0}
        ):
            got_one.set()

    task = asyncio.create_task(consume())
    stream = engine.stream_chat(MESSAGES, max_tokens=5000, temperature=0, logit_bias={7: 100.0})
    await stream.__anext__()
    await got_one.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await stream.aclose()
    await wait_until(lambda: engine.get_stats()["num_requests_aborted"] == before + 2)
    assert (await keeper).tokens == (await reference.chat(**keep_call)).tokens
    await wait_until(lambda: engine.get_stats()["num_running"] == 0)


async def test_failing_logits_processor_fails_only_its_request(engine, reference):
    calls = [dict(messages=convo(q), max_tokens=20, temperature=0) for q in QUESTIONS[:3]]
    seen = {"n": 0}

    def boom_later(tokens, logits):
        seen["n"] += 1
        if seen["n"] > 3:
            raise RuntimeError("processor exploded")
        return logits

    def boom_at_once(tokens, logits):
        raise ValueError("processor refused")

    def wrong_shape(tokens, logits):
        return logits[0]

    resets = engine.get_stats()["generator_resets"]
    failed = engine.get_stats()["num_requests_failed"]
    results = await asyncio.gather(
        engine.chat(**calls[0]),
        engine.chat(MESSAGES, max_tokens=20, logits_processors=[boom_later]),
        engine.chat(**calls[1]),
        engine.chat(MESSAGES, max_tokens=20, logits_processors=[boom_at_once]),
        engine.chat(MESSAGES, max_tokens=20, logits_processors=[wrong_shape]),
        engine.chat(**calls[2]),
        return_exceptions=True,
    )
    assert isinstance(results[1], RuntimeError) and "processor exploded" in str(results[1])
    assert isinstance(results[3], ValueError) and "processor refused" in str(results[3])
    assert isinstance(results[4], TypeError) and "expected an mx.array of shape" in str(results[4])
    good = [results[0], results[2], results[5]]
    assert [g.tokens for g in good] == await one_by_one(reference, calls)
    stats = engine.get_stats()
    assert stats["generator_resets"] == resets  # the batch itself was never lost
    assert stats["num_requests_failed"] == failed + 3


class _Fatal(BaseException):
    """Not an ``Exception``: escapes the per-request guards, like an internal failure."""


async def test_failure_inside_the_generator_resets_the_batch_and_serving_goes_on(
    tiny_llama, reference
):
    eng = BatchedEngine(tiny_llama)
    try:
        started = threading.Event()

        def fatal(tokens, logits):
            if started.is_set():
                raise _Fatal("lost the batch")
            return logits

        def mark(tokens, logits):
            started.set()
            return logits

        bystander = asyncio.create_task(
            eng.chat(MESSAGES, max_tokens=400, logit_bias={7: 100.0}, logits_processors=[mark])
        )
        await asyncio.to_thread(started.wait, 30)
        culprit = asyncio.create_task(eng.chat(MESSAGES, max_tokens=5, logits_processors=[fatal]))
        results = await asyncio.gather(bystander, culprit, return_exceptions=True)
        for result in results:
            assert isinstance(result, RuntimeError) and "decode batch" in str(result)
            assert isinstance(result.__cause__, _Fatal)
        assert eng.get_stats()["generator_resets"] == 1
        call = dict(messages=convo(QUESTIONS[2]), max_tokens=10, temperature=0)
        assert (await eng.chat(**call)).tokens == (await reference.chat(**call)).tokens
    finally:
        await eng.stop()


async def test_stop_strings_in_a_batch(engine, reference):
    text = "The answer is forty-two, my friend. Goodbye now."
    _, sequence = forcing(engine.tokenizer, text)
    pieces = [engine.tokenizer.decode([t]) for t in sequence]
    # A stop string made of the last character of one token and the first of the next.
    i = next(k for k in range(3, len(pieces) - 1) if pieces[k] and pieces[k + 1])
    stop = pieces[i][-1] + pieces[i + 1][0]
    cut = text.find(stop)
    other_call = dict(messages=convo(QUESTIONS[1]), max_tokens=30, temperature=0)
    processor, _ = forcing(engine.tokenizer, text)
    stopped_chunks, other, whole = await asyncio.gather(
        collect(
            engine.stream_chat(
                MESSAGES, max_tokens=60, temperature=0, stop=[stop], logits_processors=[processor]
            )
        ),
        engine.chat(**other_call),
        engine.chat(
            MESSAGES,
            max_tokens=60,
            stop=["zzz"],
            logits_processors=[forcing(engine.tokenizer, text)[0]],
        ),
    )
    last = stopped_chunks[-1]
    assert last.finish_reason == "stop" and last.text == text[:cut]
    assert "".join(c.new_text for c in stopped_chunks) == text[:cut]
    assert whole.text == text and whole.finish_reason == "stop"  # ended by EOS
    assert whole.tokens[-1] in engine.tokenizer.eos_token_ids
    assert other.tokens == (await reference.chat(**other_call)).tokens


async def test_prefix_cache_reuse_across_turns(tiny_llama, reference):
    # All that is cached, as on the CPU (CUDA serves whole steps of 256 by default).
    eng = BatchedEngine(tiny_llama, prefix_key_step=1)
    try:
        first = await eng.chat(MESSAGES, max_tokens=16, temperature=0)
        history = [
            *MESSAGES,
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "And in Rome?"},
        ]
        second = await eng.chat(history, max_tokens=16, temperature=0)
        assert first.cached_tokens == 0
        assert second.cached_tokens >= first.prompt_tokens
        assert second.tokens == (await reference.chat(history, max_tokens=16, temperature=0)).tokens
        again = await eng.chat(history, max_tokens=16, temperature=0)
        assert again.cached_tokens == again.prompt_tokens - 1
        assert again.tokens == second.tokens
        # Several conversations in flight each find their own earlier turn.
        turns = [convo(q) for q in QUESTIONS[2:5]]
        firsts = await asyncio.gather(*[eng.chat(t, max_tokens=8, temperature=0) for t in turns])
        follow_ups = [
            [*t, {"role": "assistant", "content": f.text}, {"role": "user", "content": "Why?"}]
            for t, f in zip(turns, firsts, strict=True)
        ]
        seconds = await asyncio.gather(
            *[eng.chat(h, max_tokens=8, temperature=0) for h in follow_ups]
        )
        for f, s in zip(firsts, seconds, strict=True):
            assert s.cached_tokens >= f.prompt_tokens
        expected = await one_by_one(
            reference, [dict(messages=h, max_tokens=8, temperature=0) for h in follow_ups]
        )
        assert [s.tokens for s in seconds] == expected
        assert eng.get_cache_stats()["tokens_saved"] > 0
    finally:
        await eng.stop()


async def test_alternating_conversations_keep_their_own_prefix(tiny_llama, reference):
    # B's first turn shares only the template's opening with A's cached turn: it gets a
    # copy of that much, and A's next turn still finds its whole first turn.
    eng = BatchedEngine(tiny_llama, prefix_key_step=1)  # all that is cached
    try:
        a1 = await eng.chat(MESSAGES, max_tokens=8, temperature=0)
        b1 = await eng.chat(convo(QUESTIONS[3]), max_tokens=8, temperature=0)
        assert 0 < b1.cached_tokens < a1.prompt_tokens
        history = [*MESSAGES, {"role": "assistant", "content": a1.text}, *convo("Why?")]
        a2 = await eng.chat(history, max_tokens=8, temperature=0)
        assert a2.cached_tokens >= a1.prompt_tokens
        assert a2.tokens == (await reference.chat(history, max_tokens=8, temperature=0)).tokens
    finally:
        await eng.stop()


async def test_seeded_sampling_is_reproducible_in_any_batch(engine):
    call = dict(messages=MESSAGES, max_tokens=12, temperature=1.0, seed=7)
    alone = await engine.chat(**call)
    crowded = await asyncio.gather(
        engine.chat(convo(QUESTIONS[1]), max_tokens=12, temperature=1.0),
        engine.chat(**call),
        engine.chat(convo(QUESTIONS[2]), max_tokens=12, temperature=0.8, seed=3),
    )
    assert crowded[1].tokens == alone.tokens
    greedy = await engine.chat(MESSAGES, max_tokens=12, temperature=0)
    top1 = await engine.chat(MESSAGES, max_tokens=12, temperature=1.0, top_k=1)
    assert top1.tokens == greedy.tokens


async def test_fail_fast_admission_when_the_batch_is_full(tiny_llama):
    eng = BatchedEngine(tiny_llama, max_num_seqs=2, admission="fail_fast")
    try:
        endless = dict(messages=MESSAGES, max_tokens=4000, temperature=0, logit_bias={7: 100.0})
        streams = [eng.stream_chat(**endless) for _ in range(2)]
        for s in streams:
            assert not (await s.__anext__()).finished
        with pytest.raises(EngineBusy, match="max_num_seqs=2") as info:
            await eng.chat(MESSAGES, max_tokens=2)
        assert info.value.code == "text_generation_busy"
        assert eng.get_stats()["busy_rejections"] == 1
        for s in streams:
            await s.aclose()
        await wait_until(lambda: eng.get_stats()["num_running"] == 0)
        assert (await eng.chat(MESSAGES, max_tokens=2)).finished
    finally:
        await eng.stop()


async def test_generation_runs_on_one_owner_thread_and_loop_stays_free(engine):
    threads = set()

    def spy(history, logits):
        threads.add(threading.current_thread().name)
        return logits

    _, ticks = await loop_ticks_while(
        asyncio.gather(
            engine.chat(MESSAGES, max_tokens=40, logits_processors=[spy]),
            engine.generate("Hello", max_tokens=40, logits_processors=[spy]),
        )
    )
    assert len(threads) == 1 and next(iter(threads)).startswith("mlxi-owner")
    assert ticks >= 5


def test_sync_callers_from_many_threads(engine):
    results, errors = [], []

    def worker():
        try:
            results.append(asyncio.run(engine.chat(MESSAGES, max_tokens=5, temperature=0)).tokens)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(results) == 4 and all(r == results[0] for r in results)


@pytest.mark.parametrize(("overrides", "exc", "match"), BAD_CALLS)
async def test_bad_input_is_rejected_and_engine_keeps_serving(engine, overrides, exc, match):
    call = {"messages": MESSAGES, "max_tokens": 4, **overrides}
    before = engine.get_stats()["num_requests_failed"]
    with pytest.raises(exc, match=match):
        await engine.chat(**call)
    assert engine.get_stats()["num_requests_failed"] == before  # rejected before MLX work
    assert (await engine.chat(MESSAGES, max_tokens=2)).finished


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        (dict(max_num_seqs=0), ValueError, "max_num_seqs must be at least 1, got 0"),
        (dict(max_num_seqs=2.5), TypeError, "max_num_seqs must be an integer"),
        (dict(admission="later"), ValueError, "admission must be"),
    ],
)
def test_bad_engine_options(tiny_llama, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        BatchedEngine(tiny_llama, **kwargs)


async def test_stats_keys_and_clear_runtime_caches_during_a_batch(engine, reference):
    # Sent together, so they share the batch (a request alone decodes outside it).
    await asyncio.gather(
        engine.chat(MESSAGES, max_tokens=4), engine.chat(convo("Hi"), max_tokens=4)
    )
    stats = engine.get_stats()
    assert set(reference.get_stats()) <= set(stats)
    assert stats["engine_type"] == "batched" and stats["loaded"]
    assert stats["steps_executed"] > 0 and stats["max_num_seqs"] == 8
    assert 1 <= stats["mean_batch_size"] <= stats["peak_batch_size"] <= 8
    assert stats["prefix_cache"]["entry_count"] >= 1
    # A clear runs between two decode steps, not after the batch drains.
    endless = engine.stream_chat(MESSAGES, max_tokens=4000, temperature=0, logit_bias={7: 100.0})
    await endless.__anext__()
    cleared = await asyncio.to_thread(engine.clear_runtime_caches)
    assert engine.get_stats()["num_running"] == 1
    assert cleared["dropped_entries"] >= 1 and cleared["freed_cache_mb"] > 0
    assert engine.get_cache_stats()["entry_count"] == 0
    await endless.aclose()
    await wait_until(lambda: engine.get_stats()["num_running"] == 0)


async def test_stop_aborts_running_requests_and_start_is_on_demand(tiny_qwen2):
    eng = BatchedEngine(tiny_qwen2)
    stream = eng.stream_chat(MESSAGES, max_tokens=4000, temperature=0, logit_bias={7: 100.0})
    await stream.__anext__()
    await eng.stop()
    rest = [o async for o in stream]
    assert rest[-1].finish_reason == "abort"
    assert not eng.is_loaded
    await eng.stop()
    out = await eng.chat(MESSAGES, max_tokens=3)  # starts again on demand
    assert out.finished
    await eng.stop()


def test_pool_makes_batched_engines(tiny_llama):
    from mlx_integrations.engine import pool

    eng = pool.acquire(tiny_llama, engine_type="batched", max_num_seqs=4)
    try:
        assert isinstance(eng, BatchedEngine) and eng.max_num_seqs == 4
        assert pool.acquire(tiny_llama, engine_type="batched", max_num_seqs=4) is eng
    finally:
        pool.release(eng)
        pool.release(eng)
        pool.unload_idle()


# The prefix cache's ``put`` takes whatever a finished sequence returns.


def _kv_cache(n_tokens: int):
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    layer = KVCache()
    layer.update_and_fetch(mx.ones((1, 2, n_tokens, 4)), mx.ones((1, 2, n_tokens, 4)))
    return [layer]


def test_prefix_cache_put_keys_by_the_tokens_the_cache_holds():
    from mlx_integrations.engine.cache.prefix_cache import PrefixCache, cache_offset

    pc = PrefixCache()
    # The last sampled token was never fed back: the entry holds 5 of the 6 tokens.
    pc.put([1, 2, 3, 4, 5, 6], _kv_cache(5))
    cache, reused = pc.take([1, 2, 3, 4, 5, 6, 7])
    assert reused == 5 and cache_offset(cache) == 5
    # A cache holding more than the tokens named is trimmed to them.
    pc.put([1, 2, 3], _kv_cache(5))
    cache, reused = pc.take([1, 2, 3, 9])
    assert reused == 3 and cache_offset(cache) == 3
    pc.put([], _kv_cache(2))
    pc.put([1, 2], [])
    assert pc.stats()["entry_count"] == 0


def test_prefix_cache_partial_match_copies_and_keeps_the_entry():
    import mlx.core as mx

    from mlx_integrations.engine.cache.prefix_cache import PrefixCache, cache_offset

    pc = PrefixCache()
    pc.put([1, 2, 3, 4, 5], _kv_cache(5))
    # Another conversation sharing two tokens gets a copy; the entry stays whole.
    copy, reused = pc.take([1, 2, 9, 9])
    assert reused == 2 and cache_offset(copy) == 2
    assert pc.stats()["entry_count"] == 1
    copy[0].update_and_fetch(mx.zeros((1, 2, 2, 4)), mx.zeros((1, 2, 2, 4)))
    # Writing into the copy did not reach the entry its own conversation continues.
    own, reused = pc.take([1, 2, 3, 4, 5, 6])
    assert reused == 5 and pc.stats()["entry_count"] == 0
    keys, _ = own[0].keys_and_values()
    assert mx.all(keys == 1).item()


EXIT_SCRIPT = """
import asyncio, sys
sys.path.insert(0, {root!r})
import mlx_integrations
from mlx_integrations.engine import BatchedEngine, SimpleEngine

ENGINES = [cls({path!r}) for cls in {engines}]  # alive until the interpreter exits

async def main():
    for engine in ENGINES:
        await engine.chat([{{"role": "user", "content": "hi"}}], max_tokens=3)
        if {stop}:
            await engine.stop()

asyncio.run(main())
print("done")
"""


@pytest.mark.parametrize(
    ("engines", "stop", "runs"),
    [("[BatchedEngine]", False, 3), ("[SimpleEngine, BatchedEngine]", True, 1)],
    ids=["left-running", "stopped"],
)
def test_process_exits_cleanly(tiny_llama, engines, stop, runs):
    # An owner thread that ends with its MLX streams alive can abort the process at
    # exit (intermittently, so a few runs), and an engine nobody stopped must not keep
    # the interpreter from exiting.
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[2])
    script = EXIT_SCRIPT.format(root=root, path=str(tiny_llama), engines=engines, stop=stop)
    for _ in range(runs):
        proc = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip() == "done"
