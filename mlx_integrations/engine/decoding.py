"""The decode loop's pieces that every engine on mlx-lm shares.

Prefill in pieces, plain one-token steps pipelined as mlx-lm's ``generate_step``, the
return of MLX's buffer pool during a reply, and the repair of MLX's random state after
a failed step. Owner thread only: the arrays made here belong to its stream.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Sequence
from typing import Any

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


def prefill(
    model: Any,
    cache: list[Any],
    tokens: Sequence[int],
    step_size: int,
    quantize: Callable[[list[Any]], None] | None = None,
) -> None:
    """Feed ``tokens`` into ``cache`` in pieces of ``step_size``.

    ``quantize`` (if given) runs on the cache after each piece, and MLX's buffer pool
    is given back after each, as mlx-lm does.
    """
    import mlx.core as mx
    from mlx_lm.generate import generation_stream

    with mx.stream(generation_stream):
        for start in range(0, len(tokens), step_size):
            piece = list(tokens[start : start + step_size])
            model(mx.array(piece, mx.uint32)[None], cache=cache)
            if quantize is not None:
                quantize(cache)
            mx.eval([c.state for c in cache])
            mx.clear_cache()


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
        prefill(model, cache, context[len(context) - new_tokens : -1], prefill_step_size, quantize)
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
