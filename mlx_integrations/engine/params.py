"""One request's decoding settings as the owner thread runs them.

The values are checked once, at the edge, into a chat-core
:class:`~mlx_integrations.chat.request.Sampling`; what only the model can tell (its
vocabulary size) is checked here, when the engine takes the request, as is a raw
prompt (text, or token ids of the vocabulary) and how it is encoded.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mlx_integrations.chat.fields import (
    RequestError,
    Sampling,
    check_logit_bias,
    check_logprobs,
    check_max_tokens,
    check_processors,
    check_stop,
    check_template_kwargs,
)
from mlx_integrations.chat.messages import check_text
from mlx_integrations.chat.request import (
    ChatRequest,
    Reasoning,
    RequestTypeError,
    check_call_keywords,
)
from mlx_integrations.engine.logprobs import LogprobRecorder


@dataclass
class SamplingParams:
    """One request's decoding settings as its decode loop runs them."""

    sampling: Sampling = field(default_factory=Sampling)
    """How tokens are drawn, checked (``top_k`` within the vocabulary, ``logit_bias``
    ids in it)."""
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    logits_processors: list[Callable[..., Any]] = field(default_factory=list)
    request_id: str = ""
    logprobs: LogprobRecorder | None = None
    """Records the reply's token log-probabilities (the last of ``logits_processors``)."""

    def record_logprobs(self, top: int | None) -> None:
        """Record the log-probabilities of the reply's tokens (and ``top`` alternatives
        per step): a processor after every other one. None: none."""
        if top is not None:
            self.logprobs = LogprobRecorder(top)
            self.logits_processors.append(self.logprobs)

    @property
    def seeded_sampling(self) -> bool:
        """Sampling with a seed: its draws must depend on its tokens alone (never on
        timing or on the requests beside it), so speculation adapts nothing to it."""
        return self.sampling.seed is not None and self.sampling.temperature > 0

    @classmethod
    def of(
        cls,
        sampling: Sampling,
        max_tokens: int,
        stop: tuple[str, ...] | list[str],
        processors: tuple[Callable[..., Any], ...] | list[Callable[..., Any]],
        request_id: str | None,
        vocab_size: int | None,
    ) -> SamplingParams:
        """The settings of a checked request, for a model of ``vocab_size`` tokens.

        ``top_k`` at or above ``vocab_size`` keeps every token, so it is taken as 0
        (top-k off) rather than handed to mlx-lm, which refuses it in the middle of
        generation.

        Raises:
            RequestError: A ``logit_bias`` id outside the vocabulary (at ``logit_bias``).
        """
        top_k = sampling.top_k
        if vocab_size is not None and top_k >= vocab_size:
            top_k = 0  # keeping the k >= vocabulary most likely tokens keeps all
        bias = sampling.logit_bias
        if bias:
            bias = check_logit_bias(bias, vocab_size if vocab_size is not None else _NO_SIZE)
        return cls(
            sampling=replace(sampling, top_k=top_k, logit_bias=dict(bias) if bias else None),
            max_tokens=max_tokens,
            stop=list(stop),
            logits_processors=list(processors),
            request_id=request_id or f"req-{uuid.uuid4().hex[:16]}",
        )

    @classmethod
    def for_request(cls, request: ChatRequest, vocab_size: int | None) -> SamplingParams:
        """The settings of a chat request (its own processors first)."""
        return cls.of(
            request.sampling,
            request.max_tokens,
            request.stop,
            request.logits_processors,
            request.request_id,
            vocab_size,
        )


def generate_params(
    max_tokens: Any,
    temperature: Any,
    top_p: Any,
    stop: Any,
    kwargs: Mapping[str, Any],
    vocab_size: int | None = None,
) -> SamplingParams:
    """Check the settings of a text completion (the contract's ``generate``), as a chat
    request's are checked.

    Raises:
        RequestError: A bad value, or a keyword no engine of ours takes.
    """
    check_call_keywords(kwargs)
    sampling = Sampling.check(
        temperature,
        top_p,
        **{name: kwargs.get(name) for name in _SAMPLING_KEYWORDS},
    )
    # Chat-only keywords a completion ignores are still checked, as a chat call's are.
    check_template_kwargs(kwargs.get("chat_template_kwargs"))
    Reasoning.check(
        kwargs.get("reasoning_effort"), kwargs.get("enable_thinking"), kwargs.get("thinking_budget")
    )
    request_id = kwargs.get("request_id")
    if request_id is not None and not isinstance(request_id, str):
        raise RequestTypeError(f"request_id must be a string, got {request_id!r}", "request_id")
    params = SamplingParams.of(
        sampling,
        check_max_tokens(max_tokens),
        check_stop(stop if stop is not None else kwargs.get("stop")),
        check_processors(kwargs.get("logits_processors")),
        request_id,
        vocab_size,
    )
    params.record_logprobs(check_logprobs(kwargs.get("logprobs"), kwargs.get("top_logprobs")))
    return params


_NO_SIZE = 2**62
"""The vocabulary bound where the model's size is unknown: ids below it and >= 0 pass."""

_SAMPLING_KEYWORDS = (
    "top_k",
    "min_p",
    "repetition_penalty",
    "repetition_context_size",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "seed",
)


def check_raw_prompt(
    prompt: Any, *, vocab_size: int | None, vision: bool, name: str, scored: bool = False
) -> list[int] | None:
    """Check a raw prompt: non-empty text (None is returned), or a non-empty list of ids
    of the model's vocabulary (returned as a list; a vision model takes text only, and
    its prompts are not ``scored``).

    Raises:
        RequestError: What is wrong, with the path of the id at fault (``prompt[3]``).
    """
    if vision and scored:
        raise RequestError(f"{name!r} is a vision model; its prompts are not scored", "prompt")
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("prompt is empty; pass some text to continue", "prompt")
        check_text(prompt, "prompt")
        return None
    if not isinstance(prompt, Sequence) or isinstance(prompt, (bytes, bytearray)):
        raise RequestTypeError(
            f"prompt must be a string or a list of token ids, got {type(prompt).__name__}",
            "prompt",
        )
    if not prompt:
        raise RequestError("prompt is empty; pass some text or token ids to continue", "prompt")
    if vision:
        raise RequestError(
            f"{name!r} is a vision model, whose prompts are text; send the text", "prompt"
        )
    ids = list(prompt)
    for i, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, int):
            raise RequestTypeError(
                f"prompt[{i}] must be a token id (an integer), got {token!r}", f"prompt[{i}]"
            )
        if vocab_size and not 0 <= token < vocab_size:
            raise RequestError(
                f"prompt[{i}] is token id {token}, outside the vocabulary of {name!r} "
                f"(0 to {vocab_size - 1})",
                f"prompt[{i}]",
            )
    return ids


def encode_raw_prompt(
    tokenizer: Any, prompt: str | Sequence[int], ids: list[int] | None
) -> tuple[str, list[int]]:
    """A checked raw prompt's text and tokens: text is encoded with the
    beginning-of-sequence token where the tokenizer adds one and the text lacks it;
    token ids are taken as they are, their text decoded."""
    if ids is not None:
        return str(tokenizer.decode(ids)), ids
    assert isinstance(prompt, str)
    bos = getattr(tokenizer, "bos_token", None)
    add_special = bos is None or not prompt.startswith(bos)
    return prompt, list(tokenizer.encode(prompt, add_special_tokens=add_special))
