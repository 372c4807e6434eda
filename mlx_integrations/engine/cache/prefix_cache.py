"""A prefix cache of prompt KV states with a memory budget.

Each entry is the KV cache of a token sequence. A new prompt takes the entry with
the longest common prefix, trimmed to that prefix, and prefills only the rest.
A cache is owned by one request at a time: when the prompt extends the whole entry
(the next turn of that conversation), ``take`` removes the entry and hands it over;
when it shares only part of it (a common system prompt, another conversation), or the
entry is pinned, ``take`` hands over a trimmed copy and the entry stays for its own
conversation. ``put`` stores the grown cache after the request.

With a disk tier (:mod:`.disk`), ``take`` loads from disk a prefix longer than any
in memory, and what the memory tier evicts (and the long prompts ``put`` names) is
written there.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from mlx_integrations.engine.cache.cut import cut_length, lay_out, plain_kv
from mlx_integrations.engine.cache.kv_files import common_prefix_len
from mlx_integrations.engine.cache.kv_quantization import layer_nbytes
from mlx_integrations.engine.stats import PrefixCacheStats

if TYPE_CHECKING:
    from mlx_integrations.engine.cache.disk import DiskCache

logger = logging.getLogger(__name__)

MiB = 1024 * 1024


def cache_nbytes(cache: list[Any]) -> int:
    """Bytes held by a list of per-layer caches (quantized layers at their real size)."""
    return sum(layer_nbytes(c) for c in cache)


def _evaluate(cache: list[Any]) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    try:
        states = [layer.state for layer in cache]
    except Exception:  # a cache type whose state cannot be read now: left as it is
        return
    leaves = cast("list[tuple[str, Any]]", tree_flatten(states))
    mx.eval([x for _, x in leaves if isinstance(x, mx.array)])


def cache_offset(cache: list[Any]) -> int:
    """Tokens held by a per-layer cache list (all layers agree)."""
    return int(getattr(cache[0], "offset", 0)) if cache else 0


def copy_cache(cache: list[Any], keep: int | None = None) -> list[Any]:
    """An independent copy of a cache, trimmed to its first ``keep`` tokens if given.

    MLX arrays are immutable, but a cache writes new tokens into its buffers in
    place (rebinding the array objects it holds), so the copy gets array objects of
    its own: writes into the copy never reach the original.
    """
    import mlx.core as mx
    from mlx.utils import tree_map

    def own(x: Any) -> Any:
        return mx.array(x) if isinstance(x, mx.array) else x

    if keep is not None and plain_kv(cache):  # only the kept tokens are copied
        copies = []
        for layer in cache:
            fresh, n = type(layer)(), min(keep, layer.offset)
            fresh.keys = mx.contiguous(layer.keys[..., :n, :])
            fresh.values = mx.contiguous(layer.values[..., :n, :])
            fresh.offset = n
            copies.append(fresh)
        return copies
    copies = []
    for layer in cache:
        if not hasattr(type(layer), "from_state"):
            raise TypeError(f"cannot copy cache layer of type {type(layer).__name__}")
        fresh = type(layer).from_state(tree_map(own, layer.state))
        if hasattr(layer, "meta_state"):
            fresh.meta_state = layer.meta_state
        copies.append(fresh)
    excess = cache_offset(copies) - keep if keep is not None else 0
    if excess > 0:
        for layer in copies:
            layer.trim(excess)
    return copies


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    cache: list[Any]
    nbytes: int
    pinned: bool = False
    last_used: float = field(default_factory=time.monotonic)


class PrefixCache:
    """Longest-prefix KV reuse across requests, bounded in bytes and entries.

    Not thread-safe by design: only the model's owner thread touches it.

    Args:
        max_bytes: Budget of the entries in memory.
        max_entries: Most entries in memory.
        disk: A disk tier under it (entries that outlive the process), or None.
    """

    def __init__(
        self, max_bytes: int = 1024 * MiB, max_entries: int = 8, disk: DiskCache | None = None
    ):
        if max_bytes < 0 or max_entries < 0:
            raise ValueError("max_bytes and max_entries must be >= 0")
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.disk = disk
        self._entries: list[_Entry] = []
        self.hits = 0
        self.misses = 0
        self.tokens_saved = 0
        self.evictions = 0
        self._outside = 0  # bytes of the one entry kept outside the table (a vision turn)

    def take(self, tokens: list[int], key_step: int = 1) -> tuple[list[Any] | None, int]:
        """Find the best cache for ``tokens``.

        Args:
            tokens: The prompt.
            key_step: Serve a plain KV cache's prefix in multiples of this many tokens,
                in buffers exactly that long (where the engine pads prefill pieces:
                ``decoding.KEY_STEP``); a prefix shorter than one step is a miss.

        Returns:
            (cache, reused) where ``cache`` holds exactly the first ``reused`` tokens
            of the prompt (at least one prompt token is always left to prefill), or
            (None, 0) on a miss.
        """
        best: _Entry | None = None
        # (tokens served, whether the prompt extends all of the entry, tokens shared)
        best_rank: tuple[int, bool, int] = (0, False, 0)
        for entry in self._entries:
            n = common_prefix_len(entry.tokens, tokens)
            n = min(n, len(tokens) - 1)
            whole = n == len(entry.tokens)  # its conversation's next turn, or a system prompt
            if not whole and not all(c.is_trimmable() for c in entry.cache):
                continue  # a cache that cannot be trimmed is usable only as a whole
            # A pinned prefix the prompt extends whole (a system prompt, ``mlxi warm``) is
            # the same length every time: served whole, its key lengths repeat anyway.
            served = n if entry.pinned and whole else cut_length(entry.cache, n, key_step)
            # Among equal cuts, the entry the prompt extends whole (its own conversation,
            # handed over rather than copied), then the one sharing most.
            rank = (served, whole, n)
            if served > 0 and rank > best_rank:
                best, best_rank = entry, rank
        best_len, whole = best_rank[0], best_rank[1]
        loaded = self.disk.take(tokens, best_len, key_step) if self.disk is not None else None
        if loaded is not None:  # the disk holds a longer prefix than memory
            self.hits += 1
            self.tokens_saved += loaded[1]
            return loaded
        if best is None or best_len == 0:
            self.misses += 1
            return None, 0
        if best.pinned or not whole:
            cache = copy_cache(best.cache, best_len)
        else:
            self._entries.remove(best)
            cache = best.cache
        if key_step > 1 and plain_kv(cache):
            lay_out(cache, best_len)  # also cuts a whole entry to whole key steps
        best.last_used = time.monotonic()
        self.hits += 1
        self.tokens_saved += best_len
        return cache, best_len

    def put(
        self,
        tokens: list[int],
        cache: list[Any],
        *,
        pinned: bool = False,
        prompt: int | None = None,
        reused: int = 0,
    ) -> None:
        """Store the cache of ``tokens``.

        The cache may have seen fewer tokens than ``tokens`` (the last sampled token
        was never fed back): the entry is keyed by the tokens it holds. A cache that
        holds more tokens than ``tokens`` is trimmed to them, or dropped when it cannot
        be trimmed. ``prompt``, the length of the request's prompt within ``tokens``,
        and ``reused``, the prefix of it the request was served, let the disk tier keep
        a long prompt's prefix (:meth:`~.disk.DiskCache.offer_prompt`).
        """
        if not cache or (
            0 in (self.max_bytes, self.max_entries) and self.disk is None and not pinned
        ):
            return  # nowhere to keep it: evaluating the batch's slice would be wasted
        offset = cache_offset(cache)
        if offset < len(tokens):
            tokens = tokens[:offset]
        elif offset > len(tokens):
            if not all(layer.is_trimmable() for layer in cache):
                return  # holds tokens we cannot name: worth nothing
            for layer in cache:
                layer.trim(offset - len(tokens))
        if not tokens:
            return
        # A cache taken out of a batch is a lazy slice of the batch's buffers: evaluated
        # now, it holds its own bytes (what nbytes says) and lets the batch's go.
        _evaluate(cache)
        if self.disk is not None and prompt and not pinned:
            self.disk.offer_prompt(tokens, cache, prompt, reused)
        key = tuple(tokens)
        entry = _Entry(key, cache, cache_nbytes(cache), pinned)
        if not pinned and entry.nbytes > self.max_bytes:
            self._spill(entry)  # too large for memory: disk only
            return
        # An entry whose tokens begin the new one's serves nothing the new one cannot.
        self._entries = [e for e in self._entries if e.pinned or key[: len(e.tokens)] != e.tokens]
        self._entries.append(entry)
        self._evict()

    def _evict(self) -> None:
        unpinned = sorted((e for e in self._entries if not e.pinned), key=lambda e: e.last_used)
        while unpinned and (self.nbytes > self.max_bytes or len(self._entries) > self.max_entries):
            victim = unpinned.pop(0)
            self._entries.remove(victim)
            self.evictions += 1
            self._spill(victim)

    def _spill(self, entry: _Entry) -> None:
        """Hand an entry that leaves memory to the disk tier."""
        if self.disk is not None:
            self.disk.offer(entry.tokens, entry.cache, len(entry.tokens))

    def load_warm(self, model_dir: Path) -> None:
        """Pin the warm caches stored with a model (``mlxi warm``); a stale or damaged
        one is skipped with a warning, never failing the load."""
        from mlx_integrations.models.warm import load_warm_caches

        try:
            for tokens, cache in load_warm_caches(model_dir):
                self.put(list(tokens), cache, pinned=True)
        except Exception as exc:
            logger.warning("Ignoring warm caches of %s: %s", model_dir, exc)

    def hold_outside(self, nbytes: int) -> bool:
        """Count, within the budget, the one entry an engine keeps outside the table
        (a vision-language model's previous turn); 0 when it holds none.

        Returns False, counting nothing, when it alone is larger than the budget: the
        engine drops it then. Table entries are evicted to make room for it.
        """
        self._outside = nbytes if nbytes <= self.max_bytes else 0
        self._evict()
        return nbytes <= self.max_bytes

    def count_lookup(self, saved: int) -> None:
        """Count a lookup made outside the table: a hit when it saved prompt tokens."""
        if saved > 0:
            self.hits += 1
            self.tokens_saved += saved
        else:
            self.misses += 1

    @property
    def nbytes(self) -> int:
        return self._outside + sum(e.nbytes for e in self._entries)

    def clear(self, *, keep_pinned: bool = True) -> tuple[int, int]:
        """Drop entries; return (entries dropped, bytes they held)."""
        dropped = [e for e in self._entries if not (keep_pinned and e.pinned)]
        self._entries = [e for e in self._entries if keep_pinned and e.pinned]
        outside, self._outside = self._outside, 0
        return len(dropped) + bool(outside), sum(e.nbytes for e in dropped) + outside

    def stats(self) -> PrefixCacheStats:
        lookups = self.hits + self.misses
        return PrefixCacheStats(
            hits=self.hits,
            misses=self.misses,
            hit_rate=self.hits / lookups if lookups else 0.0,
            tokens_saved=self.tokens_saved,
            entry_count=len(self._entries) + bool(self._outside),
            pinned_entries=sum(e.pinned for e in self._entries),
            current_memory_mb=self.nbytes / MiB,
            max_memory_mb=self.max_bytes / MiB,
            evictions=self.evictions,
            disk=self.disk.stats() if self.disk is not None else None,
        )
