"""A draft model for the requests that share ``BatchedEngine``'s batch (``draft_model``).

The draft model keeps a batch KV cache of its own, one row per row of the target's
batch, in the same order. A row's draft cache holds a prefix of what the target's
cache holds (``GenerationBatch.tokens``); the tokens it lacks (those emitted by plain
steps, and a draft the target kept without the draft model having read it) are its
*lag*. A drafting round:

1. brings the rows in line with the batch: rows that left are filtered out, rows that
   joined are prefilled with their context (each on its own, then merged), and the
   rows put in the batch's order;
2. feeds every row its lag and its pending token, right-padded to one width, and takes
   the draft model's pick at each row's last real position; the padding is rolled out
   of the cache;
3. feeds the picks back ``num_draft_tokens - 1`` times, one position a pass, and reads
   every pick at once (one host sync).

After the target has verified the drafts (:mod:`.speculation`), :meth:`BatchDrafter.settle`
drops from each row's draft cache the positions the target did not keep. The draft
model picks greedily; the target keeps a draft only where it equals its own pick or
sample, so replies are those of plain decoding (greedy) or follow the target's
distribution (sampling), whatever the drafts. Owner thread only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from mlx_integrations.engine.batched.kv_cache import roll_back_rows
from mlx_integrations.engine.decoding import prefill
from mlx_integrations.engine.speculative.draft_model import DraftModel


class BatchDrafter:
    """Drafts by a draft model for the rows of a ``GenerationBatch``.

    Args:
        draft: The engine's draft model (its weights load with the target).
        num_draft_tokens: Tokens drafted per row and round.
        prefill_step_size: Context tokens per forward pass when a row joins.
    """

    def __init__(self, draft: DraftModel, num_draft_tokens: int, prefill_step_size: int):
        self._draft = draft
        self.num_draft = num_draft_tokens
        self._step_size = prefill_step_size
        self._cache: list[Any] | None = None
        self._uids: list[int] = []  # the draft cache's rows, in order
        self._held: dict[int, int] = {}  # uid -> context tokens its draft row holds
        self._round: tuple[list[int], list[int]] | None = None  # (uids, held) at drafting
        self.prefill_s = 0.0
        """Seconds the last :meth:`propose` spent reading the context of rows that joined
        (a row's one-off cost, which :class:`~mlx_integrations.engine.speculative.pace.StepPace` leaves out of the
        step's time)."""

    def reset(self) -> None:
        """Forget every row (a new batch, or the engine unloads)."""
        self._cache, self._uids, self._held, self._round = None, [], {}, None

    def holds(self) -> bool:
        """Whether any row has a draft cache."""
        return bool(self._uids) or self._cache is not None

    def fits(self) -> bool:
        """Whether the draft model is loaded and its cache can roll rows back."""
        from mlx_lm.models.cache import KVCache, make_prompt_cache

        model = self._draft.model
        return model is not None and all(type(c) is KVCache for c in make_prompt_cache(model))

    def propose(self, batch: Any, pending: Sequence[int], limits: Sequence[int]) -> list[list[int]]:
        """Up to ``limits[row]`` drafts for each row (``num_draft_tokens`` at most)."""
        import mlx.core as mx

        model = self._draft.model
        self.prefill_s = 0.0
        self._sync(batch)
        assert self._cache is not None
        rows = len(batch.uids)
        first = [[*batch.tokens[r][self._held[u] :], pending[r]] for r, u in enumerate(batch.uids)]
        width = max(map(len, first))
        inputs = mx.array([f + [0] * (width - len(f)) for f in first], mx.uint32)
        logits = model(inputs, cache=self._cache)
        last = mx.array([len(f) - 1 for f in first])
        pick = mx.argmax(logits[mx.arange(rows), last], axis=-1)
        padding = [width - len(f) for f in first]
        if max(padding):
            roll_back_rows(self._cache, padding)
        picks = [pick]
        for _ in range(self.num_draft - 1):
            pick = mx.argmax(model(pick[:, None], cache=self._cache)[:, -1], axis=-1)
            picks.append(pick)
        drafts: list[list[int]] = mx.stack(picks, axis=1).tolist()  # type: ignore[assignment]
        # Each row now holds its context, its pending token and all drafts but the last.
        self._round = (list(batch.uids), [len(t) for t in batch.tokens])
        for u, n in zip(*self._round, strict=True):
            self._held[u] = n
        return [d[:n] for d, n in zip(drafts, limits, strict=True)]

    def settle(self, emitted: dict[int, int]) -> None:
        """Keep, of each row's positions fed in the round, those the target emitted
        (``emitted[uid]`` tokens, its pending one first); drop the rest."""
        if self._round is None or self._cache is None:
            return
        uids, held = self._round
        self._round = None
        kept = [min(emitted.get(u, 0), self.num_draft) for u in uids]
        for u, n, k in zip(uids, held, kept, strict=True):
            self._held[u] = n + k
        roll_back_rows(self._cache, [self.num_draft - k for k in kept])

    def _sync(self, batch: Any) -> None:
        """Make the draft cache's rows those of ``batch``, in its order."""
        from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

        model = self._draft.model
        live = list(batch.uids)
        present = set(live)
        keep = [i for i, u in enumerate(self._uids) if u in present]
        if self._cache is not None and len(keep) < len(self._uids):
            if keep:
                for layer in self._cache:
                    layer.filter(keep)
            else:
                self._cache = None
            self._uids = [self._uids[i] for i in keep]
        self._held = {u: self._held[u] for u in self._uids}
        joining = [r for r, u in enumerate(live) if u not in self._held]
        if joining:
            start = time.perf_counter()
            rows = []
            for r in joining:
                cache = make_prompt_cache(model)
                prefill(model, cache, batch.tokens[r], self._step_size)
                rows.append(cache)
            merged = [BatchKVCache.merge([c[i] for c in rows]) for i in range(len(rows[0]))]
            if self._cache is None:
                self._cache = merged
            else:
                for layer, more in zip(self._cache, merged, strict=True):
                    layer.extend(more)
            for r in joining:
                self._uids.append(live[r])
                self._held[live[r]] = len(batch.tokens[r])
            self.prefill_s = time.perf_counter() - start
        if self._uids != live:
            where = {u: i for i, u in enumerate(self._uids)}
            order = [where[u] for u in live]
            assert self._cache is not None
            for layer in self._cache:
                layer.filter(order)
            self._uids = live
