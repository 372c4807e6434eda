"""Reasoning markers: where a model's thinking starts and ends.

mlx-lm's ``TokenizerWrapper`` knows several pairs (``<think>``, ``<longcat_think>``...);
``<think>``/``</think>`` is read when the tokenizer says nothing.
"""

from __future__ import annotations

from typing import Any

THINK_MARKERS = ("<think>", "</think>")


def think_markers(tokenizer: Any) -> tuple[str, str] | None:
    """The model's reasoning markers, from its tokenizer; None when it has none."""
    start = getattr(tokenizer, "think_start", None)
    end = getattr(tokenizer, "think_end", None)
    if isinstance(start, str) and isinstance(end, str) and start and end:
        return start, end
    return None


def opens_reasoning(prompt: str, tokenizer: Any) -> bool:
    """Whether the rendered prompt ends inside an open thinking block.

    Templates of thinking models (DeepSeek-R1, Qwen3 with thinking on) end the
    generation prompt with the start marker: the reply begins as reasoning.
    """
    markers = think_markers(tokenizer)
    return markers is not None and prompt.rstrip().endswith(markers[0])
