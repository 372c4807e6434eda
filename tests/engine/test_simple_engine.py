"""SimpleEngine on real (tiny, random) models: streaming, caches, admission, abort."""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path

import pytest

from mlx_integrations.engine import BatchedEngine, EngineBusy, SimpleEngine
from tests.support.event_loop import loop_ticks_while

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def engine(tiny_llama: Path):
    eng = SimpleEngine(tiny_llama)
    yield eng
    asyncio.run(eng.stop())


async def collect(stream):
    return [out async for out in stream]


async def test_stream_chat_chunks_add_up(engine):
    chunks = await collect(engine.stream_chat(MESSAGES, max_tokens=24, temperature=0))
    last = chunks[-1]
    assert last.finished and all(not c.finished for c in chunks[:-1])
    assert "".join(c.new_text for c in chunks) == last.text
    assert last.completion_tokens == len(last.tokens) <= 24
    assert last.finish_reason in ("stop", "length")
    prompt = engine.render_prompt(MESSAGES)
    assert last.prompt_tokens == len(engine.tokenizer.encode(prompt, add_special_tokens=False))
    # Each chunk's text is the text so far.
    for c in chunks:
        assert last.text.startswith(c.text)


async def test_greedy_matches_mlx_lm(engine, tiny_llama):
    from mlx_lm import generate, load

    prompt = engine.render_prompt(MESSAGES)
    model, tokenizer = load(str(tiny_llama))
    reference = generate(model, tokenizer, prompt, max_tokens=20)
    ours = await engine.chat(MESSAGES, max_tokens=20, temperature=0)
    # mlx-lm stops at EOS without showing it, as we do.
    assert ours.text == reference


async def test_kv_reuse_gives_same_tokens_as_fresh_prefill(tiny_llama):
    reusing = SimpleEngine(tiny_llama, prefix_key_step=1)  # all that is cached, on CUDA too
    fresh = SimpleEngine(tiny_llama, cache_memory_mb=0)
    try:
        first = await reusing.chat(MESSAGES, max_tokens=16, temperature=0)
        history = [
            *MESSAGES,
            {"role": "assistant", "content": "It is sunny."},
            {"role": "user", "content": "And in Rome?"},
        ]
        second = await reusing.chat(history, max_tokens=16, temperature=0)
        baseline = await fresh.chat(history, max_tokens=16, temperature=0)
        assert first.cached_tokens == 0
        assert second.cached_tokens >= first.prompt_tokens - 1
        assert second.tokens == baseline.tokens
        assert baseline.cached_tokens == 0
        # The same prompt again reuses all but one token and decodes the same.
        again = await reusing.chat(history, max_tokens=16, temperature=0)
        assert again.cached_tokens == again.prompt_tokens - 1
        assert again.tokens == second.tokens
        stats = reusing.get_cache_stats()
        assert stats["hits"] == 2 and stats["misses"] == 1
        assert stats["tokens_saved"] == second.cached_tokens + again.cached_tokens
    finally:
        await reusing.stop()
        await fresh.stop()


def forcing(tokenizer, text):
    """A logits processor that makes the model write ``text`` and then EOS."""
    import mlx.core as mx

    sequence = tokenizer.encode(text, add_special_tokens=False)
    eos = next(iter(tokenizer.eos_token_ids))
    state = {"start": None}

    def processor(history, logits):
        if state["start"] is None:
            state["start"] = history.size
        i = history.size - state["start"]
        want = sequence[i] if i < len(sequence) else eos
        mask = mx.full(logits.shape, -1e9)
        mask[..., want] = 0
        return logits + mask

    return processor, sequence


async def test_stop_sequence_spanning_tokens_is_never_emitted(engine):
    text = "The answer is forty-two, my friend. Goodbye now."
    _, sequence = forcing(engine.tokenizer, text)
    pieces = [engine.tokenizer.decode([t]) for t in sequence]
    assert "".join(pieces) == text
    # A stop string made of the last character of one token and the first of the next.
    i = next(k for k in range(3, len(pieces) - 1) if pieces[k] and pieces[k + 1])
    stop = pieces[i][-1] + pieces[i + 1][0]
    cut = text.find(stop)
    processor, _ = forcing(engine.tokenizer, text)
    chunks = await collect(
        engine.stream_chat(
            MESSAGES, max_tokens=60, temperature=0, stop=[stop], logits_processors=[processor]
        )
    )
    last = chunks[-1]
    assert last.finish_reason == "stop"
    assert last.text == text[:cut]
    assert stop not in "".join(c.new_text for c in chunks)
    assert "".join(c.new_text for c in chunks) == text[:cut]
    # A stop string that never occurs changes nothing.
    processor, _ = forcing(engine.tokenizer, text)
    whole = await engine.chat(MESSAGES, max_tokens=60, stop=["zzz"], logits_processors=[processor])
    assert whole.text == text and whole.finish_reason == "stop"


