"""What a distributed engine reports: the common keys, each rank, and what a clear freed."""

from __future__ import annotations

from typing import TypedDict

from mlx_integrations.engine.stats import ClearStats, EngineStats, MemoryStats


class RankStats(TypedDict):
    """One rank as rank 0 last heard of it."""

    rank: int
    host: str
    pid: int
    alive: bool
    last_heartbeat_s: float
    """Seconds since its last heartbeat (0 for rank 0 itself)."""
    steps: int
    """Decode steps it has followed."""
    memory: MemoryStats


class DistributedStats(EngineStats):
    """``get_stats()`` of a :class:`DistributedEngine`: the common keys, and the ranks."""

    world_size: int
    parallel: str
    state: str
    """``"idle"`` (not loaded), ``"serving"``, ``"stopped"`` or ``"failed"``."""
    error: str | None
    collective_s_per_token: float
    """Seconds per token rank 0 spent sharing tokens, waiting for the others included."""
    ranks: list[RankStats]


class RankClearStats(TypedDict):
    rank: int
    freed_buffer_pool_mb: float


class DistributedClearStats(ClearStats):
    """``clear_runtime_caches()`` of a :class:`DistributedEngine`: the sum, and per rank."""

    ranks: list[RankClearStats]
