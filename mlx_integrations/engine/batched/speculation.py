"""Speculation for the requests that share ``BatchedEngine``'s batch.

mlx-lm's ``GenerationBatch`` keeps, for every row, the token it sampled last and has
not fed yet (the *pending* token), and a ``BatchKVCache`` whose rows are aligned on
the right (each with its own left padding). A speculative step feeds each row
``[pending, drafts...]``, right-padded to one width, where the drafts are the tokens
that followed the latest earlier occurrence of the row's last n-gram
(:class:`~mlx_integrations.engine.speculative.NgramIndex`, as for a request alone), or
with ``draft_model``, the draft model's picks (:mod:`.draft_model`).
Each row's sampler picks a token at every position; the row keeps its drafts up to
the first one that differs from the pick, and the pick there is its new pending
token. The row's rejected drafts and padding are then dropped from the cache:
mlx-lm's own ``trim`` for what every row drops, then ``prepare(right_padding=...)``
and ``finalize()``, which roll each row right by what it drops beyond that and grow
its left padding, as after a right-padded prefill.

So with greedy decoding a row's tokens are those of a plain step, whatever its
drafts; with sampling a draft is kept only where it equals the row's own sample, so
the reply follows the model's distribution. A row with logits processors (tool or
JSON constraints, penalties, ``logit_bias``) or a seeded sampler never drafts: its
processors see only its own tokens, and a seeded row's draws must not depend on what
runs beside it. It is fed its pending token alone in a speculative step, its
processors run on that position exactly as in mlx-lm's step.

A step speculates only when at least half the rows can draft and wide steps have been
emitting tokens faster than plain ones (:class:`~mlx_integrations.engine.speculative.pace.StepPace`); otherwise (and
always for models whose batch cache is neither a plain ``BatchKVCache`` nor the
quantized one of :mod:`.kv_cache`: sliding windows, state-space layers) the batch runs
mlx-lm's own step, untouched. Owner thread only.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mlx_lm.models.cache import BatchKVCache

from mlx_integrations.engine.batched.draft_model import BatchDrafter
from mlx_integrations.engine.batched.kv_cache import BatchQuantizedKVCache, roll_back_rows
from mlx_integrations.engine.batched.sampling import SeededSampler
from mlx_integrations.engine.options import EngineOptions
from mlx_integrations.engine.params import SamplingParams
from mlx_integrations.engine.speculative.draft_model import DraftModel
from mlx_integrations.engine.speculative.pace import StepPace
from mlx_integrations.engine.speculative.prompt_lookup import NgramIndex

_ROLLBACK = (BatchKVCache, BatchQuantizedKVCache)
"""Batch caches whose rows can each drop their last positions (trim, then right padding
rolled to the left)."""

MIN_DRAFTING_SHARE = 0.5
"""A step speculates when at least this share of the batch's rows has drafts."""


@dataclass
class DraftedResponse:
    """A token of a speculative step: the fields of mlx-lm's ``GenerationBatch.Response``
    that the engine reads, and the round's figures."""

    uid: int
    token: int
    logprobs: Any
    finish_reason: str | None
    prompt_cache: list[Any] | None
    all_tokens: list[int] | None
    drafted: int
    """Tokens drafted for the row in this step, on its first token; 0 on the others."""
    accepted: bool
    """The token is a draft the model agreed with."""


