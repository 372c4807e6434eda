"""A request's fields: the error that names the field at fault, and the checks of the
plain values (sampling, stop sequences, ``max_tokens``, ``logit_bias``, the chat
template's variables, custom logits processors, a call's ``timeout``).

Every check of a request (the chat core's, an engine's, the server's protocol models)
raises :class:`RequestError` with the field's path, so a caller learns which field it
was without reading the message.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "RequestError",
    "RequestTypeError",
    "Sampling",
    "check_logit_bias",
    "check_logprobs",
    "check_max_tokens",
    "check_processors",
    "check_stop",
    "check_template_kwargs",
    "check_timeout",
    "checking",
    "request_error",
]


class RequestError(ValueError):
    """A bad value in a request (or in an engine's options), with the field's path.

    Attributes:
        path: Where the value sits, in the OpenAI chat-completions spelling:
            ``"temperature"``, ``"tools[2].function.parameters"``,
            ``"messages[3].content"``; ``""`` when no one field is at fault.
        message: What is wrong and what to do (``str(exc)``).
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.path))


class RequestTypeError(RequestError, TypeError):
    """A request value of the wrong type (a :class:`RequestError` and a ``TypeError``)."""


def request_error(exc: TypeError | ValueError, path: str) -> RequestError:
    """``exc`` as a :class:`RequestError` at ``path`` (its own path kept if it has one)."""
    if isinstance(exc, RequestError):
        if not exc.path:
            exc.path = path
        return exc
    kind = RequestTypeError if isinstance(exc, TypeError) else RequestError
    error = kind(str(exc), path)
    error.__cause__ = exc.__cause__
    return error


@contextmanager
def checking(path: str) -> Iterator[None]:
    """Turn a plain ``TypeError``/``ValueError`` raised inside into a
    :class:`RequestError` at ``path`` (one with a path of its own keeps it)."""
    try:
        yield
    except (TypeError, ValueError) as exc:
        raise request_error(exc, path) from None


