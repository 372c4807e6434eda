"""Request validation: bad input is rejected here, before any MLX work."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# Keyword arguments the engines understand beyond the contract's named ones.
KNOWN_KWARGS = frozenset(
    {
        "top_k",
        "min_p",
        "repetition_penalty",
        "repetition_context_size",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "seed",
        "logits_processors",
        "request_id",
        "stop",
        "chat_template_kwargs",
        "enable_thinking",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
    }
)


@dataclass
class SamplingParams:
    """Validated decoding settings of one request."""

    max_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 0.9
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float | None = None
    repetition_context_size: int = 20
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    logits_processors: list[Callable[..., Any]] = field(default_factory=list)
    request_id: str = ""


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise TypeError(f"{name} must be a number, got {value!r}")
    return float(value)


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    return value


def validate_sampling(
    max_tokens: Any,
    temperature: Any,
    top_p: Any,
    stop: Any,
    kwargs: dict[str, Any],
) -> SamplingParams:
    """Check every decoding setting and return them typed.

    Raises:
        ValueError: A value is out of range (the message names it and the valid range).
        TypeError: A value has the wrong type.
    """
    max_tokens = _integer("max_tokens", max_tokens)
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    temperature = _number("temperature", temperature)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
    top_p = _number("top_p", top_p)
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}; use 1.0 to disable it")
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p)

    top_k = kwargs.get("top_k")
    if top_k is not None:
        params.top_k = _integer("top_k", top_k)
        if params.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}")
    min_p = kwargs.get("min_p")
    if min_p is not None:
        params.min_p = _number("min_p", min_p)
        if not 0 <= params.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {min_p}")
    for name in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
        value = kwargs.get(name)
        if value is not None:
            value = _number(name, value)
            if name == "repetition_penalty" and value <= 0:
                raise ValueError(f"repetition_penalty must be > 0 (1.0 disables it), got {value}")
            setattr(params, name, value)
    size = kwargs.get("repetition_context_size")
    if size is not None:
        params.repetition_context_size = _integer("repetition_context_size", size)
        if params.repetition_context_size < 1:
            raise ValueError(f"repetition_context_size must be >= 1, got {size}")
    bias = kwargs.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise TypeError(f"logit_bias must be a dict of token id to bias, got {bias!r}")
        params.logit_bias = {int(k): _number("logit_bias value", v) for k, v in bias.items()}
    seed = kwargs.get("seed")
    if seed is not None:
        params.seed = _integer("seed", seed)
    params.stop = validate_stop(stop if stop is not None else kwargs.get("stop"))
    processors = kwargs.get("logits_processors") or []
    if not isinstance(processors, Sequence) or not all(callable(p) for p in processors):
        raise TypeError(
            "logits_processors must be a list of callables (tokens, logits) -> logits, "
            f"got {processors!r}"
        )
    params.logits_processors = list(processors)
    request_id = kwargs.get("request_id")
    if request_id is not None and not isinstance(request_id, str):
        raise TypeError(f"request_id must be a string, got {request_id!r}")
    params.request_id = request_id or f"req-{uuid.uuid4().hex[:16]}"
    return params


def validate_stop(stop: Any) -> list[str]:
    """Accept None, one string, or a list of non-empty strings."""
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise TypeError(f"stop must be a string or a list of strings, got {stop!r}")
    if any(s == "" for s in stop):
        raise ValueError("stop sequences must not be empty strings")
    return list(dict.fromkeys(stop))


def reject_media(images: Any, videos: Any, model_name: str) -> None:
    """Text-only engines refuse images and videos up front."""
    for kind, value in (("images", images), ("videos", videos)):
        if value:
            raise ValueError(
                f"{model_name!r} is a text-only model and cannot take {kind} "
                f"({len(value)} given); remove them or use a vision-language model"
            )
