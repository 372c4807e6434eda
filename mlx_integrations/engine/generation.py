"""Turning sampled tokens into ``GenerationOutput`` chunks.

Shared by the engines: a streaming detokenizer (multi-byte UTF-8 is never split),
stop sequences held back until they are decided, EOS handling, and the counters.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from mlx_integrations.chat.stopping import StopMatcher
from mlx_integrations.engine.base import GenerationOutput
from mlx_integrations.engine.logprobs import LogprobRecorder, TokenLogprob
from mlx_integrations.engine.params import SamplingParams


@dataclass
class MLXGenerationOutput(GenerationOutput):
    """A :class:`GenerationOutput` with the figures adapters report as metadata.

    Extra fields have defaults, so code written for the plain contract type works.
    """

    request_id: str = ""
    cached_tokens: int = 0
    """Prompt tokens served from the KV cache instead of prefilled."""
    ttft_s: float = 0.0
    """Seconds from the request's arrival to its first token."""
    generation_tps: float = 0.0
    """Decode tokens per second, first token excluded."""
    starts_in_reasoning: bool = False
    """The rendered prompt opened a thinking block: the reply begins as reasoning."""
    stop_sequence: str | None = None
    """The stop sequence that ended the reply (``finish_reason="stop"``), None for
    the end-of-sequence token or any other end."""
    logprobs: list[TokenLogprob] | None = None
    """Where the request asked for them: the log-probabilities of the tokens this chunk
    brings (since the previous chunk; all of them in the only chunk of a whole reply)."""