def _number(name: str, value: Any) -> float:
    """A finite real number; inf and nan are refused (they make sampling meaningless)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestTypeError(f"{name} must be a number, got {value!r}", name)
    if not math.isfinite(value):
        raise RequestError(f"{name} must be a finite number, got {value!r}", name)
    return float(value)


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestTypeError(f"{name} must be an integer, got {value!r}", name)
    return value


def _token_id(key: Any) -> int:
    """A logit_bias key: an integer, or its decimal string (OpenAI's JSON form)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, str) and key.strip().lstrip("-").isdigit():
        return int(key)
    raise RequestTypeError(
        f"logit_bias keys must be token ids (integers such as 42 or '42'), got {key!r}; "
        "map a token's text to its id with the tokenizer (tokenizer.encode)",
        "logit_bias",
    )


def check_logit_bias(bias: Any, vocab_size: int | None = None) -> dict[int, float]:
    """A token id -> bias mapping, checked; the ids against the vocabulary where its size
    is known (the engine checks them when it takes the request).

    Raises:
        RequestError: Not a mapping, a key that is no token id, a value that is no
            number, an id outside ``[0, vocab_size)``, or a non-finite bias.
    """
    if not isinstance(bias, Mapping):
        raise RequestTypeError(
            f"logit_bias must be a dict of token id to bias, got {bias!r}", "logit_bias"
        )
    checked: dict[int, float] = {}
    for key, value in bias.items():
        token = _token_id(key)
        if vocab_size is not None and not 0 <= token < vocab_size:
            raise RequestError(
                f"logit_bias token id {token} is outside the model's vocabulary "
                f"(valid ids: 0 to {vocab_size - 1}); remove it or use an id from this "
                "model's tokenizer",
                "logit_bias",
            )
        try:
            checked[token] = _number(f"logit_bias[{token}]", value)
        except RequestError as exc:
            exc.path = "logit_bias"
            raise
    return checked


def check_template_kwargs(value: Any, name: str = "chat_template_kwargs") -> dict[str, Any]:
    """Chat template variables: None or a dict with string keys.

    Raises:
        RequestTypeError: Anything else, at ``name``.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise RequestTypeError(
            f"{name} must be a dict of template variable names to values, such as "
            f"{{'enable_thinking': False}}; got {value!r}",
            name,
        )
    return dict(value)


def check_stop(stop: Any) -> tuple[str, ...]:
    """None, one string, or a list of non-empty strings; duplicates dropped.

    Raises:
        RequestError: Another value, at ``stop``.
    """
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise RequestTypeError(f"stop must be a string or a list of strings, got {stop!r}", "stop")
    if any(s == "" for s in stop):
        raise RequestError("stop sequences must not be empty strings", "stop")
    return tuple(dict.fromkeys(stop))


def check_max_tokens(value: Any) -> int:
    """Most tokens to generate: an integer >= 1."""
    max_tokens = _integer("max_tokens", value)
    if max_tokens < 1:
        raise RequestError(f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
    return max_tokens


def check_processors(value: Any) -> tuple[Callable[..., Any], ...]:
    """Custom logits processors: a list of callables ``(tokens, logits) -> logits``."""
    processors = value or ()
    if not isinstance(processors, Sequence) or not all(callable(p) for p in processors):
        raise RequestTypeError(
            "logits_processors must be a list of callables (tokens, logits) -> logits, "
            f"got {value!r}",
            "logits_processors",
        )
    return tuple(processors)


@dataclass(frozen=True)
class Sampling:
    """How the next token is drawn: checked values, the defaults mlx-lm's.

    Build one with :meth:`check` (every value checked, errors naming the field).
    """

    temperature: float = 0.7
    """0 is greedy."""
    top_p: float = 1.0
    """Nucleus threshold in (0, 1]; 1.0 disables it."""
    top_k: int = 0
    """Sample among the k most likely tokens; 0 disables it."""
    min_p: float = 0.0
    """Drop tokens less likely than min_p times the top one; 0 disables it."""
    repetition_penalty: float | None = None
    repetition_context_size: int = 20
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: Mapping[int, float] | None = field(default=None, hash=False)
    seed: int | None = None

    @classmethod
    def check(
        cls,
        temperature: Any = 0.7,
        top_p: Any = 1.0,
        *,
        top_k: Any = None,
        min_p: Any = None,
        repetition_penalty: Any = None,
        repetition_context_size: Any = None,
        presence_penalty: Any = None,
        frequency_penalty: Any = None,
        logit_bias: Any = None,
        seed: Any = None,
    ) -> Sampling:
        """Check every value (None leaves the default) and return them typed.

        Raises:
            RequestError: A value out of range or of the wrong type, at its name.
        """
        temperature = _number("temperature", temperature)
        if temperature < 0:
            raise RequestError(
                f"temperature must be >= 0 (0 means greedy), got {temperature}", "temperature"
            )
        top_p = _number("top_p", top_p)
        if not 0 < top_p <= 1:
            raise RequestError(
                f"top_p must be in (0, 1], got {top_p}; use 1.0 to disable it", "top_p"
            )
        values: dict[str, Any] = {"temperature": temperature, "top_p": top_p}
        if top_k is not None:
            values["top_k"] = _integer("top_k", top_k)
            if values["top_k"] < 0:
                raise RequestError(f"top_k must be >= 0 (0 disables it), got {top_k}", "top_k")
        if min_p is not None:
            values["min_p"] = _number("min_p", min_p)
            if not 0 <= values["min_p"] <= 1:
                raise RequestError(f"min_p must be in [0, 1], got {min_p}", "min_p")
        penalties = (
            ("repetition_penalty", repetition_penalty),
            ("presence_penalty", presence_penalty),
            ("frequency_penalty", frequency_penalty),
        )
        for name, value in penalties:
            if value is not None:
                values[name] = _number(name, value)
        if values.get("repetition_penalty", 1.0) <= 0:
            raise RequestError(
                f"repetition_penalty must be > 0 (1.0 disables it), got {repetition_penalty}",
                "repetition_penalty",
            )
        if repetition_context_size is not None:
            size = _integer("repetition_context_size", repetition_context_size)
            if size < 1:
                raise RequestError(
                    f"repetition_context_size must be >= 1, got {size}", "repetition_context_size"
                )
            values["repetition_context_size"] = size
        if logit_bias is not None:
            values["logit_bias"] = check_logit_bias(logit_bias) or None
        if seed is not None:
            values["seed"] = _integer("seed", seed)
        return cls(**values)

    def options(self) -> dict[str, Any]:
        """The values that differ from the defaults, as the contract's keyword arguments
        (``temperature`` and ``top_p`` are named arguments there, so left out)."""
        default = Sampling()
        return {
            name: getattr(self, name)
            for name in _SAMPLING_OPTIONS
            if getattr(self, name) != getattr(default, name)
        }


_SAMPLING_OPTIONS = (
    "top_k",
    "min_p",
    "repetition_penalty",
    "repetition_context_size",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "seed",
)


def check_timeout(value: Any) -> float | None:
    """A call's ``timeout``: seconds as a positive finite number, or None for no limit.

    Raises:
        RequestError: Not a number (a ``RequestTypeError``), zero, negative, infinite
            or NaN, at ``timeout``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestTypeError(
            f"timeout must be a number of seconds or None, got {type(value).__name__} {value!r}",
            "timeout",
        )
    if not math.isfinite(value) or value <= 0:
        raise RequestError(
            f"timeout must be a positive finite number of seconds, got {value!r}; "
            "use None for no limit",
            "timeout",
        )
    return float(value)


MAX_TOP_LOGPROBS = 20
"""Most alternatives per token a request may ask for (OpenAI's bound)."""


def check_logprobs(logprobs: Any, top_logprobs: Any) -> int | None:
    """How many alternatives per token to report, or None for no log-probabilities.

    Raises:
        RequestError: ``logprobs`` not true or false, ``top_logprobs`` not an integer
            from 0 to 20, or ``top_logprobs`` above 0 with ``logprobs=False``.
    """
    if logprobs is not None and not isinstance(logprobs, bool):
        raise RequestTypeError(f"logprobs must be true or false, got {logprobs!r}", "logprobs")
    if top_logprobs is None:
        return 0 if logprobs else None
    top = _integer("top_logprobs", top_logprobs)
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise RequestError(
            f"top_logprobs must be from 0 to {MAX_TOP_LOGPROBS}, got {top}", "top_logprobs"
        )
    if logprobs is False and top:
        raise RequestError(
            f"top_logprobs={top} needs logprobs=true (or leave logprobs out)", "top_logprobs"
        )
    return top if (logprobs or top) else None
