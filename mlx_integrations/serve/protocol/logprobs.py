"""Token log-probabilities in replies, as OpenAI's APIs shape them.

Chat completions and Responses list each token of the answer with its text, its
log-probability, its UTF-8 bytes and the most likely tokens of its step
(:class:`TokenLogprob`); the legacy completions API gives parallel lists
(:class:`CompletionLogprobs`).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from mlx_integrations.serve.protocol.base import ReplyModel

__all__ = ["ChoiceLogprobs", "CompletionLogprobs", "TokenLogprob", "TopLogprob"]


class TopLogprob(ReplyModel):
    token: str
    """The token's text (a token holding part of a character reads as U+FFFD)."""
    logprob: float
    """Natural log of its probability, after the request's logits processors (a
    ``logit_bias``, a grammar) and before temperature."""
    bytes: list[int] | None
    """Its exact UTF-8 bytes."""


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)
    """The step's most likely tokens, most likely first (``top_logprobs`` of them)."""


class ChoiceLogprobs(ReplyModel):
    """A chat choice's ``logprobs``: the tokens of its answer text (not those of its
    reasoning or of its tool calls' markup)."""

    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None = None


class CompletionLogprobs(ReplyModel):
    """A text completion's ``logprobs``, the legacy shape: one entry per token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    """Per token, its log-probability (``null`` for an echoed prompt's first token,
    which has nothing before it)."""
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    """Per token, the ``logprobs`` most likely tokens of its step and the token itself."""
    text_offset: list[int] = Field(default_factory=list)
    """Per token, where its text starts in the choice's ``text`` (in characters)."""

    def extend(self, content: list[dict[str, Any]], offsets: list[int]) -> None:
        """Add tokens given in the chat shape (``logprob_content``'s), at ``offsets``."""
        for entry, offset in zip(content, offsets, strict=True):
            self.tokens.append(entry["token"])
            self.token_logprobs.append(entry["logprob"])
            top = {t["token"]: t["logprob"] for t in entry["top_logprobs"]}
            top.setdefault(entry["token"], entry["logprob"])
            self.top_logprobs.append(top)
            self.text_offset.append(offset)