class OutputBuilder:
    """Accumulates one request's tokens and text; emits chunks."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        request_id: str,
        prompt_tokens: int,
        cached_tokens: int,
        stop: list[str],
        max_tokens: int,
        arrival: float,
        stream: bool = True,
        logprobs: LogprobRecorder | None = None,
    ):
        self._stream = stream  # False: only the last chunk is wanted
        self._recorder = logprobs
        self._logprobs: list[TokenLogprob] = []  # of the tokens since the last chunk
        self._detok = tokenizer.detokenizer
        self._eos = set(tokenizer.eos_token_ids)
        self._stop = StopMatcher(stop)
        # Nothing to emit and no stop string to find before the end: the tokens are
        # detokenized once, when the request ends (the same text; byte-level BPE reads
        # them in one pass, :func:`read_whole`), by the detokenizers whose reads change
        # nothing but their offset (mlx-lm's naive one starts over at each line it is
        # read at: it is read token by token).
        self._deferred = not stream and not self._stop.watching and _reads_freely(self._detok)
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = cached_tokens
        self.max_tokens = max_tokens
        self.arrival = arrival
        self.tokens: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        # Speculative decoding: tokens drafted so far and drafts the target accepted.
        self.drafted = 0
        self.accepted = 0
        self._first_token_at: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def add(self, token: int) -> MLXGenerationOutput | None:
        """Take one sampled token; return a chunk when there is new text (streaming) or an end."""
        if self._first_token_at is None:
            self._first_token_at = time.perf_counter()
        self.tokens.append(token)
        if self._recorder is not None:
            self._logprobs.append(self._recorder.resolve(token))
        if token in self._eos:
            return self.finish("stop")
        if self._deferred:
            return self.finish("length") if len(self.tokens) >= self.max_tokens else None
        self._detok.add_token(token)
        new_text = self._stop.feed(self._detok.last_segment)
        if self._stop.stopped:
            return self.finish("stop", new_text)
        if len(self.tokens) >= self.max_tokens:
            return self.finish("length", new_text)
        self.text += new_text
        if not new_text or not self._stream:
            return None
        return self._chunk(new_text)

    def finish(self, reason: str, pending: str = "") -> MLXGenerationOutput:
        """Close the request: flush the detokenizer and any held-back text."""
        if self.finish_reason is not None:
            return self._chunk("")
        new_text = pending
        if self._deferred:
            tokens = [t for t in self.tokens if t not in self._eos]
            if not read_whole(self._detok, tokens):
                add = self._detok.add_token
                for token in tokens:
                    add(token)
        if not self._stop.stopped:
            self._detok.finalize()
            new_text += self._stop.feed(self._detok.last_segment)
            new_text += self._stop.flush()
            if self._stop.stopped and reason == "length":
                # Text held back (an incomplete character) held a stop string: the
                # reply ends at it, as if it had been found a token earlier.
                reason = "stop"
        self.finish_reason = reason
        self.text += new_text
        return self._chunk(new_text)

    def _chunk(self, new_text: str) -> MLXGenerationOutput:
        ttft = (self._first_token_at or self.arrival) - self.arrival
        decode_time = time.perf_counter() - (self._first_token_at or time.perf_counter())
        n = len(self.tokens)
        return MLXGenerationOutput(
            text=self.text,
            tokens=list(self.tokens),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=n,
            finish_reason=self.finish_reason,
            new_text=new_text,
            finished=self.finish_reason is not None,
            mtp_drafts=self.drafted,
            mtp_accepted=self.accepted,
            request_id=self.request_id,
            cached_tokens=self.cached_tokens,
            ttft_s=ttft,
            generation_tps=(n - 1) / decode_time if n > 1 and decode_time > 0 else 0.0,
            stop_sequence=self._stop.matched,
            logprobs=self._take_logprobs(),
        )

    def _take_logprobs(self) -> list[TokenLogprob] | None:
        if self._recorder is None:
            return None
        taken, self._logprobs = self._logprobs, []
        return taken


def _reads_freely(detokenizer: Any) -> bool:
    """Whether reading ``detokenizer``'s text once at the end gives what reading it after
    every token gives (mlx-lm's SentencePiece and byte-level BPE detokenizers)."""
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer

    return type(detokenizer) in (BPEStreamingDetokenizer, SPMStreamingDetokenizer)


def read_whole(detokenizer: Any, tokens: list[int]) -> bool:
    """Give mlx-lm's byte-level BPE ``detokenizer`` (fresh) all of ``tokens`` at once:
    the text that adding them one by one would make, in one pass over their bytes
    rather than a Python call per token. False (nothing done) for other detokenizers
    and for the rare tokens where the streaming reads differ by where they are cut: a
    character outside the byte alphabet, the one for byte 0 (read as its own UTF-8
    bytes inside the text but as a zero byte at the end), and a token of no characters
    (after a lone space it lets a first piece of just a space be read, and trimmed to
    nothing, so that the next piece loses its leading space too)."""
    try:  # _byte_decoder is mlx-lm's own table; a later mlx-lm may move it
        from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, _byte_decoder
    except ImportError:
        return False
    if type(detokenizer) is not BPEStreamingDetokenizer or detokenizer.tokens:
        return False
    tokenmap = getattr(detokenizer, "tokenmap", None)
    if tokenmap is None:
        return False
    n = len(tokenmap)
    pieces = [tokenmap[t] if t < n else "!" for t in tokens]
    if "" in pieces:
        return False
    chars = "".join(pieces)
    if "\u0100" in chars:  # byte 0
        return False
    try:
        data = bytes(map(_byte_decoder().__getitem__, chars))
    except KeyError:  # outside the byte alphabet
        return False
    text = data.decode("utf-8", "replace")
    # Added one by one, each complete piece is read when it is whole (never cut inside a
    # character), and the first piece loses a leading space: the same text.
    detokenizer.text = text[1:] if text.startswith(" ") else text
    detokenizer.tokens = list(tokens)
    detokenizer._unflushed = ""
    return True


def request_processors(p: SamplingParams) -> list[Callable[..., Any]]:
    """mlx-lm's processors for the request's penalties and bias, then the caller's."""
    from mlx_lm.sample_utils import make_logits_processors

    s = p.sampling
    return make_logits_processors(
        dict(s.logit_bias) if s.logit_bias else None,
        s.repetition_penalty,
        s.repetition_context_size,
        s.presence_penalty,
        s.repetition_context_size,
        s.frequency_penalty,
        s.repetition_context_size,
    ) + list(p.logits_processors)


async def last_chunk(stream: AsyncIterator[GenerationOutput]) -> GenerationOutput:
    """The last chunk of a stream: the complete output."""
    last: GenerationOutput | None = None
    async for last in stream:  # noqa: B007
        pass
    assert last is not None
    return last