async def test_eos_ends_with_stop_and_is_not_shown(engine):
    eos = next(iter(engine.tokenizer.eos_token_ids))
    out = await engine.chat(MESSAGES, max_tokens=10, temperature=0, logit_bias={eos: 1000.0})
    assert out.finish_reason == "stop"
    assert out.tokens == [eos] and out.text == ""


async def test_length_finish(engine):
    out = await engine.generate(
        "The capital of France", max_tokens=3, temperature=0, logit_bias={5: 1000.0}
    )
    assert out.finish_reason == "length" and out.completion_tokens == 3


async def test_seed_makes_sampling_reproducible(engine):
    a = await engine.chat(MESSAGES, max_tokens=12, temperature=1.0, seed=7)
    b = await engine.chat(MESSAGES, max_tokens=12, temperature=1.0, seed=7)
    assert a.tokens == b.tokens
    greedy = await engine.chat(MESSAGES, max_tokens=12, temperature=0)
    top1 = await engine.chat(MESSAGES, max_tokens=12, temperature=1.0, top_k=1)
    assert top1.tokens == greedy.tokens


async def test_multibyte_text_streams_whole(engine):
    text = "日本語 🎉 Ελληνικά ✓"
    processor, tokens = forcing(engine.tokenizer, text)
    # Byte-level tokens: some characters span several tokens, alone they are not UTF-8.
    assert any("\ufffd" in engine.tokenizer.decode([t]) for t in tokens)
    chunks = await collect(
        engine.stream_chat(
            MESSAGES, max_tokens=len(tokens) + 2, temperature=0, logits_processors=[processor]
        )
    )
    assert chunks[-1].text == text
    assert all("\ufffd" not in c.new_text for c in chunks)
    assert "".join(c.new_text for c in chunks) == text


async def test_generation_runs_on_one_owner_thread(engine):
    threads = set()

    def spy(history, logits):
        threads.add(threading.current_thread().name)
        return logits

    await engine.chat(MESSAGES, max_tokens=3, logits_processors=[spy])
    await engine.generate("Hello", max_tokens=3, logits_processors=[spy])
    assert len(threads) == 1 and next(iter(threads)).startswith("mlxi-owner")


async def test_event_loop_is_not_blocked(engine):
    out, ticks = await loop_ticks_while(
        engine.chat(MESSAGES, max_tokens=64, temperature=0, logit_bias={7: 100.0})
    )
    assert out.completion_tokens == 64
    assert ticks >= 5


def test_sync_callers_from_many_threads(engine):
    results, errors = [], []

    def worker(i):
        try:
            out = asyncio.run(engine.chat(MESSAGES, max_tokens=5, temperature=0))
            results.append(out.tokens)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(results) == 4 and all(r == results[0] for r in results)


async def test_fail_fast_admission_raises_engine_busy(tiny_llama):
    eng = SimpleEngine(tiny_llama, admission="fail_fast")
    try:
        stream = eng.stream_chat(MESSAGES, max_tokens=200, temperature=0, logit_bias={7: 100.0})
        first = await stream.__anext__()
        assert not first.finished
        with pytest.raises(EngineBusy) as info:
            await eng.chat(MESSAGES, max_tokens=2)
        assert info.value.code == "text_generation_busy"
        rest = [o async for o in stream]
        assert rest[-1].finished
        assert eng.get_stats()["busy_rejections"] == 1
        ok = await eng.chat(MESSAGES, max_tokens=2)  # free again
        assert ok.finished
    finally:
        await eng.stop()


async def test_wait_admission_queues(engine):
    outs = await asyncio.gather(
        *[engine.chat(MESSAGES, max_tokens=6, temperature=0) for _ in range(3)]
    )
    assert all(o.finished for o in outs)
    assert outs[0].tokens == outs[1].tokens == outs[2].tokens


async def test_abort_request_stops_between_tokens(engine):
    stream = engine.stream_chat(
        MESSAGES, max_tokens=500, temperature=0, request_id="r-abort", logit_bias={7: 100.0}
    )
    first = await stream.__anext__()
    assert await engine.abort_request("r-abort") is True
    rest = [o async for o in stream]
    assert rest[-1].finish_reason == "abort"
    assert rest[-1].completion_tokens < 500
    assert first.request_id == "r-abort"
    assert await engine.abort_request("r-abort") is False  # gone now
    assert (await engine.chat(MESSAGES, max_tokens=2)).finished


