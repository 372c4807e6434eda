"""How outputs travel from the owner thread to the caller's event loop (engine/jobs.py)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import threading
import time
import weakref
from pathlib import Path

import pytest

from mlx_integrations.engine import BatchedEngine, SimpleEngine
from mlx_integrations.engine.generation import MLXGenerationOutput
from mlx_integrations.engine.jobs import Channel, Mailbox, abort_mark


def chunk(text: str, finished: bool = False) -> MLXGenerationOutput:
    return MLXGenerationOutput(text=text, new_text=text, finished=finished)


async def test_a_burst_from_another_thread_wakes_the_loop_once_and_keeps_order():
    loop = asyncio.get_running_loop()
    wakeups = 0
    real = loop.call_soon_threadsafe

    def counting(*args, **kwargs):
        nonlocal wakeups
        wakeups += 1
        return real(*args, **kwargs)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        channels = [Channel() for _ in range(64)]
        posted = threading.Event()

        def owner() -> None:  # 64 requests, three chunks each, while the loop is busy
            for step in range(3):
                for i, c in enumerate(channels):
                    c.emit(chunk(f"{i}:{step}", finished=step == 2))
            posted.set()

        thread = threading.Thread(target=owner)
        thread.start()
        posted.wait(30)  # blocks the loop: nothing is drained while the owner posts
        thread.join()
        got = [[out.text async for out in c.receive()] for c in channels]
    finally:
        loop.call_soon_threadsafe = real  # type: ignore[method-assign]
    assert got == [[f"{i}:{s}" for s in range(3)] for i in range(64)]
    assert wakeups == 1


async def test_later_bursts_wake_the_loop_again():
    channel = Channel()
    for n in range(5):
        await asyncio.to_thread(channel.emit, chunk(str(n), finished=n == 4))
        await asyncio.sleep(0)
    assert [out.text async for out in channel.receive()] == ["0", "1", "2", "3", "4"]


def test_a_closed_loop_aborts_the_request_instead_of_queueing_forever():
    loop = asyncio.new_event_loop()

    async def make() -> Channel:
        return Channel()

    streaming, final_only = loop.run_until_complete(make()), loop.run_until_complete(make())
    assert not streaming.abort.is_set() and not final_only.abort.is_set()
    loop.close()
    # Nothing is sent to a request that wants only its last chunk before that chunk: the
    # owner thread learns from abort alone that nobody waits for it.
    assert streaming.abort.is_set() and final_only.abort.is_set()
    streaming.emit(chunk("x"))  # refused, not queued
    with pytest.raises(RuntimeError, match="closed"):
        Mailbox(loop).post(asyncio.Queue(), chunk("x"))


def test_a_finished_loop_and_its_mailbox_are_freed():
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def make() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        Channel()

    for _ in range(5):
        asyncio.run(make())
    gc.collect()
    assert [ref() for ref in loops] == [None] * 5


@pytest.mark.parametrize("kind", [SimpleEngine, BatchedEngine])
async def test_generate_sends_the_last_chunk_alone(tiny_llama: Path, kind, monkeypatch):
    sent: list[MLXGenerationOutput] = []
    post = Mailbox.post

    def recording(self, queue, item):  # the real method; what it carries is recorded
        sent.append(item)
        post(self, queue, item)

    monkeypatch.setattr(Mailbox, "post", recording)
    engine = kind(tiny_llama, cache_memory_mb=0)
    try:
        whole = await engine.generate("The capital of France is", max_tokens=24, temperature=0)
        assert [out.text for out in sent] == [whole.text] and sent[0].finished
        sent.clear()
        stream = engine.stream_generate("The capital of", max_tokens=24, temperature=0)
        chunks = [c async for c in stream]
        assert len(sent) == len(chunks) > 1  # a stream still gets every chunk
    finally:
        await engine.stop()


async def test_an_exception_ends_the_stream_and_a_consumer_that_leaves_aborts():
    failed = Channel()
    failed.emit(chunk("a"))
    failed.emit(ValueError("bad step"))
    got = []
    with pytest.raises(ValueError, match="bad step"):
        async for out in failed.receive():
            got.append(out.text)
    assert got == ["a"]

    left = Channel()
    left.emit(chunk("a"))
    stream = left.receive()
    assert (await anext(stream)).text == "a"
    await stream.aclose()
    assert left.abort.is_set()


async def test_the_abort_mark_changes_with_every_raised_abort_and_only_then():
    """BatchedEngine reads every row's abort flag only when the mark moved (or now and
    then, for loops that closed): each abort, from any thread, must move it."""
    channels = [Channel() for _ in range(2)]
    before = abort_mark()
    channels[0].abort.set()
    after_one = abort_mark()
    assert after_one != before
    setter = threading.Thread(target=channels[1].abort.set)
    setter.start()
    setter.join()
    assert abort_mark() not in (before, after_one)


@pytest.mark.parametrize("kind", [SimpleEngine, BatchedEngine])
async def test_generate_and_chat_return_the_streams_last_chunk(tiny_llama: Path, kind):
    """generate() and chat() take only the last chunk; it equals a stream's last one."""
    engine = kind(tiny_llama, cache_memory_mb=0)
    try:
        calls = [
            {"prompt": "The capital of France is", "max_tokens": 24},
            {"prompt": "Hello there, how are", "max_tokens": 17, "stop": ["e"]},
        ]
        for call in calls:
            whole = await engine.generate(**call, temperature=0.0)
            chunks = [c async for c in engine.stream_generate(**call, temperature=0.0)]
            last = chunks[-1]
            assert (whole.text, whole.tokens, whole.finish_reason) == (
                last.text,
                last.tokens,
                last.finish_reason,
            )
            assert whole.completion_tokens == last.completion_tokens > 0
            assert "".join(c.new_text for c in chunks) == whole.text
        messages = [{"role": "user", "content": "Name a colour."}]
        whole = await engine.chat(messages, max_tokens=20, temperature=0.0)
        chunks = [c async for c in engine.stream_chat(messages, max_tokens=20, temperature=0.0)]
        assert (whole.text, whole.tokens) == (chunks[-1].text, chunks[-1].tokens)
        assert len(chunks) > 1  # a stream still streams
    finally:
        await engine.stop()


