"""Typed shapes of what engines report: ``get_stats``, ``get_cache_stats``, clears.

Both engines return the same keys where the meaning is the same; ``engine_type``
tells them apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from mlx_integrations.runtime.residency import ResidencyStats

__all__ = [
    "BatchedEngineStats",
    "ClearStats",
    "DiskCacheStats",
    "EngineStats",
    "MemoryStats",
    "PrefixCacheStats",
    "RequestStats",
    "RequestTally",
    "ResidencyStats",
    "SpeculativeStats",
    "memory_stats",
]

_MiB = 1024 * 1024


class DiskCacheStats(TypedDict):
    """The disk tier under the prefix cache (engines made with ``cache_dir``)."""

    path: str
    """The folder of this model's entries: one per model and KV format in ``cache_dir``."""
    entry_count: int
    """Entries (files) on disk now."""
    current_disk_mb: float
    """Bytes of those files, in MiB."""
    max_disk_mb: float
    """Budget (``disk_cache_mb``); the least recently used files are removed beyond it."""
    hits: int
    """Requests whose prompt KV was loaded from disk."""
    misses: int
    """Requests that the memory tier missed and the disk could not serve either."""
    tokens_loaded: int
    """Prompt tokens those hits served."""
    load_seconds: float
    """Time spent reading and checking entries on the owner thread, in all."""
    writes: int
    """Files written since the engine was made."""
    pending_writes: int
    """Entries waiting for the writer thread or being written now."""
    skipped_writes: int
    """Entries not written: the writer was behind (decoding never waits for it), or a
    write failed (a full disk); each failure is logged."""
    evictions: int
    """Files removed to stay within the budget."""
    removed_files: int
    """Files removed without being loaded: damaged, or made for other weights."""


class PrefixCacheStats(TypedDict):
    """State of an engine's prefix (prompt KV) cache."""

    hits: int
    """Requests that reused a cached prefix."""
    misses: int
    """Requests that found nothing to reuse."""
    hit_rate: float
    """hits / (hits + misses), 0.0 before any request."""
    tokens_saved: int
    """Prompt tokens served from the cache instead of prefilled."""
    entry_count: int
    """Cached prefixes held now."""
    pinned_entries: int
    """Entries loaded from warm caches; never evicted, only copied."""
    current_memory_mb: float
    """Bytes held by cached KV, in MiB."""
    max_memory_mb: float
    """Budget; the least recently used entries are evicted beyond it."""
    evictions: int
    """Entries dropped to stay within the budget (written to the disk tier, if any)."""
    disk: DiskCacheStats | None
    """The disk tier; None for an engine made without ``cache_dir``."""


class MemoryStats(TypedDict):
    """MLX allocator figures, in MiB."""

    active_mb: float
    peak_mb: float
    cache_mb: float
    """MLX's buffer pool: freed buffers kept for reuse, returned by ``mx.clear_cache()``."""


class RequestStats(TypedDict):
    """Figures of one finished request."""

    request_id: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float
    generation_tps: float
    finish_reason: str | None
    mtp_drafts: int
    """Tokens drafted for the target to verify (0 without speculative decoding)."""
    mtp_accepted: int
    """Drafted tokens the target accepted."""


class SpeculativeStats(TypedDict):
    """Speculative decoding since the engine was made (``SimpleEngine`` options)."""

    mode: str
    """"draft_model", "prompt_lookup" or "off"."""
    draft_model: str | None
    max_draft_tokens: int
    """Most tokens drafted per verification step (0 when off)."""
    drafted_tokens: int
    accepted_tokens: int
    acceptance_rate: float
    """accepted / drafted, 0.0 before any draft."""


