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


PASSAGE = (
    "The Great Barrier Reef is the world's largest coral reef system, composed of over "
    "2,900 individual reefs and 900 islands stretching for over 2,300 kilometres over an "
    "area of approximately 344,400 square kilometres. The reef is located in the Coral "
    "Sea, off the coast of Queensland, Australia. It can be seen from outer space and is "
    "the world's biggest single structure made by living organisms. This reef structure "
    "is composed of and built by billions of tiny organisms, known as coral polyps. It "
    "supports a wide diversity of life and was selected as a World Heritage Site in 1981."
)
RAG_MESSAGES = [
    {"role": "system", "content": "You answer from the given passage only."},
    {
        "role": "user",
        "content": f"Passage:\n{PASSAGE}\n\nQuote the passage above word for word, then stop.",
    },
]
"""A passage and the request to quote it: SmolLM2-135M-Instruct quotes it word for word,
so prompt lookup drafts most of the reply."""
