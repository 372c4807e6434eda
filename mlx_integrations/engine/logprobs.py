"""Token log-probabilities of a reply: what each sampled token's probability was, and the
most likely alternatives at its step.

:class:`LogprobRecorder` is the last logits processor of a request that asks for them:
it sees the logits every other processor has shaped (a penalty, a grammar's mask), as
mlx-lm's ``generate_step`` reports ``logprobs``, and keeps each step's log-softmax until
the engine learns which token was sampled from it (:meth:`LogprobRecorder.resolve`).
The decode loops run one step ahead of the tokens they hand out, so at most two steps
wait at a time.

A prompt's own tokens are scored by :func:`score_prompt` (:class:`PromptLogprobs`):
one forward pass over the prompt in pieces, each position's log-softmax read at the
next token, which is what ``echo`` with ``logprobs`` reports and lm-evaluation-harness's
loglikelihood tasks sum.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from mlx_integrations.chat.output_parser import TokenLogprob
from mlx_integrations.engine.decoding import PrefillStopped

if TYPE_CHECKING:
    import mlx.core as mx


class LogprobRecorder:
    """A logits processor that records each step's log-probabilities.

    Single-use: one per request, called by its decode loop as every processor is
    (``processor(tokens, logits)``), last of them.

    Args:
        top: How many most likely tokens to keep per step (0: only the sampled one's).
    """

    def __init__(self, top: int) -> None:
        self.top = top
        self._steps: deque[tuple[mx.array, mx.array | None, mx.array | None]] = deque()

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        import mlx.core as mx

        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        row = logprobs.reshape(-1)
        if self.top:
            k = min(self.top, row.size)
            ids = mx.argpartition(-row, k - 1)[:k]
            values = row[ids]
            mx.async_eval(ids, values)
            self._steps.append((row, ids, values))
        else:
            self._steps.append((row, None, None))
        return logits

    def resolve(self, token: int) -> TokenLogprob:
        """The log-probability of ``token``, sampled at the oldest step not resolved yet.

        Raises:
            RuntimeError: No step is waiting (a token that no call of this processor
                produced).
        """
        if not self._steps:
            raise RuntimeError("a token came with no step recorded for it")
        row, ids, values = self._steps.popleft()
        chosen = float(cast(float, row[token].item()))
        if ids is None or values is None:
            return TokenLogprob(token, chosen)
        top_ids = cast(list[int], ids.tolist())
        top_values = cast(list[float], values.tolist())
        pairs = sorted(zip(top_ids, top_values, strict=True), key=lambda p: -p[1])
        return TokenLogprob(token, chosen, tuple((int(i), float(v)) for i, v in pairs))


SCORE_PIECE = 512
"""Most prompt tokens scored in one forward pass: their logits are read whole."""


@dataclass(frozen=True)
class PromptLogprobs:
    """A prompt's own log-probabilities: how likely the model found each of its tokens
    given the ones before it.

    Attributes:
        tokens: The prompt's tokens as the model read them (a text prompt encoded as
            the engine encodes it for ``generate``, a beginning-of-sequence token
            included where the tokenizer adds one).
        logprobs: One entry per token after the first (the first has no tokens before
            it): ``logprobs[i]`` is ``tokens[i + 1]``'s, with the most likely tokens at
            its position.
    """

    tokens: list[int]
    logprobs: list[TokenLogprob]


def score_tokens(
    model: Any,
    tokens: list[int],
    cache: list[Any],
    top: int,
    piece: int,
    stop: Callable[[], bool],
) -> list[TokenLogprob]:
    """The log-probability of each of ``tokens[1:]`` given the tokens before it.

    The tokens go through the model in pieces of ``piece`` (``cache`` grows with
    them, holding the whole prompt at the end); each piece's logits become
    log-probabilities in float32, of which only the next tokens' and the ``top`` most
    likely are kept, so memory stays at one piece's logits.

    Raises:
        PrefillStopped: ``stop()`` said so before a piece.
    """
    import mlx.core as mx

    out: list[TokenLogprob] = []
    for start in range(0, len(tokens), piece):
        if stop():
            raise PrefillStopped
        ids = tokens[start : start + piece]
        logits = model(mx.array(ids)[None], cache=cache)[0].astype(mx.float32)
        targets = tokens[start + 1 : start + len(ids) + 1]
        if not targets:  # the prompt's last token: nothing after it to score
            mx.eval([c.state for c in cache])
            break
        rows = logits[: len(targets)]
        rows = rows - mx.logsumexp(rows, axis=-1, keepdims=True)
        chosen = mx.take_along_axis(rows, mx.array(targets)[:, None], axis=-1)[:, 0]
        if top:
            k = min(top, rows.shape[-1])
            best = mx.argpartition(-rows, k - 1, axis=-1)[:, :k]
            values = mx.take_along_axis(rows, best, axis=-1)
            mx.eval(chosen, best, values, [c.state for c in cache])
            ids_k = cast(list[list[int]], best.tolist())
            values_k = cast(list[list[float]], values.tolist())
        else:
            mx.eval(chosen, [c.state for c in cache])
            ids_k, values_k = [[] for _ in targets], [[] for _ in targets]
        logprobs = cast(list[float], chosen.tolist())
        for token, logprob, i, v in zip(targets, logprobs, ids_k, values_k, strict=True):
            pairs = sorted(zip(i, v, strict=True), key=lambda p: -p[1])
            out.append(TokenLogprob(token, logprob, tuple(pairs)))
    return out


def score_prompt(
    model: Any,
    tokens: list[int],
    top: int,
    piece: int,
    stop: Callable[[], bool],
    keep: Callable[[list[int], list[Any]], None] | None = None,
) -> list[TokenLogprob]:
    """:func:`score_tokens` on a fresh cache, in pieces of at most ``piece`` (and
    :data:`SCORE_PIECE`) tokens; ``keep`` then takes the prompt and its cache (a
    prefix cache's ``put``).

    Raises:
        asyncio.CancelledError: ``stop()`` said so before a piece.
    """
    import asyncio

    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    try:
        entries = score_tokens(model, tokens, cache, top, min(piece, SCORE_PIECE), stop)
    except PrefillStopped:
        raise asyncio.CancelledError from None
    if keep is not None:
        keep(tokens, cache)
    return entries
