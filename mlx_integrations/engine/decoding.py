"""The decode loop's pieces that every engine on mlx-lm shares.

Prefill in pieces, plain one-token steps pipelined as mlx-lm's ``generate_step``, the
return of MLX's buffer pool during a reply, and the repair of MLX's random state after
a failed step. Owner thread only: the arrays made here belong to its stream.

Prefill shapes: MLX's CUDA backend sets up work for each new shape it meets (a cuDNN
attention graph per query and key length, CUDA graphs per kernel layout), and keeps
what it set up per thread. So a prompt of a length the owner thread has not seen pays
that setup before its first token, often more than the prefill itself. With
:class:`PrefillShapes` the last piece of a prompt is padded at its end to one of a few
sizes (``buckets``) and the padding trimmed from the KV cache right after: a causal
mask keeps every real token from seeing the padding, so the cache holds exactly what
the unpadded prefill leaves, and the owner thread meets few distinct shapes, which
:func:`warm_shapes` can set up when the model loads.

The attention's set-up is kept per query length, key length and KV buffer layout, and a
piece prefilled after a cached prefix has a key length of the prefix plus the piece:
where pieces are padded, a cached prefix is served in whole multiples of
:data:`KEY_STEP` tokens (``PrefixCache.take``), in buffers exactly that long, and a piece
after cached tokens is padded to whole key steps too: the (piece, key length) pairs a
later turn, a shared prefix or a long prompt's last piece meets are then few.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from mlx_integrations.engine.cache.cut import plain_kv

logger = logging.getLogger(__name__)

Step = tuple[int, int, bool]
"""``(token, tokens drafted for the round this token opens, accepted draft)``."""

CLEAR_EVERY = 256
"""Decode steps between two returns of MLX's buffer pool (as mlx-lm's ``generate_step``)."""


def return_buffers(produced: int) -> None:
    """Give MLX's buffer pool back after the reply's first token (the prefill's
    temporaries) and every ``CLEAR_EVERY`` tokens after it, as mlx-lm does."""
    import mlx.core as mx

    if produced % CLEAR_EVERY == 1:
        mx.clear_cache()


SMALLEST_BUCKET = 16
"""The shortest size a prompt's last prefill piece is padded to."""

KEY_STEP = 256
"""Where pieces are padded, a cached prefix is served in multiples of this many tokens:
the step by which mlx-lm's KV cache grows its buffers, which MLX's CUDA attention takes
as the sign of a cache it may read whole. The key lengths a piece after a prefix meets
are then whole steps plus a bucket; the up to 255 tokens left out are prefilled again
with the piece (on a GPU a few more tokens in a pass that reads every weight anyway)."""


