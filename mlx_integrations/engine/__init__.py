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

__all__ = [
    "BaseEngine",
    "BatchedEngine",
    "EngineBusy",
    "GenerationOutput",
    "SimpleEngine",
    "cleanup_startup_cancellation",
    "run_blocking_startup_work",
    "suspend_cancellation",
]


def __getattr__(name: str):
    if name == "BatchedEngine":
        from mlx_integrations.engine.batched import BatchedEngine

        return BatchedEngine
    if name == "SimpleEngine":
        from mlx_integrations.engine.simple import SimpleEngine

        return SimpleEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