async def test_cancelled_consumer_aborts_its_request(engine):
    before = engine.get_stats()["num_requests_aborted"]
    got_one = asyncio.Event()

    async def consume():
        async for _ in engine.stream_chat(
            MESSAGES, max_tokens=5000, temperature=0, logit_bias={7: 100.0}
        ):
            got_one.set()

    task = asyncio.create_task(consume())
    await got_one.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    out = await asyncio.wait_for(engine.chat(MESSAGES, max_tokens=2), 30)
    assert out.finished
    assert engine.get_stats()["num_requests_aborted"] == before + 1


async def test_consumer_that_stops_iterating_aborts(engine):
    before = engine.get_stats()["num_requests_aborted"]
    stream = engine.stream_chat(MESSAGES, max_tokens=5000, temperature=0, logit_bias={7: 100.0})
    await stream.__anext__()
    await stream.aclose()
    out = await asyncio.wait_for(engine.chat(MESSAGES, max_tokens=2), 30)
    assert out.finished
    assert engine.get_stats()["num_requests_aborted"] == before + 1


async def test_crashing_logits_processor_fails_only_its_request(engine):
    def boom(tokens, logits):
        raise RuntimeError("processor exploded")

    with pytest.raises(RuntimeError, match="processor exploded"):
        await engine.chat(MESSAGES, max_tokens=5, logits_processors=[boom])
    out = await engine.chat(MESSAGES, max_tokens=3, temperature=0)
    assert out.finished and out.completion_tokens >= 1


BAD_CALLS = [
    (dict(messages=[]), ValueError, "messages is empty"),
    (dict(messages=[{"role": "wizard", "content": "hi"}]), ValueError, "unknown role 'wizard'"),
    (dict(messages=[{"role": "user", "content": 42}]), TypeError, "content must be a string"),
    (dict(messages="hello"), TypeError, "messages must be a list"),
    (dict(max_tokens=0), ValueError, "max_tokens must be at least 1, got 0"),
    (dict(temperature=-0.5), ValueError, "temperature must be >= 0"),
    (dict(top_p=0.0), ValueError, r"top_p must be in \(0, 1\], got 0.0"),
    (dict(top_p=1.5), ValueError, r"top_p must be in \(0, 1\], got 1.5"),
    (dict(top_k=-1), ValueError, "top_k must be >= 0"),
    (dict(min_p=2.0), ValueError, "min_p must be in"),
    (dict(repetition_penalty=0), ValueError, "repetition_penalty must be > 0"),
    (dict(stop=[""]), ValueError, "stop sequences must not be empty"),
    (dict(stop=3), TypeError, "stop must be a string or a list"),
    (dict(images=["cat.png"]), ValueError, "text-only model and cannot take images"),
    (dict(videos=["v.mp4"]), ValueError, "text-only model and cannot take videos"),
    (
        dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]),
        ValueError,
        "text-only model",
    ),
    (dict(temprature=0.5), TypeError, "unexpected keyword argument"),
]


@pytest.mark.parametrize(("overrides", "exc", "match"), BAD_CALLS)
async def test_bad_input_is_rejected_and_engine_keeps_serving(engine, overrides, exc, match):
    call = {"messages": MESSAGES, "max_tokens": 4, **overrides}
    before = engine.get_stats()["num_requests_failed"]
    with pytest.raises(exc, match=match):
        await engine.chat(**call)
    assert engine.get_stats()["num_requests_failed"] == before  # rejected before MLX work
    assert (await engine.chat(MESSAGES, max_tokens=2)).finished