async def test_sixty_four_streams_at_once_get_every_chunk_in_order(tiny_llama: Path):
    engine = BatchedEngine(tiny_llama, max_num_seqs=64, cache_memory_mb=0)
    try:
        prompts = [f"Count to {i}:" for i in range(64)]

        async def stream(p: str) -> list[MLXGenerationOutput]:
            return [c async for c in engine.stream_generate(p, max_tokens=12, temperature=0.0)]

        streams = await asyncio.gather(*(stream(p) for p in prompts))
        wholes = await asyncio.gather(
            *(engine.generate(p, max_tokens=12, temperature=0.0) for p in prompts)
        )
        for chunks, whole in zip(streams, wholes, strict=True):
            assert [c.finished for c in chunks] == [False] * (len(chunks) - 1) + [True]
            assert "".join(c.new_text for c in chunks) == chunks[-1].text == whole.text
            assert chunks[-1].tokens == whole.tokens
            counts = [c.completion_tokens for c in chunks]
            assert counts == sorted(counts)
    finally:
        await engine.stop()


@pytest.mark.parametrize("kind", [SimpleEngine, BatchedEngine])
@pytest.mark.parametrize("call", ["chat", "generate", "stream_chat"])
def test_a_request_whose_loop_closes_mid_reply_is_aborted(tiny_llama: Path, kind, call):
    """generate() and chat() get no chunk before the last, yet a closed loop stops them."""
    engine = kind(tiny_llama, cache_memory_mb=0)
    eos = next(iter(engine.tokenizer.eos_token_ids))
    args = {"max_tokens": 1500, "temperature": 0.0, "logit_bias": {eos: -1e9}}
    messages = [{"role": "user", "content": "Hello"}]

    async def request() -> None:
        if call == "chat":
            await engine.chat(messages, **args)
        elif call == "generate":
            await engine.generate("Hello", **args)
        else:
            async for _ in engine.stream_chat(messages, **args):
                pass

    async def started() -> None:
        while not engine.get_stats()["num_running"]:
            await asyncio.sleep(0.002)

    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(request())
        loop.run_until_complete(asyncio.wait_for(started(), 60))
        loop.close()  # the caller's loop ends with the request still running
        for _ in range(6000):
            if not engine.get_stats()["num_running"]:
                break
            time.sleep(0.01)
        stats = engine.get_stats()
        assert stats["num_running"] == 0
        assert stats["last_request"]["finish_reason"] == "abort"
        assert stats["last_request"]["completion_tokens"] < args["max_tokens"]
    finally:
        # The task stays pending on the closed loop: end its coroutine here, whose
        # cleanup cannot reach that loop any more.
        with contextlib.suppress(RuntimeError):
            task.get_coro().close()
        asyncio.run(engine.stop())


