"""Chat prompts the engine tests share, and a conversation that ends in a given reply."""

from __future__ import annotations

WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
FOX = [
    {
        "role": "user",
        "content": "The quick brown fox jumps over the lazy dog. Repeat it: The quick",
    }
]
BRIEF = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello! 東京?"}]
CHAT_PROMPTS = [WEATHER, FOX, BRIEF]
"""A question, a sentence to repeat (prompt lookup finds its n-grams), and a system
prompt with non-ASCII text."""


def conversation(reply: str) -> list[dict[str, str]]:
    """A turn whose earlier assistant reply is ``reply``: a reply that starts the same
    way is drafted from it by prompt lookup."""
    return [
        {"role": "user", "content": "Say it."},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "Again."},
    ]
