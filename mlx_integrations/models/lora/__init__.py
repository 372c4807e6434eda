"""Adapters that ``mlx_lm.lora`` trains (LoRA, DoRA, or the last layers' full weights).

:func:`read_adapter` checks an adapter folder before any model loads; the engines apply
one with :func:`apply_adapter` (their ``adapter_path`` option); :func:`fuse_model` folds
one into its base model, as a new model of the store.

Examples:
    >>> from mlx_integrations.models.lora import fuse_model, read_adapter  # doctest: +SKIP
    >>> read_adapter("adapters").fine_tune_type  # doctest: +SKIP
    'lora'
    >>> fuse_model("smollm2-135m-instruct", "adapters", "smollm2-support")  # doctest: +SKIP
"""

from __future__ import annotations

from mlx_integrations.lazy_imports import lazy_attributes

_EXPORTS = {
    "ADAPTER_CONFIG": "adapter",
    "ADAPTER_WEIGHTS": "adapter",
    "AdapterInfo": "adapter",
    "adapter_bytes": "adapter",
    "adapter_identity": "adapter",
    "apply_adapter": "adapter",
    "check_text_model": "adapter",
    "read_adapter": "adapter",
    "fuse_model": "fuse",
}

__all__ = sorted(_EXPORTS)


# Lazy: the engines check an adapter folder without importing the store's writers.
__getattr__ = lazy_attributes(
    __name__, {name: f"{__name__}.{module}" for name, module in _EXPORTS.items()}
)


def __dir__() -> list[str]:
    return __all__