def test_a_reply_wanted_whole_is_detokenized_at_its_end_and_reads_as_streamed(tiny_llama: Path):
    """Without stop strings a reply that is not streamed is detokenized once, when it
    ends (the same detokenizer calls): its text, end and counts are the streamed reply's,
    for any end (length, the end-of-sequence token, an abort), multi-byte text included.
    With stop strings it is read token by token, as a stream is."""
    from mlx_lm.tokenizer_utils import load

    from mlx_integrations.engine.generation import OutputBuilder

    tokenizer = load(tiny_llama)
    tokens = tokenizer.encode(
        "Grüße, ça va? 你好 — naïve ✓ done. Again: 你好 naïve", add_special_tokens=False
    )
    eos = tokenizer.eos_token_ids
    eos_id = next(iter(eos))

    def run(stream: bool, reply: list[int], stop: list[str], max_tokens: int, abort_at=None):
        builder = OutputBuilder(
            tokenizer,
            request_id="r",
            prompt_tokens=3,
            cached_tokens=0,
            stop=stop,
            max_tokens=max_tokens,
            arrival=time.perf_counter(),
            stream=stream,
        )
        chunks = []
        for i, token in enumerate(reply):
            if abort_at == i:
                chunks.append(builder.finish("abort"))
                break
            out = builder.add(token)
            if out is not None:
                chunks.append(out)
            if builder.finished:
                break
        last = chunks[-1]
        fields = (last.text, last.finish_reason, last.completion_tokens, last.stop_sequence)
        return fields, "".join(c.new_text for c in chunks), len(chunks)

    cases = [
        (tokens, [], 1000, None),  # the reply ends by length only at its last token
        (tokens, [], 7, None),  # max_tokens mid-character or mid-word
        ([*tokens[:9], eos_id, *tokens[9:]], [], 1000, None),  # end-of-sequence token
        (tokens, [], 1000, 11),  # aborted
        (tokens, ["va?"], 1000, None),  # a stop string: read token by token
        (tokens, ["你"], 1000, None),
    ]
    for reply, stop, max_tokens, abort_at in cases:
        if abort_at is None and max_tokens == 1000 and eos_id not in reply and not stop:
            reply = [*reply, eos_id]
        streamed, streamed_text, _ = run(True, reply, stop, max_tokens, abort_at)
        whole, _, sent = run(False, reply, stop, max_tokens, abort_at)
        assert whole == streamed, (stop, max_tokens, abort_at)
        assert streamed_text == whole[0]  # the stream's pieces add up to the whole
        assert sent == 1  # one chunk: the last


def test_a_whole_reply_read_at_once_is_the_text_of_its_tokens_read_one_by_one(tiny_llama: Path):
    """The byte-level BPE detokenizer given a whole reply at once (``read_whole``) makes
    the text that adding its tokens one by one makes: random replies over the whole
    vocabulary (bytes that break UTF-8, spaces, special tokens, ids past the vocabulary),
    and the ones it leaves to the one-by-one reading (byte 0) are read that way."""
    import random

    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, load

    from mlx_integrations.engine.generation import read_whole

    tokenizer = load(tiny_llama)
    assert type(tokenizer.detokenizer) is BPEStreamingDetokenizer
    vocab = len(tokenizer.detokenizer.tokenmap)
    zero = tokenizer.detokenizer.tokenmap.index("\u0100")  # the token of byte 0
    rng = random.Random(0)
    whole = 0
    for _ in range(1500):
        reply = [rng.randrange(vocab + 2) for _ in range(rng.randint(0, 30))]
        if rng.random() < 0.1:
            reply.insert(rng.randint(0, len(reply)), zero)
        one_by_one = tokenizer.detokenizer
        for token in reply:
            one_by_one.add_token(token)
        one_by_one.finalize()
        at_once = tokenizer.detokenizer
        assert at_once is not one_by_one
        if read_whole(at_once, reply):
            whole += 1
            at_once.finalize()
            assert at_once.text == one_by_one.text, reply
        else:
            assert zero in reply  # the only tokens this vocabulary leaves to the loop
    assert whole > 1200
    # A token of no characters after a lone space: one by one, the first piece is just
    # the space, trimmed to nothing, and the next piece loses its space too.
    detokenizer = tokenizer.detokenizer
    detokenizer.tokenmap = [*detokenizer.tokenmap, ""]
    empty, space = len(detokenizer.tokenmap) - 1, detokenizer.tokenmap.index("\u0120")
    the = tokenizer.encode(" the", add_special_tokens=False)
    for token in (space, empty, *the):
        detokenizer.add_token(token)
    detokenizer.finalize()
    at_once = copy.copy(detokenizer)
    at_once.reset()
    assert not read_whole(at_once, [space, empty, *the])
    assert detokenizer.text == "the"


def test_a_detokenizer_that_reads_line_by_line_is_read_token_by_token_for_a_whole_reply():
    """mlx-lm's naive detokenizer (tokenizers with a Metaspace decoder, say) starts over at
    each line it is read at: a reply wanted whole reads it after every token too, so its
    text is the streamed one."""
    from mlx_lm.tokenizer_utils import NaiveStreamingDetokenizer, TokenizerWrapper
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from mlx_integrations.engine.generation import OutputBuilder

    vocab = {"<unk>": 0, "</s>": 1, "\u2581Hello": 2, "\n": 3, "\u2581world": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    backend.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="<unk>")
    tokenizer = TokenizerWrapper(hf, NaiveStreamingDetokenizer)
    texts = []
    for stream in (True, False):
        builder = OutputBuilder(
            tokenizer,
            request_id="r",
            prompt_tokens=1,
            cached_tokens=0,
            stop=[],
            max_tokens=100,
            arrival=time.perf_counter(),
            stream=stream,
        )
        outs = [builder.add(token) for token in (2, 3, 4, 1)]
        texts.append(outs[-1].text)
    assert texts[1] == texts[0] == "Hello\nworld"
