"""Token log-probabilities of a reply: what each sampled token's probability was, and the
most likely alternatives at its step.

:class:`LogprobRecorder` is the last logits processor of a request that asks for them:
it sees the logits every other processor has shaped (a penalty, a grammar's mask), as
mlx-lm's ``generate_step`` reports ``logprobs``, and keeps each step's log-softmax until
the engine learns which token was sampled from it (:meth:`LogprobRecorder.resolve`).
The decode loops run one step ahead of the tokens they hand out, so at most two steps
wait at a time.

A prompt's own tokens are scored by :class:`PromptScorer` (:class:`PromptLogprobs`):
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

if TYPE_CHECKING:
    import mlx.core as mx


def log_softmax_top(
    logits: mx.array, top: int
) -> tuple[mx.array, mx.array | None, mx.array | None]:
    """Log-probabilities over the last axis, and each row's ``top`` most likely ids and
    their values, in no order (None for ``top`` 0)."""
    import mlx.core as mx

    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    if not top:
        return logprobs, None, None
    k = min(top, logprobs.shape[-1])
    ids = mx.argpartition(-logprobs, k - 1, axis=-1)[..., :k]
    return logprobs, ids, mx.take_along_axis(logprobs, ids, axis=-1)


def ranked(token: int, logprob: float, ids: list[int], values: list[float]) -> TokenLogprob:
    """A token's entry, its step's most likely tokens (``ids``, ``values``) first."""
    pairs = sorted(zip(ids, values, strict=True), key=lambda p: -p[1])
    return TokenLogprob(token, logprob, tuple((int(i), float(v)) for i, v in pairs))


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

        logprobs, ids, values = log_softmax_top(logits.reshape(-1), self.top)
        if ids is not None and values is not None:
            mx.async_eval(ids, values)
        self._steps.append((logprobs, ids, values))
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
        return ranked(
            token, chosen, cast(list[int], ids.tolist()), cast(list[float], values.tolist())
        )


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


class PromptScorer:
    """Scores a prompt piece by piece, each piece one call on the owner thread (a
    ``BatchedEngine`` decodes a step between two), then keeps or drops its cache there.

    Args:
        model: The model.
        tokens: The prompt.
        top: How many most likely tokens to list at each position.
        piece: Most tokens a piece (at most :data:`SCORE_PIECE`, whose logits are
            read whole).
    """

    def __init__(self, model: Any, tokens: list[int], top: int, piece: int) -> None:
        self.model, self.tokens, self.top = model, tokens, top
        self.piece = max(1, min(piece, SCORE_PIECE))
        self.starts = range(0, len(tokens), self.piece)
        """Where each piece starts: call :meth:`score` with each, in order."""
        self.entries: list[TokenLogprob] = []
        """``tokens[1:]``'s log-probabilities so far, each given the tokens before it."""
        self._cache: list[Any] = []

    def score(self, start: int) -> None:
        """Owner thread: feed the piece at ``start`` (the cache grows with it); its
        logits become log-probabilities in float32, of which the next tokens' and the
        ``top`` most likely are kept."""
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        if not self._cache:
            self._cache = make_prompt_cache(self.model)
        ids = self.tokens[start : start + self.piece]
        logits = self.model(mx.array(ids)[None], cache=self._cache)[0].astype(mx.float32)
        targets = self.tokens[start + 1 : start + len(ids) + 1]
        states = [c.state for c in self._cache]
        if not targets:  # the prompt's last token: nothing after it to score
            mx.eval(states)
            return
        rows, best, values = log_softmax_top(logits[: len(targets)], self.top)
        chosen = mx.take_along_axis(rows, mx.array(targets)[:, None], axis=-1)[:, 0]
        ids_k: list[list[int]] = [[] for _ in targets]
        values_k: list[list[float]] = [[] for _ in targets]
        if best is not None and values is not None:
            mx.eval(chosen, best, values, states)
            ids_k = cast(list[list[int]], best.tolist())
            values_k = cast(list[list[float]], values.tolist())
        else:
            mx.eval(chosen, states)
        logprobs = cast(list[float], chosen.tolist())
        for token, logprob, i, v in zip(targets, logprobs, ids_k, values_k, strict=True):
            self.entries.append(ranked(token, logprob, i, v))

    def finish(self, keep: Callable[[list[int], list[Any]], None] | None) -> None:
        """Owner thread: hand the cache of the whole prompt to ``keep`` (a prefix
        cache's ``put``; None, or a prompt not scored whole: dropped), and let go of it
        here, on the thread whose arrays they are."""
        cache, self._cache = self._cache, []
        if keep is not None and cache and len(self.entries) == len(self.tokens) - 1:
            keep(self.tokens, cache)
