"""Engines: the contract and its implementations on mlx-lm.

The contract is :mod:`.base`; what every engine on mlx-lm shares sits beside it
(:mod:`.mlx_engine`, :mod:`.lifecycle`, :mod:`.options`, :mod:`.params`, :mod:`.jobs`,
:mod:`.decoding`, :mod:`.generation`, :mod:`.stats`, :mod:`.pool`), with ``SimpleEngine`` in
:mod:`.simple`.
A package per concept holds the rest: :mod:`.batched`, :mod:`.speculative`,
:mod:`.distributed`, :mod:`.vision` and :mod:`.cache`. ``EmbeddingEngine`` comes from
:mod:`mlx_integrations.embeddings`, a layer of its own.

Importing this package imports neither LangChain nor LlamaIndex, and no MLX until an
engine loads a model.
"""

from mlx_integrations.engine.base import (
    BaseEngine,
    EngineBusy,
    GenerationOutput,
    cleanup_startup_cancellation,
    run_blocking_startup_work,
    suspend_cancellation,
)
from mlx_integrations.lazy_imports import lazy_attributes

__all__ = [
    "BaseEngine",
    "BatchedEngine",
    "DistributedEngine",
    "DistributedError",
    "EmbeddingEngine",
    "EngineBusy",
    "EngineOptions",
    "GenerationOutput",
    "MemoryBudgetExceeded",
    "ModelTooLarge",
    "RequestTooLarge",
    "SimpleEngine",
    "cleanup_startup_cancellation",
    "run_blocking_startup_work",
    "suspend_cancellation",
    "warm_disk_cache",
]


__getattr__ = lazy_attributes(
    __name__,
    {
        "BatchedEngine": "mlx_integrations.engine.batched.engine",
        "DistributedEngine": "mlx_integrations.engine.distributed.engine",
        "DistributedError": "mlx_integrations.engine.distributed.engine",
        "EmbeddingEngine": "mlx_integrations.embeddings.engine",
        "EngineOptions": "mlx_integrations.engine.options",
        "MemoryBudgetExceeded": "mlx_integrations.runtime.residency",
        "ModelTooLarge": "mlx_integrations.runtime.residency",
        "RequestTooLarge": "mlx_integrations.runtime.residency",
        "SimpleEngine": "mlx_integrations.engine.simple",
        "warm_disk_cache": "mlx_integrations.engine.cache.disk_warm",
    },
)
