"""The ReAct grammar and its per-step choice, on a tiny model."""

from __future__ import annotations

import pytest
from llama_index.core.llms import ChatMessage
from llama_index.core.tools import FunctionTool

from mlx_integrations.chat.constraints import LarkConstraint
from mlx_integrations.llama_index import MLXLLM, react_grammar, react_response_format


def pick(color: str) -> str:
    """Pick a color."""
    return color


TOOL = FunctionTool.from_defaults(pick)


def test_grammar_is_valid_and_each_mode_differs():
    both = react_grammar([TOOL])
    act = react_grammar([TOOL], answer=False)
    say = react_grammar([TOOL], action=False)
    for g in (both, act, say):
        LarkConstraint(g)  # validated by llguidance
    assert "(action | answer)" in both and "(action)" in act and "(answer)" in say
    with pytest.raises(ValueError, match="at least one tool"):
        react_grammar([])
    with pytest.raises(ValueError, match="an action, an answer or both"):
        react_grammar([TOOL], answer=False, action=False)


def test_step_choice_follows_observations():
    choose = react_response_format([TOOL], require_action_first=True, max_actions=1)
    first = choose([{"role": "user", "content": "Pick red."}])
    after = choose(
        [
            {"role": "user", "content": "Pick red."},
            {"role": "assistant", "content": "Thought: t\nAction: pick"},
            {"role": "user", "content": "Observation: red"},
        ]
    )
    assert "(action)" in first["grammar"] and "(answer)" in after["grammar"]
    assert react_response_format([TOOL])["grammar"] == react_grammar([TOOL])
    with pytest.raises(ValueError, match="max_actions"):
        react_response_format([TOOL], max_actions=0)


def test_invalid_grammar_is_rejected_before_generation():
    with pytest.raises(ValueError, match="not valid"):
        LarkConstraint("start: @@@")


def test_mlxllm_applies_its_response_format(tiny_llama):
    llm = MLXLLM(
        model=str(tiny_llama),
        temperature=1.0,
        max_tokens=80,
        response_format=react_response_format([TOOL], require_action_first=True, max_thought=12),
    )
    for seed in range(3):
        text = llm.chat([ChatMessage(role="user", content="Pick one")], seed=seed).message.content
        assert text.startswith("Thought: ")
        assert "\nAction: pick\nAction Input: {" in text
