"""Engines: the contract and its implementations on mlx-lm.

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
    "EngineBusy",
    "EngineOptions",
    "GenerationOutput",
    "SimpleEngine",
    "cleanup_startup_cancellation",
    "run_blocking_startup_work",
    "suspend_cancellation",
]


__getattr__ = lazy_attributes(
    __name__,
    {
        "BatchedEngine": "mlx_integrations.engine.batched",
        "DistributedEngine": "mlx_integrations.engine.distributed",
        "DistributedError": "mlx_integrations.engine.distributed",
        "EngineOptions": "mlx_integrations.engine.options",
        "SimpleEngine": "mlx_integrations.engine.simple",
    },
)
