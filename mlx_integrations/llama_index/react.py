"""Constrained ReAct: make any model write the lines a ReAct agent parses.

A ReAct agent reads ``Thought: ...`` then either ``Action: <tool>`` with
``Action Input: {json}``, or ``Answer: ...``. Small models drift from that format;
this grammar holds them to it, and each action's input to its tool's schema.

Examples:
    >>> from llama_index.core.agent.workflow import ReActAgent
    >>> from mlx_integrations.llama_index import MLXLLM, react_response_format
    >>> llm = MLXLLM(model="smollm2-135m-instruct",
    ...              response_format=react_response_format([weather_tool]))  # doctest: +SKIP
    >>> agent = ReActAgent(tools=[weather_tool], llm=llm)  # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from mlx_integrations.chat.tools import closed_schema


def react_grammar(
    tools: Sequence[Any],
    *,
    answer: bool = True,
    action: bool = True,
    max_thought: int = 200,
    max_answer: int = 600,
) -> str:
    """The Lark grammar of one ReAct step over ``tools`` (LlamaIndex tools or OpenAI dicts).

    ``answer=False`` makes the step an action; ``action=False`` makes it an answer.
    """
    if not tools:
        raise ValueError("react_grammar needs at least one tool")
    if not (answer or action):
        raise ValueError("a ReAct step must allow an action, an answer or both")
    actions = []
    for i, tool in enumerate(tools):
        spec = tool.metadata.to_openai_tool() if hasattr(tool, "metadata") else tool
        fn = spec.get("function", spec)
        schema = closed_schema(fn.get("parameters") or {"type": "object", "properties": {}})
        schema["x-guidance"] = {
            "whitespace_flexible": False,
            "item_separator": ", ",
            "key_separator": ": ",
        }
        actions.append(
            f'action_{i}: {json.dumps(fn["name"])} "\\nAction Input: " %json {json.dumps(schema)}'
        )
    alternatives = " | ".join(f"action_{i}" for i in range(len(actions)))
    return "\n".join(
        [
            'start: "Thought: " THOUGHT "\\n" '
            + " | ".join(k for k, on in (("action", action), ("answer", answer)) if on).join("()"),
            f'action: "Action: " ({alternatives})',
            'answer: "Answer: " ANSWER',
            f"THOUGHT: /[^\\n]{{1,{max_thought}}}/",
            # Not "[...": small models copy the prompt's "[your answer here]" placeholder.
            f"ANSWER: /[^\\n\\[][^\\n]{{0,{max_answer - 1}}}/",
            *actions,
        ]
    )


def react_response_format(
    tools: Sequence[Any],
    *,
    require_action_first: bool = False,
    max_actions: int | None = None,
    **limits: int,
) -> dict[str, Any] | Callable[[list[dict[str, Any]]], dict[str, Any]]:
    """``response_format`` for ``MLXLLM`` that constrains output to ReAct steps.

    Args:
        tools: The agent's tools.
        require_action_first: Until the conversation holds an ``Observation:``, the step
            must be an action (the ReAct analogue of FunctionAgent's
            ``initial_tool_choice``): small models otherwise answer before looking.
        max_actions: After this many observations the step must be an answer: small
            models otherwise repeat the same action after reading its result.
        **limits: ``max_thought`` / ``max_answer`` characters.
    """
    if max_actions is not None and max_actions < 1:
        raise ValueError(f"max_actions must be at least 1, got {max_actions}")
    formats = {
        (answer, action): {
            "type": "grammar",
            "grammar": react_grammar(tools, answer=answer, action=action, **limits),
        }
        for answer, action in ((True, True), (False, True), (True, False))
    }
    if not require_action_first and max_actions is None:
        return formats[True, True]

    def choose(messages: list[dict[str, Any]]) -> dict[str, Any]:
        observations = sum(
            _text(m.get("content")).lstrip().startswith("Observation:")
            for m in messages
            if m["role"] != "system"
        )
        if max_actions is not None and observations >= max_actions:
            return formats[True, False]
        if require_action_first and observations == 0:
            return formats[False, True]
        return formats[True, True]

    return choose


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""
