"""The checks that the adapters' settings share: sampling fields as the engines check them,
and constructor arguments that no field takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mlx_integrations.engine.params import validate_sampling

# The adapter fields that are engine sampling settings, checked as the engines check them.
_ADAPTER_OPTIONS = ("top_k", "min_p", "repetition_penalty", "seed", "chat_template_kwargs")


def validate_adapter_settings(adapter: Any) -> None:
    """Check an adapter's (``ChatMLX``/``MLXLLM``) sampling fields as the engines do.

    Raises:
        ValueError: A value out of range or not finite. TypeError: a wrong type.
    """
    validate_sampling(
        adapter.max_tokens,
        adapter.temperature,
        adapter.top_p,
        adapter.stop,
        {name: getattr(adapter, name, None) for name in _ADAPTER_OPTIONS},
    )


def validate_request_settings(request: Any) -> None:
    """Check one adapter call's settings (a chat core ``ChatRequest``) before it is sent."""
    validate_sampling(
        request.max_tokens, request.temperature, request.top_p, request.stop, request.options
    )


def reject_unknown_fields(adapter: str, data: Any, known: set[str]) -> None:
    """Refuse constructor arguments an adapter has no field for, instead of dropping them.

    Raises:
        ValueError: Naming the unknown fields and the known ones.
    """
    if not isinstance(data, Mapping):
        return
    unknown = sorted(str(k) for k in data if k not in known)
    if not unknown:
        return
    hint = ""
    if "n" in unknown:
        hint = (
            f" {adapter} makes one generation per call; for several, call it several "
            "times (batch) with temperature > 0."
        )
    raise ValueError(
        f"{adapter} got unknown field(s) {unknown}.{hint} Known fields: {sorted(known)}"
    )


def model_field_names(model_cls: Any) -> set[str]:
    """A pydantic model's field names and aliases (what its constructor accepts)."""
    names: set[str] = set()
    for name, info in model_cls.model_fields.items():
        names.add(name)
        for alias in (info.alias, info.validation_alias):
            if isinstance(alias, str):
                names.add(alias)
    return names
