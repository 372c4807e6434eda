"""The options a ``DistributedEngine`` is made with: the ``EngineOptions`` fields it
serves, how the model is split over the ranks, and how long a rank may take."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mlx_integrations.chat.fields import RequestError, checking
from mlx_integrations.engine.distributed.ranks import Parallel, positive_seconds
from mlx_integrations.engine.options import EngineOptions


@dataclass(frozen=True)
class DistributedOptions(EngineOptions):
    """How :class:`~mlx_integrations.engine.distributed.engine.DistributedEngine` serves
    its model over the ranks of ``mlxi launch``.

    Raises:
        RequestError: A bad value, or an option the engine does not take (no speculative
            decoding, quantized KV cache, adapter or disk tier across ranks), naming it.
    """

    engine_name: ClassVar[str] = "DistributedEngine"

    parallel: Parallel = "tensor"
    """``"tensor"`` splits every layer over the ranks, ``"pipeline"`` gives each rank a
    run of layers."""
    rank_timeout: float | None = None
    """Seconds a rank may take to answer during a request; None: ``MLXI_RANK_TIMEOUT``,
    else the default."""
    start_timeout: float | None = None
    """Seconds the ranks may take to load and join; None: ``MLXI_START_TIMEOUT``, else the
    default."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.parallel not in ("tensor", "pipeline"):
            raise RequestError(
                f"parallel must be 'tensor' or 'pipeline', got {self.parallel!r}", "parallel"
            )
        for name in ("rank_timeout", "start_timeout"):
            value = getattr(self, name)
            if value is not None:
                with checking(name):
                    positive_seconds(name, value)
        refused = [n for n in ("draft_model", "prompt_lookup", "kv_bits") if getattr(self, n)]
        if refused:
            raise RequestError(
                "DistributedEngine does not take draft_model, prompt_lookup or kv_bits; "
                "drop them, or use SimpleEngine on one machine",
                refused[0],
            )
        if self.adapter_path is not None:  # the ranks load shards with mlx-lm's sharded_load
            raise RequestError(
                "DistributedEngine does not apply adapter_path; fuse the adapter into the "
                "model first (mlxi fuse BASE ADAPTER NAME) and serve that model",
                "adapter_path",
            )
        if self.cache_dir is not None:  # it keeps no prefix cache to put on disk
            raise RequestError(
                "DistributedEngine keeps no prefix cache, so no disk tier: drop cache_dir",
                "cache_dir",
            )
