"""Padded prefill pieces (``prefill_buckets``) and the shape warm-up (``warmup_shapes``).

The last prefill piece of a prompt is padded at its end to one of a few sizes and the
padding trimmed off the KV cache right after, so that a process meets few distinct
shapes. What must hold: the cache afterwards holds the real tokens alone (its offset is
the prompt's length, its keys those of the unpadded prefill up to float rounding), the
greedy reply is token for token the unpadded one, for SimpleEngine and for
BatchedEngine (a lone request and a shared batch), and the next turn reuses the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlx_integrations.engine import BatchedEngine, SimpleEngine
from mlx_integrations.engine.batched.arrivals import group_row_counts
from mlx_integrations.engine.batched.warmup import GROUP_TOKENS
from mlx_integrations.engine.decoding import (
    KEY_STEP,
    PrefillShapes,
    bucket_sizes,
    plain_steps,
    prefill,
    warm_shapes,
)
from mlx_integrations.engine.options import EngineOptions
from mlx_integrations.runtime import owner

STEP = 64
SHAPES = PrefillShapes(bucket_sizes(STEP))
KEYED = PrefillShapes(bucket_sizes(STEP), key_step=32)
"""Pieces after cached tokens padded to whole steps of 32 (as of 256 with pieces of 2048)."""
KEY = 16
"""The padded engines' ``prefix_key_step``: scaled down with their pieces (``STEP``),
as the default ``KEY_STEP`` is to pieces of 2048 tokens."""
ROWS = {1, 2, 3, 4, 6, 8, 12, 16}
"""The row counts a group's prefill is padded to (up to 16)."""
LENGTHS = [1, 2, 5, 16, 17, 23, 40, 63, 64, 65, 100, 130, 150]
"""Prompt lengths: on a bucket, just past one, and over one and two whole pieces."""