class BatchSpeculation:
    """Drafting (prompt lookup, or a draft model) for the rows of a ``BatchGenerator``'s
    decode batch.

    Args:
        options: The engine's options: ``prompt_lookup`` tokens are drafted per row and
            step, or ``num_draft_tokens`` by the draft model, in a plain batch cache or a
            quantized one (``kv_bits``: its packed values, scales and biases drop
            positions together).
        draft: The engine's draft model (used when ``options.draft_model`` is set).
        prefill_step_size: Tokens per forward pass when the draft model reads the
            context of a row that joins.
    """

    def __init__(
        self, options: EngineOptions, draft: DraftModel | None = None, prefill_step_size: int = 512
    ):
        self._drafter = (
            BatchDrafter(draft, options.num_draft_tokens, prefill_step_size)
            if draft is not None and options.draft_model is not None
            else None
        )
        self.max_draft = options.num_draft_tokens if self._drafter else options.prompt_lookup
        self._speculation = options.speculation
        self.plain_requests = 0
        """Requests in the batch without drafts though the options ask for speculation
        (``speculation_off_requests``); written on the owner thread only."""
        self._indices: dict[int, NgramIndex] = {}  # uid -> the row's context
        self.pace = StepPace()
        # (the model, weakly: an unloaded model is freed; whether its cache can roll back)
        self._fits: tuple[weakref.ref[Any], bool] | None = None

    # ------------------------------------------------------- the engine's side

    def next(self, generator: Any) -> tuple[list[Any], list[Any]]:
        """``generator.next()``, its decode steps drafting where it pays."""
        self.attach(generator)
        return generator.next()

    def admitted(self, model: Any, p: SamplingParams, constrained: bool) -> None:
        """A request joined the batch: count it if it decodes there without drafts."""
        if self.decodes_plainly(model, p, constrained):
            self.plain_requests += 1

    def attach(self, generator: Any) -> None:
        """Route the decode steps of ``generator`` through :meth:`_next` (idempotent)."""
        batch = generator._generation_batch
        if not self.max_draft or "next" in vars(batch):
            return
        if not self.fits(generator.model):
            return
        plain = batch.next
        batch.next = lambda: self._next(batch, plain)
        self._indices.clear()  # a new generator numbers its sequences from 0 again
        if self._drafter is not None:
            self._drafter.reset()

    def release(self) -> None:
        """Drop the rows' n-gram indices and draft caches (the batch is gone)."""
        self._indices.clear()
        if self._drafter is not None:
            self._drafter.reset()

    def settled(self, generator: Any) -> None:
        """Release once ``generator``'s decode batch has no row left.

        Rows also leave outside a step (``generator.remove``: stop strings, aborts, the
        last row going on alone), and an empty batch has no next step to drop them at:
        the draft cache would keep every row's KV while the engine idles or a request
        decodes alone.
        """
        if generator is not None and not generator._generation_batch.uids:
            if self._indices or (self._drafter is not None and self._drafter.holds()):
                self.release()

    def fits(self, model: Any) -> bool:
        """Whether ``model``'s batch cache is one that speculation can roll back."""
        if self._fits is None or self._fits[0]() is not model:
            from mlx_lm.models.cache import KVCache, make_prompt_cache

            plain = all(type(c) is KVCache for c in make_prompt_cache(model))
            if self._drafter is not None:
                plain = plain and self._drafter.fits()
            self._fits = (weakref.ref(model), plain)
        return self._fits[1]

    def decodes_plainly(self, model: Any, p: SamplingParams, constrained: bool) -> bool:
        """Whether a request joining the batch decodes there without the drafts that the
        engine's options ask for (``speculation_off_requests`` counts them)."""
        if self._speculation == "off":
            return False
        return not self.max_draft or constrained or p.seeded_sampling or not self.fits(model)

    # ------------------------------------------------------- a step

    def _next(self, batch: Any, plain: Callable[[], list[Any]]) -> list[Any]:
        start = time.perf_counter()
        responses: list[Any] | None = None
        prefill_s = 0.0  # the draft model reading rows that joined: once per row
        if self._worth_it(batch) and self.pace.wide():
            pending: list[int] = batch._next_tokens.tolist()
            drafts = self._drafts(batch, pending)
            if self._drafter is not None:
                prefill_s = self._drafter.prefill_s
            uids = list(batch.uids)  # rows that end in the step leave the batch
            if any(drafts):
                responses = self._verify(batch, pending, drafts)
            if self._drafter is not None:
                emitted = dict.fromkeys(uids, 0)
                for r in responses or []:
                    emitted[r.uid] += 1
                self._drafter.settle(emitted)
        wide = responses is not None
        if responses is None:  # the pending tokens may be computed; the step goes on as usual
            responses = plain()
        self.pace.record(wide, len(responses), time.perf_counter() - start - prefill_s)
        return responses

    def _index(self, batch: Any, row: int) -> NgramIndex:
        """The row's n-gram index, brought up to the tokens its cache holds."""
        uid, tokens = batch.uids[row], batch.tokens[row]
        index = self._indices.get(uid)
        if index is None:
            index = self._indices[uid] = NgramIndex(tokens)
        for token in tokens[len(index.tokens) :]:
            index.append(token)
        return index

    def _can_draft(self, batch: Any, row: int) -> bool:
        sampler = batch.samplers[row] if batch.samplers else None
        seeded = isinstance(getattr(sampler, "sampler", None), SeededSampler)
        left = batch.max_tokens[row] - batch._num_tokens[row]
        return not batch.logits_processors[row] and not seeded and left > 1

    def _worth_it(self, batch: Any) -> bool:
        """Whether enough rows have an n-gram match to draft from (no sync needed)."""
        if not all(type(layer) in _ROLLBACK for layer in batch.prompt_cache):
            return False
        if len(self._indices) > len(batch.uids):
            live = set(batch.uids)
            self._indices = {u: i for u, i in self._indices.items() if u in live}
        rows = len(batch.uids)
        hits = sum(
            1
            for row in range(rows)
            if self._can_draft(batch, row)
            and (self._drafter is not None or self._index(batch, row).propose(1))
        )
        return hits > 0 and hits >= MIN_DRAFTING_SHARE * rows

    def _drafts(self, batch: Any, pending: Sequence[int]) -> list[list[int]]:
        if self._drafter is not None:
            # Leave room for the model's own token after the drafts.
            limits = [
                min(self.max_draft, batch.max_tokens[row] - batch._num_tokens[row] - 1)
                if self._can_draft(batch, row)
                else 0
                for row in range(len(pending))
            ]
            return self._drafter.propose(batch, pending, limits)
        drafts: list[list[int]] = []
        for row, token in enumerate(pending):
            if not self._can_draft(batch, row):
                drafts.append([])
                continue
            index = self._index(batch, row)
            if len(index.tokens) == len(batch.tokens[row]):
                index.append(token)  # the pending token is the row's next, whatever comes
            # Leave room for the model's own token after the drafts.
            left = batch.max_tokens[row] - batch._num_tokens[row] - 1
            drafts.append(index.propose(min(self.max_draft, left)))
        return drafts

    def _verify(self, batch: Any, pending: list[int], drafts: list[list[int]]) -> list[Any]:
        """Feed every row its pending token and drafts; keep what each row's sampler agrees with."""
        import mlx.core as mx

        width = 1 + max(len(d) for d in drafts)
        inputs = mx.array(
            [[t, *d] + [0] * (width - 1 - len(d)) for t, d in zip(pending, drafts, strict=True)],
            mx.uint32,
        )
        logits = batch.model(inputs, cache=batch.prompt_cache)
        if any(batch.logits_processors):
            logits = _process(batch, inputs, logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        picks = _sample(batch, logprobs, [1 + len(d) for d in drafts])

        responses: list[DraftedResponse] = []
        drop: list[int] = []
        keep: list[int] = []
        finished: list[tuple[int, int, str]] = []  # (row, its last response, why)
        next_tokens: list[int] = []
        next_logprobs: list[Any] = []
        for row, (token, draft, pick) in enumerate(zip(pending, drafts, picks, strict=True)):
            accepted = 0
            while accepted < len(draft) and pick[accepted] == draft[accepted]:
                accepted += 1
            emitted, reason = _ends(batch, row, [token, *draft[:accepted]])
            batch.tokens[row].extend(emitted)
            drop.append(width - len(emitted))
            for i, t in enumerate(emitted):
                response = DraftedResponse(
                    uid=batch.uids[row],
                    token=t,
                    logprobs=batch._next_logprobs[row] if i == 0 else logprobs[row, i - 1],
                    finish_reason=None,
                    prompt_cache=None,
                    all_tokens=None,
                    drafted=len(draft) if i == 0 else 0,
                    accepted=i > 0,
                )
                responses.append(response)
            if reason is None:
                keep.append(row)
            else:
                finished.append((row, len(responses) - 1, reason))
            next_tokens.append(pick[accepted])
            next_logprobs.append(logprobs[row, accepted])
        roll_back_rows(batch.prompt_cache, drop)
        for row, at, reason in finished:
            last = responses[at]
            last.finish_reason = reason
            last.prompt_cache = batch.extract_cache(row)
            last.all_tokens = batch.tokens[row]
        batch._current_tokens = inputs[:, 0]
        batch._next_tokens = mx.array(next_tokens, mx.uint32)
        batch._next_logprobs = next_logprobs
        if len(keep) < len(batch.uids):
            batch.filter(keep)
        return responses


def add_token(builder: Any, response: Any) -> Any:
    """``builder.add`` of a response's token, counting the drafts of its round (on the
    round's first token) and whether it is an accepted draft."""
    if isinstance(response, DraftedResponse):
        builder.drafted += response.drafted
        builder.accepted += response.accepted
    return builder.add(int(response.token))


def _ends(batch: Any, row: int, tokens: list[int]) -> tuple[list[int], str | None]:
    """The tokens the row keeps and why it ends, checked one by one as mlx-lm does."""
    for i, token in enumerate(tokens):
        reason = None
        batch._num_tokens[row] += 1
        if batch._num_tokens[row] >= batch.max_tokens[row]:
            reason = "length"
        if batch._matchers[row].advance(token):
            reason = "stop"
        if reason is not None:
            return tokens[: i + 1], reason
    return tokens, None


def _process(batch: Any, inputs: Any, logits: Any) -> Any:
    """Run each constrained row's processors on its one position, as mlx-lm's step does."""
    import mlx.core as mx

    rows = []
    for row, processors in enumerate(batch.logits_processors):
        row_logits = logits[row]
        if processors:
            context = batch._token_context[row].update_and_fetch(inputs[row, :1])
            first = row_logits[:1]
            for processor in processors:
                first = processor(context, first)
            row_logits = mx.concatenate([first, row_logits[1:]])
        rows.append(row_logits)
    return mx.stack(rows)


def _sample(batch: Any, logprobs: Any, counts: list[int]) -> list[list[int]]:
    """Each row's sampler on its first ``counts[row]`` positions; rows sharing a
    sampler are sampled in one call, as mlx-lm does."""
    import mlx.core as mx

    samplers = [
        batch.fallback_sampler if s is None else s for s in (batch.samplers or [None] * len(counts))
    ]
    groups: dict[int, list[int]] = {}
    for row, sampler in enumerate(samplers):
        groups.setdefault(id(sampler), []).append(row)
    picked: dict[int, Any] = {}
    for rows in groups.values():
        sampler = samplers[rows[0]]
        flat = mx.concatenate([logprobs[row, : counts[row]] for row in rows])
        picked[rows[0]] = sampler(flat)
    mx.eval(list(picked.values()))
    picks: list[list[int]] = [[] for _ in counts]
    for rows in groups.values():
        values = picked[rows[0]].tolist()
        start = 0
        for row in rows:
            picks[row] = values[start : start + counts[row]]
            start += counts[row]
    return picks
