"""Room for a required answer after the thinking.

A forced tool call or a required JSON answer on a model that thinks first is enforced
once the thinking block ends. A model that thinks on past ``max_tokens`` would never
write it: the guarantee would be lost in silence. So the thinking gets a budget (the
end marker is written for the model, see :mod:`.budget`) that leaves room for the
answer: ``max_tokens`` less the markers and the answer's shortest form with a margin.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from mlx_integrations.chat.fields import RequestError
from mlx_integrations.chat.reasoning.markers import marker_tokens

if TYPE_CHECKING:
    from mlx_integrations.chat.constraints import Constraint
    from mlx_integrations.chat.request import ChatRequest
    from mlx_integrations.chat.tool_formats import ToolFormat
    from mlx_integrations.chat.tools import ToolRequest

MARGIN = 1.5
"""The answer's shortest form times this, plus :data:`SLACK` tokens, is kept for it:
real values are longer than the shortest ones."""
SLACK = 16


def answer_tokens(
    tokenizer: Any, fmt: ToolFormat, tools: ToolRequest, answer: Constraint | None
) -> int | None:
    """Tokens of the shortest reply the request's constraint admits, or None when it
    requires nothing (free text, or calls the model may leave out) or cannot say (a
    user's Lark grammar: its shortest sentence is not known here)."""
    from mlx_integrations.chat.constraints import JsonObjectConstraint, JsonSchemaConstraint
    from mlx_integrations.chat.schemas import shortest_instance

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    if tools.tools and tools.forced:
        return min(
            count(fmt.write_calls([(t.name, shortest_instance(t.constrained_parameters))]))
            for t in tools.callable_tools
        )
    if isinstance(answer, JsonSchemaConstraint):
        return count(json.dumps(shortest_instance(answer.schema)))
    if isinstance(answer, JsonObjectConstraint):
        return count("{}")
    return None


def thinking_room(
    tokenizer: Any,
    fmt: ToolFormat,
    tools: ToolRequest,
    answer: Constraint | None,
    max_tokens: int,
    budget: int | None,
) -> int | None:
    """The thinking budget for a request whose reply may begin with thinking.

    Where the request requires an answer (a forced call, a JSON schema) and gives no
    budget, the budget leaves room for it within ``max_tokens`` (its shortest form
    with a margin); a budget given stands unless even the shortest answer could not
    follow it. Otherwise ``budget`` as given.

    Raises:
        RequestError: A ``budget`` after which the shortest answer does not fit (at
            ``thinking_budget``), before any work.
    """
    needed = answer_tokens(tokenizer, fmt, tools, answer)
    markers = marker_tokens(tokenizer)
    if needed is None or markers is None:
        return budget
    free = max_tokens - len(markers[0]) - len(markers[1])
    if budget is not None:
        # The user's budget stands unless even the shortest answer cannot follow it.
        if budget > free - needed:
            what = "tool call" if tools.forced else "JSON answer"
            raise RequestError(
                f"thinking_budget={budget} leaves no room for the required {what} within "
                f"max_tokens={max_tokens}: its shortest form takes {needed} tokens after "
                f"the thinking ends; lower thinking_budget to {max(free - needed, 0)} or "
                f"less, or raise max_tokens to {max_tokens + budget - free + needed} or more",
                "thinking_budget",
            )
        return budget
    return max(free - math.ceil(needed * MARGIN) - SLACK, 0)


def reply_processors(
    tokenizer: Any,
    prompt: str,
    fmt: ToolFormat,
    request: ChatRequest,
    max_tokens: int,
    in_reasoning: bool,
) -> list[Any]:
    """The logits processors that hold a reply to ``request`` once its prompt is
    rendered: the tool-call or JSON constraint, holding from the end of a thinking
    block on (one the prompt opens, or one the model may open where its template has a
    switch), then the thinking budget, which leaves room for a required answer and,
    where it is spent, overrides the others.

    Raises:
        RequestError: A ``thinking_budget`` that leaves no room for a required answer.
        ValueError: A constraint the tokenizer cannot take; a budget for a model that
            does not think.
    """
    from mlx_integrations.chat.constraints import constraint_processors
    from mlx_integrations.chat.reasoning.budget import budget_processors
    from mlx_integrations.chat.reasoning.switch import constraint_markers

    tools, answer = request.tools, request.format_constraint
    reasoning_end, reasoning_start = constraint_markers(prompt, tokenizer)
    processors: list[Any] = []
    if answer is not None or tools.tools:
        processors += constraint_processors(
            tokenizer, fmt, tools, answer, reasoning_end, reasoning_start
        )
    budget = request.reasoning.budget
    if reasoning_end is not None:
        budget = thinking_room(tokenizer, fmt, tools, answer, max_tokens, budget)
    return processors + budget_processors(tokenizer, budget, in_reasoning)