class Shapes:
    """The real model, recording the shape of every input it is given."""

    def __init__(self, model: Any):
        self.model = model
        self.seen: list[tuple[int, ...]] = []

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        self.seen.append(tuple(inputs.shape))
        return self.model(inputs, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


@pytest.fixture(scope="module")
def loaded(tiny_own_head: Path) -> tuple[Any, Any]:
    import mlx_lm

    return mlx_lm.load(str(tiny_own_head))


def tokens(n: int, seed: int = 0) -> list[int]:
    """``n`` varied tokens of the tiny vocabulary."""
    return [(7 * i + 3 + seed) % 250 + 2 for i in range(n)]


def greedy(model: Any, prompt: list[int], n: int, shapes: PrefillShapes) -> list[int]:
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    steps = plain_steps(
        model,
        prompt,
        len(prompt),
        make_prompt_cache(model),
        processors=[],
        max_tokens=n,
        sampler=make_sampler(0.0),
        prefill_step_size=STEP,
        shapes=shapes,
    )
    return [token for token, _, _ in steps]


def test_bucket_sizes_grow_by_half_and_end_at_the_step_size():
    assert bucket_sizes(64) == (16, 24, 32, 48, 64)
    assert bucket_sizes(2048)[-4:] == (768, 1024, 1536, 2048)
    assert bucket_sizes(100) == (16, 24, 32, 48, 64, 96, 100)
    assert bucket_sizes(8) == (8,)
    for step in (64, 512, 2048):
        sizes = bucket_sizes(step)
        # A piece longer than the smallest bucket is padded by less than half its length.
        assert all(b / a <= 1.5 for a, b in itertools.pairwise(sizes))


@pytest.mark.parametrize("shapes", [SHAPES, KEYED], ids=["buckets", "keyed"])
@pytest.mark.parametrize("n", LENGTHS)
def test_a_padded_prefill_leaves_the_cache_of_the_real_tokens(loaded, n, shapes):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    model, _ = loaded
    counted = Shapes(model)
    plain, padded = make_prompt_cache(model), make_prompt_cache(model)
    prefill(model, plain, tokens(n), STEP)
    prefill(counted, padded, tokens(n), STEP, shapes=shapes)
    # Every piece the model saw has a bucket's length (whole key steps after the first
    # piece, with KEYED); the cache holds n tokens.
    assert all(shape[1] in shapes.buckets for shape in counted.seen)
    assert all(shape[1] % shapes.key_step == 0 for shape in counted.seen[1:])
    assert sum(shape[1] for shape in counted.seen) >= n
    assert [layer.offset for layer in padded] == [n] * len(padded)
    for a, b in zip(plain, padded, strict=True):
        assert mx.allclose(a.keys[..., :n, :], b.keys[..., :n, :], atol=1e-5).item()
        assert mx.allclose(a.values[..., :n, :], b.values[..., :n, :], atol=1e-5).item()
    # The next token's logits, from the real last token, are the unpadded ones.
    last = mx.array([[9]], mx.uint32)
    assert mx.allclose(model(last, cache=plain), model(last, cache=padded), atol=1e-4).item()


@pytest.mark.parametrize("n", LENGTHS)
def test_greedy_tokens_are_those_of_the_unpadded_prompt(loaded, n):
    model, _ = loaded
    assert greedy(model, tokens(n, 5), 24, SHAPES) == greedy(
        model, tokens(n, 5), 24, PrefillShapes()
    )


def test_many_prompt_lengths_meet_few_prefill_shapes(loaded):
    model, _ = loaded
    lengths = range(2, 3 * STEP, 3)
    padded, plain = Shapes(model), Shapes(model)
    for n in lengths:
        greedy(padded, tokens(n), 2, SHAPES)
        greedy(plain, tokens(n), 2, PrefillShapes())
    assert {s for s in padded.seen if s[1] > 1} <= {(1, b) for b in SHAPES.buckets}
    assert len({s for s in plain.seen if s[1] > 1}) > 3 * len(SHAPES.buckets)


def test_caches_that_cannot_drop_padding_are_not_padded(loaded):
    from mlx_lm.models.cache import (
        ArraysCache,
        QuantizedKVCache,
        RotatingKVCache,
        make_prompt_cache,
    )

    model, _ = loaded
    assert SHAPES.padding([RotatingKVCache(max_size=32)] * 2, 5) == 0  # a sliding window
    assert SHAPES.padding([QuantizedKVCache()] * 2, 5) == 0
    assert SHAPES.padding([make_prompt_cache(model)[0], ArraysCache(2)], 5) == 0  # hybrid
    assert SHAPES.padding(make_prompt_cache(model), 5) == 11
    assert SHAPES.padding(make_prompt_cache(model), 16) == 0
    # Padding never reaches past the positions the model has.
    near_the_end = PrefillShapes(SHAPES.buckets, positions=12)
    assert near_the_end.padding(make_prompt_cache(model), 5) == 0


def test_the_warm_up_meets_every_bucket_from_an_empty_cache_and_after_a_piece(loaded):
    model, _ = loaded
    counted = Shapes(model)
    seconds = warm_shapes(counted, SHAPES, STEP)
    assert seconds > 0
    pieces = {s[1] for s in counted.seen}
    assert pieces == {*SHAPES.buckets, 1}
    # From an empty cache and after one whole piece: each bucket twice, STEP once more.
    for b in SHAPES.buckets:
        expected = 3 if b == STEP else 2
        assert sum(1 for s in counted.seen if s[1] == b) == expected


def test_a_piece_after_cached_tokens_is_padded_to_whole_key_steps():
    shapes = PrefillShapes(bucket_sizes(2048), key_step=256)
    assert [shapes.size(0, n) for n in (5, 20, 300, 2000)] == [16, 24, 384, 2048]
    assert [shapes.size(512, n) for n in (5, 20, 256, 257, 2000)] == [256, 256, 256, 512, 2048]
    assert PrefillShapes(bucket_sizes(2048)).size(512, 20) == 24  # key step 1: buckets
    # Whole steps longer than the longest piece: the bucket instead.
    assert PrefillShapes(bucket_sizes(100), key_step=256).size(10, 20) == 24


def test_the_warm_up_meets_whole_key_steps_after_a_piece(loaded):
    model, _ = loaded
    counted = Shapes(model)
    warm_shapes(counted, KEYED, STEP)
    pieces = [s[1] for s in counted.seen if s[1] > 1]
    # Each bucket from an empty cache; after the whole piece, 32 and 64 once each.
    assert sorted(pieces) == sorted([*KEYED.buckets, STEP, 32, STEP])


def test_a_prefix_is_cut_to_256_tokens_where_pieces_are_padded_unless_told(tiny_own_head):
    assert PrefillShapes.for_engine(True, 2048, None).key_step == KEY_STEP == 256
    assert PrefillShapes.for_engine(False, 2048, None).key_step == 1
    assert PrefillShapes.for_engine(True, 2048, None, 1).key_step == 1
    assert SimpleEngine(tiny_own_head, prefill_buckets=True)._shapes.key_step == 256
    assert SimpleEngine(tiny_own_head, prefix_key_step=64)._shapes.key_step == 64
    for bad in (0, -3, 2.5, True, "256"):
        with pytest.raises(ValueError, match=f"prefix_key_step must be .*got {bad!r}"):
            EngineOptions(prefix_key_step=bad)


def test_the_options_take_booleans_or_none():
    assert EngineOptions().prefill_buckets is None
    assert EngineOptions(prefill_buckets=True, warmup_shapes=False).warmup_shapes is False
    for name in ("prefill_buckets", "warmup_shapes"):
        with pytest.raises(TypeError, match=f"{name} must be True, False or None.*'yes'"):
            EngineOptions(**{name: "yes"})
        with pytest.raises(TypeError, match=name):
            EngineOptions(**{name: 1})


# ----------------------------------------------------------------- engines

PROMPTS = [
    "Hi",
    "The quick brown fox jumps over the lazy dog.",
    " ".join(f"word{i}" for i in range(40)),
    " ".join(f"token {i} and" for i in range(70)),
]
"""Prompts of a few to some hundred tokens: one piece, or several of ``STEP``."""


@pytest.fixture(scope="module")
def engines(tiny_own_head: Path) -> Iterator[dict[str, Any]]:
    common = {"prefill_step_size": STEP, "warmup_shapes": False}
    made = {
        "simple": SimpleEngine(tiny_own_head, prefill_buckets=False, **common),
        "simple_padded": SimpleEngine(
            tiny_own_head, prefill_buckets=True, prefix_key_step=KEY, **common
        ),
        "batched": BatchedEngine(tiny_own_head, prefill_buckets=False, **common),
        "batched_padded": BatchedEngine(
            tiny_own_head, prefill_buckets=True, prefix_key_step=KEY, **common
        ),
    }
    yield made
    for engine in made.values():
        asyncio.run(engine.stop())


async def reply(engine: Any, messages: list[dict[str, str]]) -> Any:
    return await engine.chat(messages, max_tokens=16, temperature=0.0)


@pytest.mark.parametrize("kind", ["simple", "batched"])
async def test_engines_reply_alike_padded_or_not_and_reuse_the_cache(engines, kind):
    plain, padded = engines[kind], engines[f"{kind}_padded"]
    served: list[int] = []
    for prompt in PROMPTS:
        first = [{"role": "user", "content": prompt}]
        a, b = await reply(plain, first), await reply(padded, first)
        assert b.tokens == a.tokens
        assert b.prompt_tokens == a.prompt_tokens
        # The next turn finds the first in the prefix cache, as much of it as unpadded.
        turn = [
            *first,
            {"role": "assistant", "content": a.text},
            {"role": "user", "content": "More."},
        ]
        a2, b2 = await reply(plain, turn), await reply(padded, turn)
        assert b2.tokens == a2.tokens
        # Padded, the cached prefix is served in whole key steps (none under one step).
        assert a2.cached_tokens > 0
        assert b2.cached_tokens == a2.cached_tokens // KEY * KEY
        served.append(b2.cached_tokens)
    assert max(served) > 0


async def test_a_shared_batch_replies_alike_with_padded_lone_requests(engines):
    plain, padded = engines["batched"], engines["batched_padded"]
    chats = [[{"role": "user", "content": p + " Go."}] for p in PROMPTS]
    a = await asyncio.gather(*(reply(plain, c) for c in chats))
    b = await asyncio.gather(*(reply(padded, c) for c in chats))
    assert [o.tokens for o in b] == [o.tokens for o in a]


async def test_the_engines_prefill_padded_pieces_only_when_asked(engines):
    for name, engine in engines.items():
        await engine.start()
        counted = Shapes(engine._model)
        engine._model = counted
        try:
            await reply(engine, [{"role": "user", "content": PROMPTS[2] + " once more"}])
        finally:
            engine._model = counted.model
        pieces = {s[1] for s in counted.seen if s[1] > 1}
        padded = name.endswith("_padded")
        assert (pieces <= set(bucket_sizes(STEP))) if padded else bool(pieces - {STEP}), name


async def test_the_warm_up_runs_at_load_and_is_timed(tiny_own_head):
    engine = SimpleEngine(tiny_own_head, prefill_step_size=STEP, prefill_buckets=True)
    off = SimpleEngine(
        tiny_own_head, prefill_step_size=STEP, cache_memory_mb=1, prefill_buckets=False
    )
    try:
        assert engine.warmup_seconds is None
        await engine.start()
        await off.start()
        # On by default where prefill_buckets is (and both on by default on CUDA only).
        assert engine.warmup_seconds is not None and engine.warmup_seconds > 0
        assert off.warmup_seconds is None
        out = await reply(engine, [{"role": "user", "content": "Hello there"}])
        assert out.completion_tokens == 16
    finally:
        await engine.stop()
        await off.stop()


@pytest.mark.parametrize(("buckets", "seqs"), [(True, 6), (False, 5), (True, 2)])
async def test_a_batched_engine_meets_a_batch_at_load_and_leaves_no_trace(
    tiny_own_head, engines, monkeypatch, buckets, seqs
):
    """The warm-up runs small batches (rows of unequal length, one joining with its own
    cache, rows ending; then one row joining a step up to ``max_num_seqs``) through
    mlx-lm's generator; with padded pieces, groups of requests arriving together with
    the spare placeholder, prefilled at each bucket up to 256 tokens and each row count
    the engine pads a group to. No batch is larger than the engine's own can be;
    afterwards nothing of it remains (no generator, no cached prefix) and the engine
    replies as one without it."""
    from mlx_lm.generate import BatchGenerator, PromptProcessingBatch

    rows: list[int] = []  # the rows of every decode step the generator runs
    threads: set[str] = set()  # the threads those steps ran on
    prefills: set[tuple[int, int]] = set()  # (rows, tokens) of every batched prefill
    real_next, real_prompt = BatchGenerator.next, PromptProcessingBatch.prompt

    def counted(self: Any) -> Any:
        prompts, generated = real_next(self)
        rows.append(len(generated))
        threads.add(threading.current_thread().name)
        return prompts, generated

    def prompted(self: Any, tokens: Any) -> Any:
        prefills.add((len(tokens), max(map(len, tokens), default=0)))
        return real_prompt(self, tokens)

    monkeypatch.setattr(BatchGenerator, "next", counted)
    monkeypatch.setattr(PromptProcessingBatch, "prompt", prompted)
    engine = BatchedEngine(
        tiny_own_head,
        max_num_seqs=seqs,
        prefill_step_size=STEP,
        prefill_buckets=buckets,
        warmup_shapes=True,
    )
    try:
        await engine.start()
        assert engine.warmup_seconds is not None and engine.warmup_seconds > 0
        # Every batch size the engine can run has decoded, and no larger one (a full
        # group's placeholder leaves after the prefill, as in the engine).
        assert set(rows) - {0} == set(range(1, seqs + 1))
        # A group's prefill at every bucket and every row count the engine pads a group
        # to in an empty batch (the spare place included), and at no other row count.
        counts = group_row_counts(seqs + 1)
        assert counts[0] == seqs + 1 and counts[-1] == 2
        grid = {(r, b) for r in counts for b in bucket_sizes(STEP) if b <= GROUP_TOKENS}
        groups = {(r, n) for r, n in prefills if n in bucket_sizes(STEP)}
        assert groups == (grid if buckets else set()), sorted(grid ^ groups)
        assert engine._generator is None
        assert engine.get_cache_stats()["entry_count"] == 0
        # It ran on the process's side thread: the owner thread keeps nothing of it.
        assert threads == {f"{owner.ASIDE_NAME}_0"}, threads
        chats = [[{"role": "user", "content": p + " Again."}] for p in PROMPTS]
        warmed = await asyncio.gather(*(reply(engine, c) for c in chats))
        plain = engines["batched_padded" if buckets else "batched"]
        cold = await asyncio.gather(*(reply(plain, c) for c in chats))
        assert [o.tokens for o in warmed] == [o.tokens for o in cold]
    finally:
        await engine.stop()


@contextlib.contextmanager
def forward_shapes(engine: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple]]:
    """The input shapes of every forward pass of ``engine``'s model while the block runs
    (the batch generator's own included)."""
    model_class = type(engine._model)
    seen: list[tuple[int, ...]] = []
    forward = model_class.__call__

    def recorded(self: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(tuple(inputs.shape))
        return forward(self, inputs, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(model_class, "__call__", recorded)
        yield seen


async def staggered(
    engine: Any, chats: list[list[dict[str, str]]], monkeypatch: pytest.MonkeyPatch
) -> tuple[list[Any], list[tuple[int, ...]]]:
    """The first chat starts; each next one is sent once the previous has a token, so it
    joins the running batch on its own. Returns the replies and the input shapes of every
    forward pass (the batch generator's own included)."""
    await engine.start()
    with forward_shapes(engine, monkeypatch) as seen:
        tasks = []
        for i, chat in enumerate(chats):
            first = asyncio.Event()

            async def run(
                chat: list[dict[str, str]] = chat, first: asyncio.Event = first, n: int = 40 - 6 * i
            ) -> Any:
                last = None
                stream = engine.stream_chat(chat, max_tokens=n, temperature=0.0)
                async for out in stream:
                    first.set()
                    last = out
                return last

            tasks.append(asyncio.create_task(run()))
            await first.wait()
        outs = await asyncio.gather(*tasks)
    return outs, seen


async def test_requests_joining_a_running_batch_one_by_one_are_prefilled_padded(
    engines, monkeypatch
):
    # Prompts of one piece or less, none cached: a newcomer over one piece is left to the
    # generator, which prefills it at its own length.
    texts = [*PROMPTS[:2], "Say more", " ".join(f"word{i}" for i in range(5))]
    chats = [[{"role": "user", "content": p + " Now."}] for p in texts]
    for name in ("batched", "batched_padded"):
        await engines[name].start()
        engines[name]._prefix.clear()
    plain, plain_seen = await staggered(engines["batched"], chats, monkeypatch)
    padded, seen = await staggered(engines["batched_padded"], chats, monkeypatch)
    assert [o.tokens for o in padded] == [o.tokens for o in plain]
    # Every prefill piece has a bucket's length and one row (the first request's alone,
    # the others' on their own before they join); the batch decodes one token a row.
    assert max(rows for rows, _ in seen) >= 3  # they did share a batch
    pieces = {s for s in seen if s[1] > 1}
    assert pieces and all(rows == 1 and n in bucket_sizes(STEP) for rows, n in pieces)
    # Unpadded, the generator prefilled each newcomer at its own length.
    assert {s for s in plain_seen if s[1] > 1} - {(1, b) for b in bucket_sizes(STEP)}


async def together(engine: Any, chats: list[list[dict[str, str]]], monkeypatch: Any) -> tuple:
    """The chats sent at once; the replies and the input shapes of every forward pass."""
    await engine.start()
    with forward_shapes(engine, monkeypatch) as seen:
        outs = await asyncio.gather(*(reply(engine, c) for c in chats))
    return outs, seen


@pytest.mark.parametrize("n", [2, 3, 5])
async def test_requests_arriving_together_are_prefilled_as_one_padded_group(
    engines, monkeypatch, n
):
    """Prompts of one piece sent at once are prefilled in one batch of a bucket's length
    and one of a few row counts (placeholder rows, taken out before they decode), so the
    replies are token for token the unpadded ones; the next turns reuse their caches."""
    chats = [
        [{"role": "user", "content": f"{n}: " + " ".join(f"w{j}" for j in range(6 + 2 * i))}]
        for i in range(n)
    ]
    plain, padded = engines["batched"], engines["batched_padded"]
    before = padded.get_stats()["grouped_prefill_requests"]
    a, _ = await together(plain, chats, monkeypatch)
    b, seen = await together(padded, chats, monkeypatch)
    assert [o.tokens for o in b] == [o.tokens for o in a]
    assert padded.get_stats()["grouped_prefill_requests"] - before == n
    (rows, length), *more = [s for s in seen if s[1] > 1]  # one prefill of the group
    assert not more and length in bucket_sizes(STEP)
    assert rows >= n and rows in ROWS  # placeholders up to one of a few row counts
    turns = [
        [*c, {"role": "assistant", "content": o.text}, {"role": "user", "content": "And?"}]
        for c, o in zip(chats, a, strict=True)
    ]
    a2, _ = await together(plain, turns, monkeypatch)
    before = padded.get_stats()["grouped_prefill_requests"]
    b2, seen = await together(padded, turns, monkeypatch)
    # After their cached prefixes, as one group again.
    assert padded.get_stats()["grouped_prefill_requests"] - before == n
    (rows, length), *more = [s for s in seen if s[1] > 1]
    assert not more and length in bucket_sizes(STEP) and rows in ROWS
    assert [o.tokens for o in b2] == [o.tokens for o in a2]
    assert [o.cached_tokens for o in b2] == [o.cached_tokens // KEY * KEY for o in a2]
    assert all(o.cached_tokens > 0 for o in b2)


@pytest.mark.parametrize("n", [2, 3])
async def test_a_group_that_fills_the_batch_is_padded_to_a_bucket_by_the_spare_place(
    tiny_own_head, engines, monkeypatch, n
):
    """``max_num_seqs`` requests at once: the generator's one place beyond it holds the
    placeholder that pads their prefill to a bucket's length (none decodes with them)."""
    engine = BatchedEngine(
        tiny_own_head,
        max_num_seqs=n,
        prefill_step_size=STEP,
        prefill_buckets=True,
        warmup_shapes=False,
    )
    chats = [
        [{"role": "user", "content": " ".join(f"v{j}" for j in range(2 + 3 * i)) + " full"}]
        for i in range(n)
    ]
    try:
        outs, seen = await together(engine, chats, monkeypatch)
        plain, _ = await together(engines["batched"], chats, monkeypatch)
        assert [o.tokens for o in outs] == [o.tokens for o in plain]
        (rows, length), *more = [s for s in seen if s[1] > 1]
        assert not more and rows == n + 1 and length in bucket_sizes(STEP)
        assert all(r <= n for r, m in seen if m == 1)  # the placeholder never decodes
        assert engine.get_stats()["peak_batch_size"] == n
    finally:
        await engine.stop()


async def test_a_later_turn_s_pieces_are_padded_to_whole_key_steps(tiny_own_head, engines):
    """After a cached prefix each piece is padded to whole key steps (32 here), where a
    bucket (16, 24, 48) would have been shorter; the replies are the unpadded engine's."""
    keyed = SimpleEngine(
        tiny_own_head,
        prefill_step_size=STEP,
        prefill_buckets=True,
        prefix_key_step=32,
        warmup_shapes=False,
    )
    met: list[tuple[int, int, int, int]] = []
    buckets_instead: list[int] = []
    try:
        for i, n in enumerate((5, 6, 7, 9)):
            chat = [{"role": "user", "content": " ".join(f"turn {j} of" for j in range(n))}]
            outs = []
            for engine in (engines["simple"], keyed):
                first = await reply(engine, chat)
                turn = [*chat, {"role": "assistant", "content": first.text}]
                recorder = KeyLengths(engine._model) if engine is keyed else None
                engine._model = recorder or engine._model
                try:
                    outs.append(await reply(engine, [*turn, {"role": "user", "content": f"{i}?"}]))
                finally:
                    engine._model = recorder.model if recorder else engine._model
                if recorder:
                    met += recorder.seen
            assert outs[1].tokens == outs[0].tokens
            assert outs[1].cached_tokens % 32 == 0 < outs[1].cached_tokens
            rest = outs[1].prompt_tokens - 1 - outs[1].cached_tokens
            buckets_instead.append(SHAPES.size(0, rest % STEP or STEP))
    finally:
        await keyed.stop()
    pieces = [n for _, n, held, _ in met if held > 0]
    assert pieces and all(n % 32 == 0 for n in pieces)
    assert any(b % 32 for b in buckets_instead)  # a bucket would have differed


async def test_after_its_placeholders_leave_a_group_decodes_as_the_unpadded_batch(
    engines, monkeypatch
):
    """The placeholder is the group's longest row: when it leaves, mlx-lm drops the left
    padding no row needs by slicing the batch's buffers. They are grown back to whole
    steps, so the batch decodes over the layout the unpadded batch has: the same buffer
    lengths, positions and left padding at every step."""
    from mlx_lm.generate import GenerationBatch

    chats = [[{"role": "user", "content": f"Layout {i}: " + "ab " * (3 + 4 * i)}] for i in range(5)]
    real_step = GenerationBatch._step
    layouts: list[tuple[int, int, int, tuple[int, ...]]] = []

    def recorded(self: Any) -> Any:
        layer = self.prompt_cache[0]
        out = real_step(self)
        padding = tuple(layer.left_padding.tolist())
        layouts.append((len(self.uids), layer.keys.shape[2], layer._idx, padding))
        return out

    monkeypatch.setattr(GenerationBatch, "_step", recorded)
    seen = {}
    for name in ("batched", "batched_padded"):
        await engines[name].start()
        engines[name]._prefix.clear()
        layouts.clear()
        before = engines[name].get_stats()["grouped_prefill_requests"]
        outs = await asyncio.gather(*(reply(engines[name], c) for c in chats))
        grouped = engines[name].get_stats()["grouped_prefill_requests"] - before
        seen[name] = (list(layouts), [o.tokens for o in outs], grouped)
    assert seen["batched_padded"][2] == len(chats) and seen["batched"][2] == 0
    assert seen["batched_padded"][1] == seen["batched"][1]
    assert seen["batched_padded"][0] == seen["batched"][0]
    assert all(buffer % 256 == 0 for _, buffer, _, _ in seen["batched_padded"][0])


@pytest.mark.parametrize("case", ["fresh", "cached", "on-a-bucket", "placeholders-first"])
def test_placeholders_taken_out_leave_the_batch_as_mlx_lms_remove_and_realign_would(
    tiny_own_head: Path, case: str, monkeypatch: pytest.MonkeyPatch
):
    """``drop_placeholders`` cuts the placeholders' rows and the padding no kept row
    needs off every layer itself (the rows kept are a slice when the placeholders are
    last); the batch it leaves is mlx-lm's ``remove`` followed by ``realign``: the same
    rows, buffers (whole steps), positions, left padding and dtype, and the same greedy
    tokens after, in bfloat16. Cases: a fresh group (its buffers grown back to a whole
    step); a group with a cached prefix (buffers already whole steps once the padding is
    cut); a group whose longest row is on a bucket (nothing to cut but the rows); and
    placeholders that are not the batch's last rows (mlx-lm's ``remove`` does it all)."""
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

    from mlx_integrations.engine.batched.arrivals import drop_placeholders, realign

    model, _ = mlx_lm.load(str(tiny_own_head))
    model.set_dtype(mx.bfloat16)  # as models on a GPU mostly are
    prefix: list[int] = []
    if case == "cached":
        prefix = tokens(301, seed=3)  # with these rows: 45 positions cut, a whole step left
        group, padding = [tokens(n, seed=n) for n in (21, 11, 65)], [[0] * 66]
    elif case == "on-a-bucket":
        group, padding = [tokens(33, seed=1), tokens(6, seed=2)], [[0] * 2]
    else:
        group, padding = [tokens(n, seed=n) for n in (5, 17, 9)], [[0] * 33, [0] * 2]
    first = case == "placeholders-first"

    def prefilled() -> tuple[Any, list[int], list[int]]:
        generator = BatchGenerator(model, completion_batch_size=8, prefill_batch_size=8)
        caches: list[Any] = [None] * len(group)
        if prefix:
            caches[0] = make_prompt_cache(model)
            model(mx.array([prefix]), cache=caches[0])
        rows = padding + group if first else group + padding
        caches = [None] * len(padding) + caches if first else caches + [None] * len(padding)
        held = [list(prefix) if c is not None else [] for c in caches]  # mlx-lm extends them
        uids = generator.insert(rows, max_tokens=[6] * len(rows), caches=caches, all_tokens=held)
        generator.next()  # the prefill
        n = len(padding)
        real, fake = (uids[n:], uids[:n]) if first else (uids[:-n], uids[-n:])
        return generator, real, fake

    def layout(generator: Any) -> list[Any]:
        batch = generator._prompt_batch
        layer = batch.prompt_cache[0]
        return [
            batch.uids,
            [len(t) for t in batch.tokens],
            len(generator._currently_processing),
            layer.keys.shape,
            layer.keys.dtype,
            layer.values.dtype,
            layer._idx,
            layer.left_padding.tolist(),
            layer.offset.tolist(),
        ]

    def decoded(generator: Any, uids: list[int]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {u: [] for u in uids}
        while any(len(t) < 6 for t in out.values()):
            for r in generator.next()[1]:
                out[r.uid].append(r.token)
        return out

    ours, real, fake = prefilled()
    theirs, _, _ = prefilled()
    filtered = []  # mlx-lm's per-layer cut (the gather), taken only on the fallback
    real_filter = BatchKVCache.filter
    monkeypatch.setattr(
        BatchKVCache, "filter", lambda self, idx: (filtered.append(1), real_filter(self, idx))
    )
    drop_placeholders(ours, fake)
    assert bool(filtered) == first
    theirs.remove(fake)
    realign(theirs)
    assert layout(ours) == layout(theirs)
    assert layout(ours)[3][0] == len(group) and layout(ours)[3][2] % 256 == 0
    assert layout(ours)[4] == layout(ours)[5] == mx.bfloat16  # the model's, kept
    pairs = zip(ours._prompt_batch.prompt_cache, theirs._prompt_batch.prompt_cache, strict=True)
    for a, b in pairs:
        assert mx.array_equal(a.keys, b.keys) and mx.array_equal(a.values, b.values)
    assert decoded(ours, real) == decoded(theirs, real)


async def test_a_group_with_a_prompt_over_one_piece_or_one_left_to_prefill_is_not_padded(
    engines, monkeypatch
):
    padded = engines["batched_padded"]
    long_text = " ".join(f"item {i} or" for i in range(70))  # no other test's prefix
    long_chat = [{"role": "user", "content": long_text}]
    short = [[{"role": "user", "content": f"Short {i}."}] for i in range(2)]
    before = padded.get_stats()["grouped_prefill_requests"]
    outs, seen = await together(padded, [long_chat, *short], monkeypatch)
    # The long prompt sets the batch's pieces (the generator's own): nothing to pad, the
    # three rows go in alone (no placeholder row).
    assert padded.get_stats()["grouped_prefill_requests"] == before
    assert all(o.completion_tokens == 16 for o in outs)
    assert (3, STEP) in seen and not any(rows > 3 for rows, n in seen if n > 1)
    # Sent again, a prompt is in the prefix cache but its last token (a prompt of whole
    # key steps and one token): with one other request, a group of one is left to prefill.
    candidates = [[{"role": "user", "content": f"Short {i}."}] for i in range(2, 30)]
    for chat in candidates:
        if ((await reply(padded, chat)).prompt_tokens - 1) % KEY == 0:
            break
    else:
        pytest.fail(f"no prompt of whole key steps and one token among {candidates}")
    again = [chat, [{"role": "user", "content": "Short 99."}]]
    outs, _ = await together(padded, again, monkeypatch)
    assert outs[0].cached_tokens == outs[0].prompt_tokens - 1
    assert padded.get_stats()["grouped_prefill_requests"] == before


def test_placeholders_pad_a_group_to_a_bucket_and_a_few_row_counts_within_its_room():
    from mlx_integrations.engine.batched.arrivals import group_rows, placeholder_prompts

    def fresh(*rests: int) -> list[tuple[int, int]]:  # nothing cached
        return [(0, n) for n in rests]

    assert [group_rows(n) for n in range(1, 14)] == [1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16]
    # Rests 5, 9, 7: a placeholder of 16 (the bucket) sets the length; with it, 4 rows.
    # Its last token is held back, as a prompt's is.
    assert [len(r) for r in placeholder_prompts(fresh(5, 9, 7), room=6, shapes=SHAPES)] == [17]
    # On a bucket already: rows only (5 become 6). Four rows: nothing to add.
    rows = placeholder_prompts(fresh(16, 3, 16, 2, 2), room=6, shapes=SHAPES)
    assert [len(r) for r in rows] == [2]
    assert placeholder_prompts(fresh(16, 16, 3, 5), room=6, shapes=SHAPES) == []
    # No room, no pieces padded, or a rest over one piece: nothing.
    assert placeholder_prompts(fresh(5, 9), room=0, shapes=SHAPES) == []
    assert placeholder_prompts(fresh(5, 9), room=6, shapes=PrefillShapes()) == []
    assert placeholder_prompts(fresh(5, STEP + 1), room=6, shapes=SHAPES) == []

    # A model whose cache is not a plain KV cache (here: a sliding window) gets none.
    class Windowed:
        def make_cache(self) -> list[Any]:
            from mlx_lm.models.cache import RotatingKVCache

            return [RotatingKVCache(max_size=32)]

    assert placeholder_prompts(fresh(5, 9, 7), room=6, shapes=SHAPES, model=Windowed()) == []
    # A padded row must not reach past the model's positions: 40 cached and 9 to
    # prefill, padded to 16, would end at 56.
    near = PrefillShapes(SHAPES.buckets, positions=50)
    assert placeholder_prompts([(40, 9), (0, 5)], room=6, shapes=near) == []
    assert placeholder_prompts([(30, 9), (0, 5)], room=6, shapes=near) != []
    # Whole key steps (32) after 40 cached would end at 72: the bucket (16) still fits,
    # as for a lone piece.
    stepped = PrefillShapes(SHAPES.buckets, positions=60, key_step=32)
    assert [len(r) for r in placeholder_prompts([(40, 9), (0, 5)], room=6, shapes=stepped)] == [17]
    assert stepped.fitted(40, 9) == 16 and stepped.fitted(50, 9) is None
    # Room for the length placeholder but not for the rows: 5 rows (6 would be padded).
    assert [len(r) for r in placeholder_prompts(fresh(5, 9, 3, 4), room=1, shapes=SHAPES)] == [17]


# ------------------------------------------------------- prefixes in whole key steps


def kv_cache(n: int) -> list[Any]:
    """A one-layer plain KV cache of ``n`` positions, position p holding the value p."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    layer = KVCache()
    at = mx.broadcast_to(mx.arange(n, dtype=mx.float32)[None, None, :, None], (1, 2, n, 32))
    layer.update_and_fetch(at, at)
    return [layer]


def holds_positions(cache: list[Any], n: int) -> bool:
    """Whether the cache holds positions 0..n-1 of :func:`kv_cache`, in buffers n long."""
    import mlx.core as mx

    keys, values = cache[0].keys_and_values()
    want = mx.arange(n, dtype=mx.float32)[None, None, :, None]
    return (
        cache[0].offset == cache[0].keys.shape[2] == n
        and mx.all(keys == want).item()
        and mx.all(values == want).item()
    )


def test_a_prefix_is_served_in_whole_key_steps_in_buffers_that_long():
    import mlx.core as mx

    from mlx_integrations.engine.cache.prefix_cache import PrefixCache

    pc = PrefixCache()
    conversation = list(range(1, 601))
    pc.put(conversation, kv_cache(600))
    # Another prompt sharing 300 tokens gets a copy of the first 256, 256 long.
    copy, reused = pc.take([*conversation[:300], *[9999] * 50], key_step=256)
    assert reused == 256 and holds_positions(copy, 256)
    copy[0].update_and_fetch(mx.zeros((1, 2, 20, 32)), mx.zeros((1, 2, 20, 32)))
    # The next piece grows it as mlx-lm grows a cache it filled itself.
    assert copy[0].keys.shape[2] == 256 + 256 and copy[0].offset == 276
    assert pc.stats()["entry_count"] == 1
    # A prompt sharing less than one step is a miss, where it was a hit of 200 before.
    assert pc.take([*conversation[:200], 9999], key_step=256) == (None, 0)
    assert pc.take([*conversation[:200], 9999])[1] == 200
    # The conversation's next turn takes its entry (it leaves the table), cut to 512;
    # what the copy above wrote never reached it.
    misses = pc.stats()["misses"]
    own, reused = pc.take([*conversation, 7, 8, 9], key_step=256)
    assert reused == 512 and holds_positions(own, 512)
    assert pc.stats()["entry_count"] == 0 and pc.stats()["misses"] == misses
    assert pc.stats()["tokens_saved"] == 256 + 200 + 512


def test_a_pinned_prefix_is_served_whole_to_prompts_that_extend_it_and_stays():
    from mlx_integrations.engine.cache.prefix_cache import PrefixCache

    pc = PrefixCache()
    system = list(range(1, 301))
    pc.put(system, kv_cache(300), pinned=True)
    # Its whole length every time (a system prompt): its key lengths repeat as they are.
    for _ in range(2):
        copy, reused = pc.take([*system, 5, 6], key_step=256)
        assert reused == 300 and holds_positions(copy, 300)
    # A prompt sharing part of it is served whole steps of it.
    part, reused = pc.take([*system[:280], 7, 8], key_step=256)
    assert reused == 256 and holds_positions(part, 256)
    entry = pc.take([*system, 5])[0]
    assert entry is not None and holds_positions(entry, 300)


def test_the_conversation_s_own_entry_wins_a_tie_and_a_grown_one_replaces_it():
    from mlx_integrations.engine.cache.prefix_cache import PrefixCache

    pc = PrefixCache()
    mine = list(range(1, 701))
    other = [*mine[:530], *range(5000, 5100)]
    pc.put(other, kv_cache(len(other)))
    pc.put(mine, kv_cache(700))
    # Both cut to 512: the entry the prompt extends whole is handed over, not copied.
    _, reused = pc.take([*mine, 1, 2], key_step=256)
    assert reused == 512 and pc.stats()["entry_count"] == 1
    # A short conversation's turns: each new entry replaces the one it grows from,
    # though none of them was served (shorter than one step).
    pc.clear()
    turn = list(range(1, 151))
    for grown in (230, 250):
        assert pc.take([*turn, 9], key_step=256) == (None, 0)
        pc.put(list(range(1, grown + 1)), kv_cache(grown))
        turn = list(range(1, grown + 1))
    assert pc.stats()["entry_count"] == 1


def test_caches_that_cannot_be_cut_are_served_as_before():
    from mlx_lm.models.cache import QuantizedKVCache

    from mlx_integrations.engine.cache.prefix_cache import PrefixCache, cache_offset

    pc = PrefixCache()
    quantized = kv_cache(300)
    layer = quantized[0].to_quantized(group_size=32, bits=8)
    assert isinstance(layer, QuantizedKVCache)
    tokens = list(range(1, 301))
    pc.put(tokens, [layer])
    cache, reused = pc.take([*tokens, 5], key_step=256)
    assert reused == 300 and cache_offset(cache) == 300


class KeyLengths:
    """The real model, recording for every prefill piece (more than one token a row):
    (rows, piece length, positions cached before it, its cache's buffer length)."""

    def __init__(self, model: Any):
        self.model = model
        self.seen: list[tuple[int, int, int, int]] = []

    def __call__(self, inputs: Any, *args: Any, cache: Any = None, **kwargs: Any) -> Any:
        if inputs.shape[1] > 1 and cache is not None and hasattr(cache[0], "keys"):
            layer = cache[0]
            buffer = layer.keys.shape[2] if layer.keys is not None else 0
            self.seen.append((inputs.shape[0], inputs.shape[1], int(layer.offset), buffer))
        return self.model(inputs, *args, cache=cache, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


@pytest.mark.parametrize("kind", ["simple", "batched"])
async def test_later_turns_meet_few_key_lengths_where_pieces_are_padded(
    tiny_own_head, engines, kind
):
    """Later turns of conversations of unequal lengths (about 300 to 400 tokens):
    unpadded, each turn's first piece follows a cached prefix of its own length; padded
    (with the default key step, 256), every one follows the same 256 tokens, laid out
    exactly that long, and the replies are token for token the unpadded engine's."""
    firsts = [" ".join(f"token {i} and" for i in range(n)) for n in (36, 41, 46)]
    made = SimpleEngine if kind == "simple" else BatchedEngine
    padded = made(tiny_own_head, prefill_step_size=STEP, prefill_buckets=True, warmup_shapes=False)
    met: dict[str, list[list[tuple[int, int, int, int]]]] = {}
    replies: dict[str, list[list[int]]] = {}
    try:
        for name, engine in ((kind, engines[kind]), ("padded", padded)):
            await engine.start()
            engine._prefix.clear()
            met[name], outs = [], []
            for prompt in firsts:
                chat = [{"role": "user", "content": prompt}]
                first = await reply(engine, chat)
                turn = [*chat, {"role": "assistant", "content": first.text}]
                recorder = KeyLengths(engine._model)
                engine._model = recorder
                try:
                    outs.append(await reply(engine, [*turn, {"role": "user", "content": "And?"}]))
                finally:
                    engine._model = recorder.model
                met[name].append(recorder.seen)
            replies[name] = [o.tokens for o in outs]
            assert all(o.cached_tokens >= KEY_STEP for o in outs), name
    finally:
        await padded.stop()
    assert replies["padded"] == replies[kind]
    starts = [turn[0][2] for turn in met[kind]]
    assert len(set(starts)) == len(firsts) and min(starts) > KEY_STEP
    for turn in met["padded"]:
        (rows, _, offset, buffer), *more = turn
        assert (rows, offset, buffer) == (1, KEY_STEP, KEY_STEP)
        # The rest in pieces of STEP, the last a bucket long.
        assert [piece[1] for piece in more[:-1]] == [STEP] * (len(more) - 1)
        assert all(piece[1] in bucket_sizes(STEP) for piece in turn)


@pytest.mark.parametrize("seqs", [2, 5, 16])
def test_the_warm_up_s_row_counts_are_those_groups_in_an_empty_batch_are_padded_to(seqs):
    """Every group of 2 to ``max_num_seqs`` requests arriving at an empty batch, on a
    bucket or not, is prefilled at one of :func:`group_row_counts`, and each of those is
    met by some group (what the warm-up prefills at load)."""
    from mlx_integrations.engine.batched.arrivals import SPARE, placeholder_prompts

    places = seqs + SPARE
    met = set()
    for n in range(2, seqs + 1):
        for rest in (5, 16):  # padded to the bucket (16) by a placeholder, or on it
            rests = [(0, rest)] * n
            met.add(n + len(placeholder_prompts(rests, room=places - n, shapes=SHAPES)))
    assert met == set(group_row_counts(places))