def bucket_sizes(step_size: int) -> tuple[int, ...]:
    """The sizes a prefill piece is padded to: 16, 24, 32, 48, 64, 96... (powers of
    two and one and a half times them), then ``step_size``, the longest piece.

    A piece is padded by less than half its length (a third on average).
    """
    sizes = {step_size}
    n = SMALLEST_BUCKET
    while n < step_size:
        sizes.update(size for size in (n, n * 3 // 2) if size < step_size)
        n *= 2
    return tuple(sorted(sizes))


@dataclass(frozen=True)
class PrefillShapes:
    """How prefill pieces are padded so that a process meets few distinct shapes.

    Attributes:
        buckets: Sizes a piece is padded to (ascending); empty pads nothing.
        positions: Positions padding may reach (the model's context window): pads past
            it could index beyond a model's table of learned positions. None: no limit.
        key_step: A cached prefix is served in multiples of this many tokens
            (:data:`KEY_STEP` where pieces are padded; 1: as much as is cached).
    """

    buckets: tuple[int, ...] = ()
    positions: int | None = None
    key_step: int = 1

    @classmethod
    def for_engine(
        cls,
        enabled: bool | None,
        step_size: int,
        positions: int | None,
        key_step: int | None = None,
    ) -> PrefillShapes:
        """The shapes an engine prefills with: ``enabled`` None pads on CUDA only;
        ``key_step`` None is :data:`KEY_STEP` where pieces are padded, 1 elsewhere."""
        if enabled is None:
            enabled = cuda_default_device()
        if key_step is None:
            key_step = KEY_STEP if enabled else 1
        return cls(bucket_sizes(step_size) if enabled else (), positions, key_step)

    def warm(self, option: bool | None) -> bool:
        """Whether the engine meets these shapes at load: ``option`` (``warmup_shapes``),
        None for wherever pieces are padded."""
        return option if option is not None else bool(self.buckets)

    def pads(self, cache: list[Any]) -> bool:
        """Whether pieces fed into ``cache`` are padded: buckets, and plain KV layers (a
        sliding window could drop real tokens for pads, a state-space layer cannot be
        trimmed, a quantized cache is not padded)."""
        return bool(self.buckets) and plain_kv(cache)

    def size(self, held: int, n: int) -> int:
        """The length a piece of ``n`` tokens is padded to after ``held`` cached ones: a
        bucket's from an empty cache; whole key steps after cached tokens (where the key
        step is more than one token), so that the key lengths, whole steps too, repeat."""
        if held and self.key_step > 1 and self.buckets:
            whole = -(-n // self.key_step) * self.key_step
            if whole <= self.buckets[-1]:
                return whole
        return next((b for b in self.buckets if b >= n), n)

    def fitted(self, held: int, n: int) -> int | None:
        """:meth:`size`, or the bucket's where whole key steps would pass the model's
        positions; None where neither fits (the piece is then not padded)."""
        size = self.size(held, n)
        if self.positions is not None and held + size > self.positions:
            size = self.size(0, n)  # the bucket, shorter than whole steps, may still fit
            if held + size > self.positions:
                return None
        return size

    def padding(self, cache: list[Any], n: int) -> int:
        """Tokens to append to a piece of ``n`` tokens fed into ``cache``."""
        if not self.pads(cache):
            return 0
        size = self.fitted(cache[0].offset, n)
        return 0 if size is None else size - n


NO_PADDING = PrefillShapes()


def cuda_default_device() -> bool:
    """Whether MLX computes on a CUDA GPU by default."""
    import mlx.core as mx

    cuda = getattr(mx, "cuda", None)
    return bool(mx.default_device().type == mx.gpu and cuda is not None and cuda.is_available())


class PrefillStopped(Exception):
    """The request whose prompt was being prefilled was aborted between two pieces."""


_stop = threading.local()


@contextmanager
def stopping_prefill(stop: Callable[[], bool]) -> Iterator[None]:
    """Within this block, on this thread, :func:`prefill` checks ``stop`` before each
    piece and raises :class:`PrefillStopped` when it says so: a request aborted during
    a long prompt frees its owner thread after the piece in progress, not after the
    whole prompt."""
    previous = getattr(_stop, "check", None)
    _stop.check = stop
    try:
        yield
    finally:
        _stop.check = previous


PIECE_S = 1.0
"""Seconds a prefill piece of a request that may be stopped should take at most: a
long prompt on a slow device (the KV cache grows, and each piece attends to all of it)
goes on in smaller pieces, so that a request aborted in its prefill frees the owner
thread within about this long. Pieces that run faster keep their size, so on a fast
device nothing changes."""
MIN_PIECE = 64
"""The smallest piece :data:`PIECE_S` shrinks pieces to."""


def stoppable_step(step_size: int, seconds: float) -> int:
    """The size of the next prefill piece after one of ``step_size`` took ``seconds``."""
    if seconds <= PIECE_S:
        return step_size
    return max(min(MIN_PIECE, step_size), step_size // 2)


def stoppable(steps: Generator[Step, None, None], stop: Callable[[], bool]) -> Iterator[Step]:
    """``steps`` whose prefill stops between two pieces when ``stop`` says so; the
    iteration then just ends (the caller sees its request aborted)."""
    with stopping_prefill(stop):
        try:
            yield from steps
        except PrefillStopped:
            return


def prefill(
    model: Any,
    cache: list[Any],
    tokens: Sequence[int],
    step_size: int,
    quantize: Callable[[list[Any]], None] | None = None,
    shapes: PrefillShapes = NO_PADDING,
) -> None:
    """Feed ``tokens`` into ``cache`` in pieces of ``step_size``.

    ``quantize`` (if given) runs on the cache after each piece, and MLX's buffer pool
    is given back after each, as mlx-lm does; inside :func:`stopping_prefill` it stops
    between pieces when told to, and a piece that took longer than :data:`PIECE_S`
    halves the next ones (:func:`stoppable_step`). ``shapes`` pads a short last piece at its
    end (with copies of its last token) and trims the padding off the cache once the
    piece has run: ``cache`` then holds ``tokens`` alone, as without padding. A cache
    that is quantized is not padded.
    """
    import mlx.core as mx
    from mlx_lm.generate import generation_stream

    stop = getattr(_stop, "check", None)
    with mx.stream(generation_stream):
        start = 0
        while start < len(tokens):
            if stop is not None and stop():
                raise PrefillStopped
            piece = list(tokens[start : start + step_size])
            began = time.perf_counter()
            pad = 0 if quantize is not None else shapes.padding(cache, len(piece))
            model(mx.array(piece + piece[-1:] * pad, mx.uint32)[None], cache=cache)
            for layer in cache if pad else ():
                layer.trim(pad)
            if quantize is not None:
                quantize(cache)
            mx.eval([c.state for c in cache])
            mx.clear_cache()
            start += len(piece)
            if stop is not None:
                step_size = stoppable_step(step_size, time.perf_counter() - began)


def warm_shapes(model: Any, shapes: PrefillShapes, step_size: int) -> float:
    """Meet every padded prefill shape once, so the first prompts find them set up.

    Runs on the owner thread (MLX's CUDA backend keeps its set-up work per thread):
    each bucket from an empty cache, and each size a piece after one whole piece is
    padded to (a prompt longer than ``step_size``), each followed by a one-token step as
    the reply's first. The caches
    are laid out as a prompt's would be (the attention kernels are set up per layout).

    Returns:
        The seconds it took.
    """
    import mlx.core as mx
    from mlx_lm.generate import generation_stream
    from mlx_lm.models.cache import make_prompt_cache

    began = time.perf_counter()
    whole = make_prompt_cache(model)  # one whole piece, copied for each bucket after it
    limit = shapes.positions if shapes.positions is not None else 2 * step_size + 1
    after = sorted({shapes.size(step_size, size) for size in shapes.buckets})
    sizes = [(0, size) for size in shapes.buckets if size < limit]
    sizes += [(step_size, size) for size in after if step_size + size < limit]
    if not shapes.pads(whole):  # a cache that is never padded: no bucket to meet
        sizes = []
    with mx.stream(generation_stream):
        if any(before for before, _ in sizes):
            prefill(model, whole, [0] * step_size, step_size)
        for before, size in sizes or [(0, 0)]:  # no buckets: the thread's first step alone
            cache = make_prompt_cache(model)
            for layer, piece in zip(cache, whole, strict=True) if before else ():
                layer.state = (mx.array(piece.keys), mx.array(piece.values), piece.offset)
            prefill(model, cache, [0] * size, step_size, shapes=shapes)
            logits = model(mx.array([[0]], mx.uint32), cache=cache)[:, -1, :]
            mx.eval(mx.argmax(logits - mx.logsumexp(logits, keepdims=True), axis=-1))
    mx.clear_cache()
    seconds = time.perf_counter() - began
    logger.info("Met %d prefill shapes in %.2f s", len(sizes), seconds)
    return seconds


def plain_steps(
    model: Any,
    context: list[int],
    new_tokens: int,
    cache: list[Any],
    *,
    processors: list[Callable[..., Any]],
    max_tokens: int,
    sampler: Callable[[Any], Any],
    prefill_step_size: int,
    quantize: Callable[[list[Any]], None] | None = None,
    shapes: PrefillShapes = NO_PADDING,
) -> Generator[Step, None, None]:
    """Decode one token a step, with the forward passes of mlx-lm's ``generate_step``.

    The same pieces of prompt, the same one-token steps, the same processors and KV
    quantization, so the tokens are mlx-lm's; each step is started before the previous
    token is read, so the host builds the next step while the device computes this
    one. Two things differ: the first token is read and handed out before the second
    step is started, not after (starting a step, building its graph and launching its
    kernels, costs the host as long as the step itself where decoding is host-bound,
    as with small models on a GPU, so the first token comes out a step earlier); and
    no step is started after the last token, which the cache then does not hold.

    Args:
        model: The model.
        context: The whole prompt; its last ``new_tokens`` are not in ``cache`` yet.
        new_tokens: Prompt tokens left to prefill (at least one).
        cache: The KV cache holding the rest of the prompt.
        processors: mlx-lm logits processors, called with the whole context so far
            (the prompt from its first token, cached or not, then the reply) and the
            logits, as ``generate_step`` calls them on a prompt it prefills itself.
        max_tokens: Tokens to generate.
        sampler: Picks a token from a row of log-probabilities.
        prefill_step_size: Prompt tokens per forward pass.
        quantize: Run on ``cache`` after each forward pass (a quantized KV cache).
        shapes: How the prompt's last prefill piece is padded (see :func:`prefill`).
    """
    import mlx.core as mx
    from mlx_lm.generate import generation_stream

    # What processors see: the context up to the token a step feeds, then that token.
    seen: Any = mx.array(context[:-1], mx.uint32) if processors else None

    def step(fed: Any) -> Any:
        """Feed one token (maybe still being computed) and start sampling the next."""
        nonlocal seen
        logits = model(fed[None], cache=cache)[:, -1, :]
        if processors:
            seen = mx.concatenate([seen, fed])
            for processor in processors:
                logits = processor(seen, logits)
        if quantize is not None:
            quantize(cache)
        # Over the whole (1, vocabulary) row as mlx-lm writes it: the same kernels.
        sampled = sampler(logits - mx.logsumexp(logits, keepdims=True))
        mx.async_eval(sampled)
        return sampled

    if max_tokens < 1:
        return
    with mx.stream(generation_stream):
        prompt = context[len(context) - new_tokens : -1]
        prefill(model, cache, prompt, prefill_step_size, quantize, shapes)
        pending = step(mx.array(context[-1:], mx.uint32))
        produced = 0
        while True:
            # The next step starts before this token is read, but for the first token,
            # which goes out as soon as it is computed, and the last, never fed back.
            following = step(pending) if 0 < produced < max_tokens - 1 else None
            token = int(pending.item())
            produced += 1
            yield token, 0, False
            if produced == max_tokens:
                return
            return_buffers(produced)
            pending = following if following is not None else step(pending)


def repair_random_state() -> bool:
    """Reseed MLX's global random state if a failed step left it unusable.

    mlx-lm compiles its sampling filters with ``outputs=mx.random.state``: one that
    raises while traced (``top_k`` out of range, a failing custom processor inside
    ``mx.compile``) leaves a placeholder there, and every later sampled request would
    fail with "Attempting to eval an array without a primitive". Called after every
    failed decode step, on the owner thread.

    Returns:
        True if the state was broken and has been reseeded.
    """
    import mlx.core as mx

    try:
        mx.eval(mx.random.state)
    except Exception:  # a placeholder array: start a fresh random sequence
        mx.random.seed(int.from_bytes(os.urandom(7), "little"))
        return True
    return False
