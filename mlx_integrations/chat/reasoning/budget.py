"""A thinking budget: after N reasoning tokens the end marker is written for the model.

:class:`ThinkingBudgetProcessor` is a logits processor, so it runs on any engine that
takes them (both of ours, batched or not): it counts the tokens inside thinking
blocks and, once ``budget`` of them are written, leaves only the next token of the
family's end marker (``</think>``) to sample. The answer then follows, under the
request's other processors (a tool-call or JSON constraint holds from the end marker
on, as when the model closes its thinking itself).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from mlx_integrations.chat.reasoning.markers import marker_tokens, think_markers
from mlx_integrations.chat.reasoning.switch import check_budget, model_label, reasoning_switch

if TYPE_CHECKING:
    import mlx.core as mx


class ThinkingBudgetProcessor:
    """Force the end of the thinking after ``budget`` reasoning tokens.

    Called by the decode loop as ``processor(tokens, logits)``: the first call sees
    the prompt, every later one a single more token. Single-use: make one per request.

    Examples:
        >>> processor = ThinkingBudgetProcessor(engine.tokenizer, budget=64)  # doctest: +SKIP
        >>> await engine.chat(messages, logits_processors=[processor])  # doctest: +SKIP

    Args:
        tokenizer: The model's tokenizer (its think markers).
        budget: Most reasoning tokens, over all thinking blocks of the reply; 0 closes
            the thinking as soon as it opens.
        starts_in_reasoning: The prompt opened a thinking block; None reads it from the
            end of the prompt at the first call.

    Raises:
        ValueError: The tokenizer has no think markers.
    """

    def __init__(self, tokenizer: Any, budget: int, starts_in_reasoning: bool | None = None):
        found = marker_tokens(tokenizer)
        markers = think_markers(tokenizer)
        if found is None or markers is None:
            raise ValueError(
                "thinking_budget needs a model that thinks between markers such as "
                "<think>...</think>; this model's tokenizer has none"
            )
        self._start, self._end = found
        self._start_text = markers[0]
        self._tokenizer = tokenizer
        self.budget = budget
        self._inside = starts_in_reasoning
        self._prompt_len: int | None = None
        self._generated: list[int] = []
        self.reasoning_tokens = 0
        """Reasoning tokens written so far (markers left out)."""
        self._masks: dict[tuple[int, int], mx.array] = {}

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        import mlx.core as mx

        if self._prompt_len is None:
            self._prompt_len = tokens.size
            if self._inside is None:
                tail = tokens[-16:].tolist()
                text = self._tokenizer.decode(tail)
                self._inside = text.rstrip().endswith(self._start_text)
        else:
            self._step(cast(int, tokens[-1].item()))
        forced = self._forced()
        if forced is None:
            return logits
        if _banned(logits, forced):
            # A constraint before it does not admit the marker yet: the thinking ends in
            # the middle of a character (its first bytes written), which must be whole
            # first. The constraint admits only what completes it; the marker follows.
            return logits
        width = logits.shape[-1]
        mask = self._masks.get((forced, width))
        if mask is None:
            mask = self._masks[(forced, width)] = mx.arange(width) == forced
        # Whatever the processors before it left: only the forced token remains.
        zero = mx.array(0, dtype=logits.dtype)
        forced_logits = mx.where(mask, zero, mx.array(-mx.inf, dtype=logits.dtype))
        return mx.broadcast_to(forced_logits, logits.shape)

    def _ends_with(self, marker: tuple[int, ...]) -> bool:
        n = len(marker)
        return len(self._generated) >= n and tuple(self._generated[-n:]) == marker

    def _step(self, token: int) -> None:
        self._generated.append(token)
        if self._inside:
            if self._ends_with(self._end):
                # The marker's earlier pieces were counted as they came.
                self.reasoning_tokens -= len(self._end) - 1
                self._inside = False
            else:
                self.reasoning_tokens += 1
        elif self._ends_with(self._start):
            self._inside = True

    def _forced(self) -> int | None:
        """The token the model must write next, or None to let it choose."""
        if not self._inside or self.reasoning_tokens < self.budget:
            return None
        # Part of the end marker may be written already (the model began it).
        for k in range(len(self._end) - 1, 0, -1):
            if self._ends_with(self._end[:k]):
                return self._end[k]
        return self._end[0]


def _banned(logits: mx.array, token: int) -> bool:
    """Whether a processor before this one ruled ``token`` out (a grammar's mask, -inf;
    a bias, however large, is no ban)."""
    import mlx.core as mx

    return bool(mx.isneginf(logits[..., token]).any().item())


def budget_processors(
    tokenizer: Any, budget: int | None, starts_in_reasoning: bool | None
) -> list[ThinkingBudgetProcessor]:
    """``[ThinkingBudgetProcessor]`` for a budget, or ``[]`` for None.

    Raises:
        ValueError: The model does not think (no think markers, or a chat template
            without reasoning), naming the model.
    """
    if check_budget(budget) is None:
        return []
    assert budget is not None
    if not reasoning_switch(tokenizer).thinks:
        raise ValueError(
            f"{model_label(tokenizer)!r} does not think (its chat template has no "
            f"reasoning), so thinking_budget={budget} has nothing to cap; leave it unset"
        )
    return [ThinkingBudgetProcessor(tokenizer, budget, starts_in_reasoning)]
