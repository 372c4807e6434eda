"""Token log-probabilities of a reply: what each sampled token's probability was, and the
most likely alternatives at its step.

:class:`LogprobRecorder` is the last logits processor of a request that asks for them:
it sees the logits every other processor has shaped (a penalty, a grammar's mask), as
mlx-lm's ``generate_step`` reports ``logprobs``, and keeps each step's log-softmax until
the engine learns which token was sampled from it (:meth:`LogprobRecorder.resolve`).
The decode loops run one step ahead of the tokens they hand out, so at most two steps
wait at a time.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, cast

from mlx_integrations.chat.output_parser import TokenLogprob

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
