"""Reasoning markers: where a model's thinking starts and ends.

mlx-lm's ``TokenizerWrapper`` knows several pairs (``<think>``, ``<longcat_think>``...);
``<think>``/``</think>`` is read when the tokenizer says nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

THINK_MARKERS = ("<think>", "</think>")


def think_markers(tokenizer: Any) -> tuple[str, str] | None:
    """The model's reasoning markers, from its tokenizer; None when it has none."""
    start = getattr(tokenizer, "think_start", None)
    end = getattr(tokenizer, "think_end", None)
    if isinstance(start, str) and isinstance(end, str) and start and end:
        return start, end
    return None


def marker_tokens(tokenizer: Any) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The token ids of the start and end markers, or None when the model has none."""
    markers = think_markers(tokenizer)
    if markers is None:
        return None
    start = getattr(tokenizer, "think_start_tokens", None)
    end = getattr(tokenizer, "think_end_tokens", None)
    if not start or not end:
        start = tuple(tokenizer.encode(markers[0], add_special_tokens=False))
        end = tuple(tokenizer.encode(markers[1], add_special_tokens=False))
    return tuple(int(t) for t in start), tuple(int(t) for t in end)


def opens_reasoning(prompt: str, tokenizer: Any) -> bool:
    """Whether the rendered prompt ends inside an open thinking block.

    Templates of thinking models (DeepSeek-R1, Qwen3 with thinking on) end the
    generation prompt with the start marker: the reply begins as reasoning.
    """
    markers = think_markers(tokenizer)
    return markers is not None and prompt.rstrip().endswith(markers[0])


def closes_reasoning(prompt: str, tokenizer: Any) -> bool:
    """Whether the rendered prompt ends with a closed (usually empty) thinking block:
    the template turned thinking off (Qwen3 with ``enable_thinking=False``)."""
    markers = think_markers(tokenizer)
    return markers is not None and prompt.rstrip().endswith(markers[1])


def _find(tokens: Sequence[int], marker: Sequence[int], start: int) -> int:
    """Where ``marker`` first occurs in ``tokens`` at or after ``start``, else -1."""
    n = len(marker)
    for i in range(start, len(tokens) - n + 1):
        if tuple(tokens[i : i + n]) == tuple(marker):
            return i
    return -1


def reasoning_token_count(tokens: Sequence[int], tokenizer: Any, starts_in_reasoning: bool) -> int:
    """How many of a reply's ``tokens`` are reasoning: those inside thinking blocks,
    the markers left out.

    Args:
        tokens: The generated tokens, in order.
        tokenizer: The model's tokenizer (its think markers).
        starts_in_reasoning: The prompt opened the first thinking block.
    """
    found = marker_tokens(tokenizer)
    if found is None:
        return 0
    start, end = found
    count, pos, inside = 0, 0, starts_in_reasoning
    while pos < len(tokens):
        if inside:
            close = _find(tokens, end, pos)
            stop = close if close >= 0 else len(tokens)
            count += stop - pos
            pos = stop + len(end) if close >= 0 else stop
            inside = False
        else:
            opened = _find(tokens, start, pos)
            if opened < 0:
                break
            pos, inside = opened + len(start), True
    return count
