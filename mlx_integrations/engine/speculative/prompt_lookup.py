"""Prompt lookup: drafts looked up in the context, verified by the model in one pass.

The tokens that followed the latest earlier occurrence of the context's last n-gram
(3, 2, then 1 tokens) are proposed; the target model checks them in one forward pass
over ``[last token + drafts]`` and keeps the longest prefix where its own choice equals
the draft, plus the token it chose after that prefix. The KV cache of the rejected rest
is trimmed away (mlx-lm's ``trim_prompt_cache``), so the tokens are the ones plain
decoding gives. Cheap, and it pays off where the reply copies its input (RAG quotes,
code edits). A round runs where a :class:`~.pace.LookupPace` expects it to pay;
between rounds the loop decodes plain steps, pipelined as mlx-lm's are.

The steps yield ``(token, drafted, accepted)``: the token, how many tokens were drafted
for the verification round this token opens (0 on the round's other tokens), and
whether the token was a draft the target accepted. With ``temperature > 0`` the target
samples at every drafted position and a draft is kept only when it equals the target's
sample there, so the reply follows the target's own distribution.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from typing import Any

from mlx_integrations.engine.decoding import Step, prefill, return_buffers
from mlx_integrations.engine.speculative.pace import LookupPace, StepKind

NGRAM_SIZES = (3, 2, 1)
"""n-gram lengths tried by prompt lookup, longest first."""


class NgramIndex:
    """Where each recent n-gram of a token sequence was last followed by a token."""

    def __init__(self, tokens: Sequence[int], sizes: Sequence[int] = NGRAM_SIZES):
        self.tokens: list[int] = []
        self._sizes = sorted(sizes, reverse=True)
        # n-gram -> index of the token that followed its latest occurrence.
        self._follower: dict[tuple[int, ...], int] = {}
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        end = len(self.tokens)
        for n in self._sizes:
            if end >= n:
                self._follower[tuple(self.tokens[end - n : end])] = end
        self.tokens.append(token)

    def propose(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens that followed the longest n-gram ending the sequence."""
        return self.match(limit)[1]

    def match(self, limit: int) -> tuple[int, list[int]]:
        """``(n, tokens)``: the longest n-gram ending the sequence that occurred before,
        and up to ``limit`` tokens that followed it; ``(0, [])`` for none."""
        if limit <= 0:
            return 0, []
        end = len(self.tokens)
        for n in self._sizes:
            if end >= n:
                start = self._follower.get(tuple(self.tokens[end - n :]))
                if start is not None:
                    return n, self.tokens[start : start + limit]
        return 0, []