def test_path_that_is_not_a_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        SimpleEngine(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        SimpleEngine(tmp_path)


def test_truncated_safetensors_is_caught_before_loading(tiny_llama, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama, broken)
    weights = broken / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated"):
        SimpleEngine(broken)


async def test_prompt_longer_than_context_window(tiny_llama, tmp_path):
    import json

    small = tmp_path / "small-ctx"
    shutil.copytree(tiny_llama, small)
    config = json.loads((small / "config.json").read_text())
    config["max_position_embeddings"] = 16
    (small / "config.json").write_text(json.dumps(config))
    eng = SimpleEngine(small)
    try:
        with pytest.raises(ValueError, match="context window"):
            await eng.chat([{"role": "user", "content": "word " * 50}], max_tokens=2)
    finally:
        await eng.stop()


async def test_stats_and_clear_runtime_caches(engine):
    await engine.chat(MESSAGES, max_tokens=4)
    stats = engine.get_stats()
    assert stats["engine_type"] == "simple" and stats["loaded"] and not stats["running"]
    assert stats["num_requests_processed"] >= 1
    assert stats["last_request"]["completion_tokens"] >= 1
    assert stats["prefix_cache"]["entry_count"] >= 1
    assert stats["memory"]["active_mb"] > 0
    cleared = engine.clear_runtime_caches()
    assert cleared["dropped_entries"] >= 1 and cleared["freed_cache_mb"] > 0
    assert engine.get_cache_stats()["entry_count"] == 0
    assert (await engine.chat(MESSAGES, max_tokens=2)).cached_tokens == 0


async def test_start_stop_are_idempotent(tiny_qwen2):
    eng = SimpleEngine(tiny_qwen2)
    await eng.start()
    await eng.start()
    assert eng.is_loaded
    await eng.stop()
    await eng.stop()
    assert not eng.is_loaded
    out = await eng.chat(MESSAGES, max_tokens=2)  # starts again on demand
    assert out.finished
    await eng.stop()


async def test_template_probe_sets_native_tool_format(tiny_llama, tiny_plain):
    native = SimpleEngine(tiny_llama)
    plain = SimpleEngine(tiny_plain)
    forced = SimpleEngine(tiny_llama, preserve_native_tool_format=False)
    try:
        await native.start()
        await plain.start()
        await forced.start()
        assert native.preserve_native_tool_format is True
        assert plain.preserve_native_tool_format is False
        assert forced.preserve_native_tool_format is False
    finally:
        for e in (native, plain, forced):
            await e.stop()


@pytest.mark.parametrize("engine_cls", [SimpleEngine, BatchedEngine])
async def test_an_abort_during_a_long_prompt_stops_its_prefill_between_pieces(
    tiny_llama, engine_cls
):
    # A client gone while its long prompt is prefilled frees the owner thread after the
    # piece in progress (BatchedEngine: a request alone prefills a piece per loop turn).
    # The abort is raised from inside the third forward pass (the model is wrapped to
    # count its passes), so where it lands is not left to timing.
    engine = engine_cls(tiny_llama, prefill_step_size=16)
    await engine.start()
    loop = asyncio.get_running_loop()
    model = engine._model
    passes: list[int] = []

    class Counted:
        def __call__(self, inputs, *args, **kwargs):
            passes.append(inputs.shape[1])
            if len(passes) == 3:
                asyncio.run_coroutine_threadsafe(engine.abort_request("r-long"), loop).result()
            return model(inputs, *args, **kwargs)

        def __getattr__(self, name):
            return getattr(model, name)

    engine._model = Counted()
    try:
        long = [{"role": "user", "content": "word " * 600}]
        outs = [o async for o in engine.stream_chat(long, max_tokens=8, request_id="r-long")]
        assert outs[-1].finish_reason == "abort" and outs[-1].completion_tokens == 0
        assert outs[-1].prompt_tokens > 16 * 30  # more than 30 pieces to prefill...
        assert len(passes) == 3  # ...and the third was the last
        # The engine serves on, and the pieces fed are kept: the prompt sent again
        # starts from them (a client that comes back after a timeout).
        out = await engine.chat(long, max_tokens=3, temperature=0)
        assert out.finished and out.completion_tokens == 3
        assert out.cached_tokens == 3 * 16
    finally:
        engine._model = model
        await engine.stop()


@pytest.mark.parametrize("engine_cls", [SimpleEngine, BatchedEngine])
async def test_slow_prefill_pieces_make_the_next_ones_smaller(tiny_llama, engine_cls, monkeypatch):
    # On a slow device a long prompt's pieces shrink, so that an abort lands soon; every
    # piece counts as slow here (the limit set to 0 s), so the sizes are known.
    from mlx_integrations.engine import decoding

    monkeypatch.setattr(decoding, "PIECE_S", 0.0)
    engine = engine_cls(tiny_llama, prefill_step_size=256)
    await engine.start()
    model = engine._model
    pieces: list[int] = []

    class Counted:
        def __call__(self, inputs, *args, **kwargs):
            pieces.append(inputs.shape[1])
            return model(inputs, *args, **kwargs)

        def __getattr__(self, name):
            return getattr(model, name)

    engine._model = Counted()
    try:
        long = [{"role": "user", "content": "word " * 600}]
        out = await engine.chat(long, max_tokens=2, temperature=0)
        assert out.finished
        prefill = [n for n in pieces if n > 1]
        assert prefill[:4] == [256, 128, 64, 64]
        assert sum(prefill) == out.prompt_tokens - 1  # the last prompt token starts decoding
    finally:
        engine._model = model
        await engine.stop()
