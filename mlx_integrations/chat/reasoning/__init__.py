"""Reasoning: a model's think markers, how its template switches thinking, and a budget.

- :mod:`.markers`: where thinking starts and ends, and counting reasoning tokens.
- :mod:`.switch`: the template's switch (``enable_thinking``, ``reasoning_effort``,
  ``/think`` flags) and the ``reasoning_effort`` levels it takes.
- :mod:`.budget`: a logits processor that closes the thinking after N tokens.
"""

from mlx_integrations.chat.reasoning.budget import ThinkingBudgetProcessor, budget_processors
from mlx_integrations.chat.reasoning.markers import (
    THINK_MARKERS,
    closes_reasoning,
    marker_tokens,
    opens_reasoning,
    reasoning_token_count,
    think_markers,
)
from mlx_integrations.chat.reasoning.switch import (
    EFFORT_LEVELS,
    NO_REASONING,
    ReasoningSwitch,
    apply_effort,
    check_budget,
    check_effort,
    constraint_markers,
    reasoning_switch,
)

__all__ = [
    "EFFORT_LEVELS",
    "NO_REASONING",
    "THINK_MARKERS",
    "ReasoningSwitch",
    "ThinkingBudgetProcessor",
    "apply_effort",
    "budget_processors",
    "check_budget",
    "check_effort",
    "closes_reasoning",
    "constraint_markers",
    "marker_tokens",
    "opens_reasoning",
    "reasoning_switch",
    "reasoning_token_count",
    "think_markers",
]