def prompt_lookup_steps(
    model: Any,
    context: list[int],
    new_tokens: int,
    cache: list[Any],
    *,
    max_draft: int,
    max_tokens: int,
    sampler: Callable[[Any], Any],
    prefill_step_size: int,
    quantize: Callable[[list[Any]], None] | None = None,
    pace: LookupPace | None = None,
) -> Generator[Step, None, None]:
    """Decode with drafts looked up in the context (prompt and reply so far).

    Where the context has a match, a round verifies ``[last token, drafts...]`` in one
    forward pass. Elsewhere the loop decodes as mlx-lm's does, one token a step, each
    step started before the previous token is read, so the host builds the next step
    while the device computes this one; where a match turns up there, the step already
    running checks its first draft, and a round verifies the rest. ``pace`` tells
    whether a round pays for the match at hand (:class:`~.pace.LookupPace`); None
    drafts wherever a match exists, so which steps draft depends on the tokens alone (a
    seeded request's draws are reproducible).

    On close, ``cache`` holds the context but the last token yielded (positions fed
    beyond it, by a step whose pick is unread or by drafts kept but not yet yielded,
    are dropped).

    Args:
        model: The target model.
        context: The whole prompt; its last ``new_tokens`` are not in ``cache`` yet.
        new_tokens: Prompt tokens left to prefill (at least one).
        cache: The target's KV cache holding the rest of the prompt; must be trimmable.
        max_draft: Most tokens proposed per round.
        max_tokens: Tokens to generate.
        sampler: Picks a token per row of log-probabilities (argmax when greedy).
        prefill_step_size: Prompt tokens per forward pass.
        quantize: Run on ``cache`` after each forward pass: it may replace layers in
            place with quantized ones (a quantized KV cache).
        pace: Whether a round pays, by timing and by how well matches were followed.
    """
    import mlx.core as mx
    from mlx_lm.generate import generation_stream
    from mlx_lm.models.cache import trim_prompt_cache

    def forward(tokens: list[int] | Any) -> Any:
        """Log-probabilities at every position of ``tokens``, fed into ``cache``."""
        fed = mx.array(tokens, mx.uint32) if isinstance(tokens, list) else tokens
        logits = model(fed[None], cache=cache)[0]
        if quantize is not None:
            quantize(cache)
        return logits - mx.logsumexp(logits, axis=-1, keepdims=True)

    def plain_step(token: list[int] | Any) -> Any:
        """Feed one token (maybe still being computed) and start sampling the next."""
        sampled = sampler(forward(token))
        mx.async_eval(sampled)
        return sampled

    index = NgramIndex(context)
    last = context[-1]  # the newest token, not fed yet
    produced = 0
    ahead = 0  # positions the cache holds beyond the context before the last token yielded
    # A round not run, followed over the tokens that come: (n, drafts, agreed so far).
    shadow: tuple[int, list[int], int] | None = None
    mark = time.perf_counter()  # when the last step (or the prefill) ended

    def match() -> tuple[int, list[int], bool]:
        """The drafts after the context, their n-gram's length, and whether the
        tokens left did not cut them (only such rounds tell how far a match is
        followed)."""
        room = min(max_draft, max_tokens - produced - 1)  # the model's token comes after
        n, drafts = index.match(room)
        return n, drafts, room == max_draft

    def timed(kind: StepKind) -> None:
        nonlocal mark
        now = time.perf_counter()
        if pace is not None:
            pace.timed(kind, now - mark)
        mark = now

    def observe(n: int, emitted: int, full: bool) -> None:
        if pace is not None and full:
            pace.observe(n, emitted)

    def skipped(n: int, drafts: list[int], full: bool) -> None:
        """A match the pace declined: follow its drafts, unless one is followed already."""
        nonlocal shadow
        if drafts and shadow is None and full:
            shadow = (n, drafts, 0)

    def follow(token: int) -> None:
        """A token the model picked, checked against the drafts of the round not run."""
        nonlocal shadow
        if shadow is None:
            return
        n, drafts, agreed = shadow
        if token == drafts[agreed]:
            agreed += 1
            if agreed < len(drafts):
                shadow = (n, drafts, agreed)
                return
        observe(n, agreed + 1, True)  # a round emits its agreed drafts and one more
        shadow = None

    with mx.stream(generation_stream):
        prefill(model, cache, context[len(context) - new_tokens : -1], prefill_step_size, quantize)
        mark = time.perf_counter()
        try:
            # A round whose first draft the step in flight confirmed: (n, rest, full).
            opened: tuple[int, list[int], bool] | None = None
            while produced < max_tokens:
                kept = 0
                if opened is not None:
                    (n, drafts, full), opened, kept = opened, None, 1
                else:
                    n, drafts, full = match()
                    if drafts and not (pace is None or pace.worth(n)):
                        skipped(n, drafts, full)
                        drafts = []
                if drafts or kept:
                    chosen: list[int] = sampler(forward([last, *drafts])).tolist()
                    accepted = 0
                    while accepted < len(drafts) and chosen[accepted] == drafts[accepted]:
                        accepted += 1
                    # The cache now holds the last token and every draft: drop the rejected.
                    trim_prompt_cache(cache, len(drafts) - accepted)
                    timed("round" if drafts else "step")
                    observe(n, kept + accepted + 1, full)
                    for i, token in enumerate(chosen[: accepted + 1]):
                        follow(token)
                        index.append(token)
                        produced += 1
                        ahead = accepted - i  # the kept drafts from this one on
                        yield token, len(drafts) if i == 0 and not kept else 0, i < accepted
                        return_buffers(produced)
                    last = chosen[accepted]
                    continue
                # Plain steps, each started before the last one's token is read (but
                # the reply's first token, handed out as soon as it is computed).
                pending, pipelined = plain_step([last]), False
                while True:
                    following = None
                    if 0 < produced < max_tokens - 1:
                        following = plain_step(pending)
                    ahead = int(following is not None)  # it fed ``token``
                    token = int(pending.item())
                    timed("pipelined" if pipelined else "step")
                    pipelined = True
                    follow(token)
                    index.append(token)
                    produced += 1
                    yield token, 0, False
                    return_buffers(produced)
                    if following is None:
                        if produced == max_tokens:
                            return
                        last = token  # the first token: not fed yet
                        break
                    n, drafts, full = match()
                    if drafts and (pace is None or pace.worth(n)):
                        # The step in flight picks the token the first draft guesses.
                        last, ahead = int(following.item()), 0
                        timed("pipelined")
                        follow(last)
                        index.append(last)
                        produced += 1
                        if last == drafts[0]:
                            opened = (n, drafts[1:], full)  # a round verifies the rest
                            yield last, len(drafts), True
                        else:
                            observe(n, 1, full)
                            yield last, 1, False
                        return_buffers(produced)
                        break
                    skipped(n, drafts, full)
                    pending = following
        finally:
            if ahead:
                trim_prompt_cache(cache, ahead)