class EngineStats(TypedDict):
    """What ``get_stats()`` returns."""

    engine_type: str
    """"simple" or "batched"."""
    model_name: str
    uptime_seconds: float
    loaded: bool
    running: bool
    num_running: int
    num_waiting: int
    num_requests_processed: int
    num_requests_aborted: int
    num_requests_failed: int
    total_prompt_tokens: int
    total_completion_tokens: int
    total_cached_tokens: int
    admission: str
    """"wait" (queue) or "fail_fast" (raise EngineBusy)."""
    busy_rejections: int
    last_request: RequestStats | None
    speculative: SpeculativeStats
    prefix_cache: PrefixCacheStats
    memory: MemoryStats
    residency: ResidencyStats
    """Memory the model holds, its last use, keep-alive, expiry and pin (the
    :class:`~mlx_integrations.runtime.residency.ResidencyStats` keys)."""


class BatchedEngineStats(EngineStats):
    """What ``BatchedEngine.get_stats()`` returns: the common keys and the batch's."""

    max_num_seqs: int
    """Most sequences in the running batch; more requests wait."""
    batch_size: int
    """Sequences in the last decode step."""
    peak_batch_size: int
    """Most sequences seen in one decode step."""
    mean_batch_size: float
    """Sequences per decode step, on average (a speculative step may give a sequence
    several tokens; it counts once)."""
    steps_executed: int
    """Decode steps run since the engine was made."""
    generator_resets: int
    """Times a failed decode step ended the whole batch and the generator was rebuilt."""
    solo_requests: int
    """Times a request went on alone, outside the batch until another joined: when it
    found the engine idle, or when the batch ended but for it."""
    solo_tokens: int
    """Tokens decoded that way (drafting when the engine has a draft source)."""
    speculation_off_requests: int
    """With ``prompt_lookup`` or ``draft_model`` on: requests that joined the shared batch
    and decode there without drafts: they have logits processors or a seeded sampler,
    or the batch cannot draft (a sliding-window or state-space batch cache, or a draft
    model whose own cache cannot drop positions)."""
    grouped_prefill_requests: int
    """Requests prefilled with others that arrived with them in a batch padded to a
    bucket's length and a power of two of rows (where prefill pieces are padded,
    ``prefill_buckets``: CUDA by default), rather than at the group's exact shape."""


class ClearStats(TypedDict):
    """What ``clear_runtime_caches()`` freed."""

    dropped_entries: int
    """Prefix-cache entries dropped (warm entries are kept)."""
    freed_cache_mb: float
    """KV bytes those entries held."""
    freed_buffer_pool_mb: float
    """MLX buffer-pool bytes returned to the system by ``mx.clear_cache()``."""


def memory_stats() -> MemoryStats:
    """MLX allocator figures (zeros while MLX is not imported)."""
    import sys

    if "mlx.core" not in sys.modules:
        return MemoryStats(active_mb=0.0, peak_mb=0.0, cache_mb=0.0)
    import mlx.core as mx

    return MemoryStats(
        active_mb=mx.get_active_memory() / _MiB,
        peak_mb=mx.get_peak_memory() / _MiB,
        cache_mb=mx.get_cache_memory() / _MiB,
    )


@dataclass
class RequestTally:
    """What the requests an engine ended add up to; the engine's lock guards it."""

    processed: int = 0
    aborted: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    last: RequestStats | None = None

    def record(self, request_id: str, prompt_tokens: int, result: Any, started: bool) -> None:
        """Count one ended request: ``result`` is its last output or its exception."""
        if isinstance(result, BaseException):
            self.failed += 1
            return
        if result.finish_reason == "abort":
            self.aborted += 1
        else:
            self.processed += 1
        if not started:
            return
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += result.completion_tokens
        self.cached_tokens += result.cached_tokens
        self.drafted_tokens += result.mtp_drafts
        self.accepted_tokens += result.mtp_accepted
        self.last = RequestStats(
            request_id=request_id,
            prompt_tokens=prompt_tokens,
            cached_tokens=result.cached_tokens,
            completion_tokens=result.completion_tokens,
            ttft_s=result.ttft_s,
            generation_tps=result.generation_tps,
            finish_reason=result.finish_reason,
            mtp_drafts=result.mtp_drafts,
            mtp_accepted=result.mtp_accepted,
        )
