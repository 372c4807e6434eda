"""A ``BatchedEngine`` request that runs alone, on a plain KV cache, until others join.

mlx-lm's batch generator pays, on every step, for what a batch needs (per-sequence
offsets and masks, a batched cache, bookkeeping for many sequences); a batch of one
pays it too. So while a request is the only one, ``BatchedEngine`` decodes it the way
``SimpleEngine`` does, one prefill piece or one token per turn of its loop, drafting
with prompt lookup or a draft model when the engine has one. When another request
arrives, the lone one hands its KV cache and the token it is about to feed to the batch
generator, which goes on from there: no token is dropped, recomputed or drawn twice.
The draft model's cache is dropped then: only a request alone drafts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import Any

from mlx_integrations.engine.decoding import (
    NO_PADDING,
    PrefillShapes,
    Step,
    prefill,
    return_buffers,
    stoppable_step,
)
from mlx_integrations.engine.speculative.draft_model import draft_model_steps
from mlx_integrations.engine.speculative.pace import LookupPace
from mlx_integrations.engine.speculative.prompt_lookup import prompt_lookup_steps


class SoloDecode:
    """One request's prefill and decode loop, advanced a turn at a time.

    Args:
        model: The model.
        prompt: The whole prompt.
        reused: Prompt tokens ``cache`` already holds (from the prefix cache).
        cache: A trimmable KV cache holding ``prompt[:reused]``.
        sampler: Picks a token per row of log-probabilities.
        max_tokens: Tokens to generate.
        prefill_step_size: Prompt tokens per forward pass (and per turn).
        prompt_lookup: Most tokens drafted per round from the context; 0 decodes plainly.
        draft_model: A model that drafts ``num_draft_tokens`` per round instead (its own
            cache is prefilled beside the target's, a piece per turn); None for none.
        draft_cache: The draft model's cache holding ``prompt[:draft_fed]`` (an earlier
            request's, see ``DraftCache``); None starts it empty.
        pace: Picks rounds or plain steps for prompt lookup, by timing (see
            :func:`~mlx_integrations.engine.speculative.prompt_lookup.prompt_lookup_steps`); None always drafts.
        shapes: How the prompt's last prefill piece is padded (see
            :func:`~mlx_integrations.engine.decoding.prefill`).
    """

    def __init__(
        self,
        model: Any,
        prompt: list[int],
        reused: int,
        cache: list[Any],
        *,
        sampler: Callable[[Any], Any],
        max_tokens: int,
        prefill_step_size: int,
        prompt_lookup: int = 0,
        draft_model: Any = None,
        num_draft_tokens: int = 3,
        draft_cache: list[Any] | None = None,
        draft_fed: int = 0,
        pace: LookupPace | None = None,
        shapes: PrefillShapes = NO_PADDING,
    ):
        from mlx_lm.models.cache import make_prompt_cache

        self.cache = cache
        self.context = list(prompt)
        """The prompt and every token handed out so far."""
        self._model = model
        self._sampler = sampler
        self._max_tokens = max_tokens
        self._step_size = prefill_step_size
        self._lookup = prompt_lookup
        self._pace = pace
        self._shapes = shapes
        self._fed = reused  # context tokens the cache holds, while prefilling
        self._produced = 0
        self._next: Any = None  # the sampled token not yet handed out (plain decoding)
        self._rounds: Generator[Step, None, None] | None = None  # drafting
        self._draft = draft_model
        self._num_draft = num_draft_tokens
        if draft_model is not None and draft_cache is None:
            draft_cache, draft_fed = make_prompt_cache(draft_model), 0
        self._draft_cache = draft_cache if draft_model is not None else None
        self._draft_fed = draft_fed  # context tokens the draft cache holds, while prefilling

    @property
    def prefilling(self) -> bool:
        last = len(self.context) - 1
        draft_behind = self._draft_cache is not None and self._draft_fed < last
        return self._produced == 0 and (self._fed < last or draft_behind)

    def step(self) -> list[Step]:
        """One turn: a prefill piece (no token), one token, or one verified draft round."""
        import mlx.core as mx
        from mlx_lm.generate import generation_stream

        if self.prefilling:
            last = len(self.context) - 1
            end = min(self._fed + self._step_size, last)
            piece = self.context[self._fed : end]
            began = time.perf_counter()
            prefill(self._model, self.cache, piece, self._step_size, shapes=self._shapes)
            self._fed = end
            # A slow piece (a long prompt on a slow device) makes the next ones smaller:
            # the loop looks at aborts and arrivals between two pieces.
            self._step_size = stoppable_step(self._step_size, time.perf_counter() - began)
            if self._draft_cache is not None:
                end = min(self._draft_fed + self._step_size, last)
                piece = self.context[self._draft_fed : end]
                prefill(self._draft, self._draft_cache, piece, self._step_size)
                self._draft_fed = end
            return []
        if self._lookup or self._draft_cache is not None:
            return self._draft_round()
        with mx.stream(generation_stream):
            if self._next is None:  # from the prompt's last token, or the reply's first
                self._next = self._sample(mx.array([self.context[-1]], mx.uint32))
            token_array = self._next
            if 0 < self._produced < self._max_tokens - 1:
                # Feed the token and start the next step before reading this one (the
                # first token goes out as soon as it is computed; the last is not fed).
                self._next = self._sample(token_array)
            else:
                self._next = None
            token = int(token_array.item())
        self._advance(token)
        return [(token, 0, False)]

    def handoff(self) -> tuple[list[Step], list[int], list[int]]:
        """Stop decoding here: what the batch generator needs to go on.

        Returns:
            ``(steps, prompt, cached)``: tokens already computed that the caller must
            hand out first; what the generator takes as the sequence's prompt (the rest
            of the prompt, or the last token handed out); and the tokens ``cache``
            holds, the context before ``prompt``.
        """
        steps: list[Step] = []
        if self._rounds is not None:
            self.close()
        elif self._next is not None:
            token = int(self._next.item())
            self._next = None
            self._advance(token)
            steps.append((token, 0, False))
        self._draft_cache = None  # the batch decodes plainly
        fed = self._fed if self._produced == 0 else len(self.context) - 1
        return steps, self.context[fed:], self.context[:fed]

    def close(self) -> list[Any] | None:
        """End the draft rounds: ``cache`` then holds all but the last token handed out.

        A round is paused after its last token, before the target's cache drops the
        rejected drafts (a draft model's round does it on resume or close): call this
        before storing ``cache``. Returns the draft model's cache (a prefix of the
        context), or None.
        """
        if self._rounds is not None:
            self._rounds.close()
            self._rounds = None
        draft, self._draft_cache = self._draft_cache, None
        return draft

    def _sample(self, token: Any) -> Any:
        import mlx.core as mx

        logits = self._model(token.reshape(1, 1), cache=self.cache)[:, -1, :]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        sampled = self._sampler(logprobs)
        mx.async_eval(sampled)
        return sampled

    def _draft_round(self) -> list[Step]:
        if self._rounds is None and self._draft_cache is not None:
            # Both caches hold the context but for its last token.
            self._rounds = draft_model_steps(
                self._model,
                self._draft,
                self.context[-1:],
                self.cache,
                self._draft_cache,
                num_draft_tokens=self._num_draft,
                max_tokens=self._max_tokens - self._produced,
                sampler=self._sampler,
                prefill_step_size=self._step_size,
            )
        elif self._rounds is None:
            self._rounds = prompt_lookup_steps(
                self._model,
                self.context,
                1,  # the prompt is prefilled but for its last token
                self.cache,
                max_draft=self._lookup,
                max_tokens=self._max_tokens - self._produced,
                sampler=self._sampler,
                prefill_step_size=self._step_size,
                pace=self._pace,
            )
        steps: list[Step] = []
        for step in self._rounds:
            steps.append(step)
            # A round ends with the model's own token, never an accepted draft.
            if not step[2]:
                break
        for token, _, _ in steps:
            self._advance(token)
        return steps

    def _advance(self, token: int) -> None:
        self.context.append(token)
        self._produced += 1
        return_buffers(self._produced)


def prefill_joining(
    model: Any,
    tokens: list[int],
    reused: int,
    cache: list[Any] | None,
    shapes: PrefillShapes,
) -> tuple[list[Any] | None, int]:
    """Prefill a request that joins a running batch on its own, padded as a lone one is.

    mlx-lm's batch generator prefills a newcomer at its exact length, one shape per
    prompt length; a newcomer of one piece or less is prefilled here instead (its last
    piece padded to a bucket), and joins with its last token alone. Requests arriving
    together are left to the generator, which prefills them in one batch.

    Returns:
        ``(cache, fed)``: the cache (a new one if ``cache`` was None) and the prompt
        tokens it holds; ``cache`` and ``reused`` unchanged where nothing was done.
    """
    from mlx_lm.models.cache import make_prompt_cache

    rest = len(tokens) - 1 - reused
    step_size = shapes.buckets[-1] if shapes.buckets else 0  # the longest piece
    if not 0 < rest <= step_size:
        return cache, reused
    cache = cache if cache is not None else make_prompt_cache(model)
    if not shapes.pads(cache):
        return cache, reused  # not a plain KV cache: the generator prefills it
    prefill(model, cache, tokens[reused:-1], step_size, shapes=shapes)
    return cache, len(tokens) - 1
