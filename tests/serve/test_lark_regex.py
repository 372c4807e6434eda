"""A Lark grammar of a regular language as one regular expression (a custom tool's
input held as a JSON-schema pattern), and the grammars that are not turned into one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from llguidance import LLMatcher

from mlx_integrations.serve.openai.lark_regex import lark_to_regex

CLIENTS = Path(__file__).parent / "clients"


def codex_apply_patch() -> str:
    """The Lark grammar of Codex's apply_patch, as Codex sends it."""
    recorded = json.loads((CLIENTS / "codex-gpt-5.5.json").read_text())
    [tool] = [
        t
        for request in recorded["requests"]
        for t in (request.get("body") or {}).get("tools", [])
        if t["type"] == "custom" and t["name"] == "apply_patch"
    ]
    return str(tool["format"]["definition"])


def holds(pattern: str) -> bool:
    """llguidance takes the pattern as a JSON string's (what the tool call carries)."""
    schema = {"type": "string", "pattern": f"^(?:{pattern})$"}
    return LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(schema)) == ""


def test_codex_apply_patch_is_one_pattern():
    pattern = lark_to_regex(codex_apply_patch())
    assert pattern is not None and holds(pattern)
    good = [
        "*** Begin Patch\n*** Add File: a.py\n+print(1)\n*** End Patch\n",
        "*** Begin Patch\n*** Delete File: b.py\n*** End Patch",
        "*** Begin Patch\n*** Update File: c.py\n*** Move to: d.py\n@@ def f():\n"
        "-    return 1\n+    return 2\n     pass\n*** End of File\n*** End Patch\n",
    ]
    bad = [
        "*** Begin Patch\n*** End Patch\n",  # no hunk
        "*** Begin Patch\n*** Add File: a.py\n*** End Patch\n",  # an added file has lines
        "*** Begin Patch\n*** Update File: c.py\n-x\n",  # no end
        '{"input": "*** Begin Patch"}',
    ]
    assert all(re.fullmatch(pattern, text) for text in good)
    assert not any(re.fullmatch(pattern, text) for text in bad)


@pytest.mark.parametrize(
    ("grammar", "good", "bad"),
    [
        ('start: "a"i ("b" | /c+/)~2..3 [d]\nd: "z"{1,2}', ["Abb", "acccbzz"], ["ab", "abbbb"]),
        ("start: WORD (WS_INLINE INT)*\n%import common (WORD, WS_INLINE, INT)", ["ab 1 22"], ["1"]),
        ('start: item+ -> items\n?item: /[xy]/s\n  | "-"  // comment', ["x-y"], ["z"]),
        ('start: x{2,}\nx: "ab" | "."', ["ab.", "..ab"], ["ab"]),
    ],
)
def test_rules_terminals_and_quantifiers(grammar: str, good: list[str], bad: list[str]):
    pattern = lark_to_regex(grammar)
    assert pattern is not None and holds(pattern)
    assert all(re.fullmatch(pattern, text) for text in good), pattern
    assert not any(re.fullmatch(pattern, text) for text in bad), pattern


@pytest.mark.parametrize(
    "grammar",
    [
        'start: "(" start ")" | "x"',  # recursion: not a regular language
        'start: a\na: "x" b\nb: "y" a?',  # recursion through another rule
        'start: "a" "b"\n%import common.WS\n%ignore WS',  # %ignore
        'start: "a"\n%import common.SIGNED_FLOAT',  # a terminal not read here
        'other: "a"',  # no start rule
        'start: "a" <[12]>',  # a token reference
        'start: "a" undefined',
    ],
)
def test_what_is_not_turned_into_a_pattern(grammar: str):
    assert lark_to_regex(grammar) is None
