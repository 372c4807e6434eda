"""A Lark grammar that describes a regular language, as one regular expression.

A custom tool's input travels inside the tool call's JSON, where the constrained
decoding holds a string by a JSON-schema ``pattern`` (escapes included) but cannot hold
a Lark grammar. Many tool grammars use no recursion (Codex's ``apply_patch``: begin,
hunks of lines, end); their rules and terminals inline into one regular expression.
:func:`lark_to_regex` does that for the usual part of the dialect (rules and
terminals, literals and regexes, ``|``, groups, ``[...]``, ``? * +``, ``~ n..m``,
``{n,m}``, aliases, ``%import common.X`` of a few terminals) and gives None for a
grammar it cannot turn into one (recursion, ``%ignore``, another directive or syntax):
the tool is then offered with its grammar in the description alone.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

__all__ = ["lark_to_regex"]

MAX_PATTERN = 20_000
"""Longest regular expression made: larger ones are not worth their automaton."""

# llguidance's (Rust regex) forms of the common terminals a grammar may import.
_COMMON = {
    "LF": r"\n",
    "CR": r"\r",
    "NEWLINE": r"(?:\r?\n)+",
    "WS_INLINE": r"[ \t]+",
    "WS": r"[ \t\f\r\n]+",
    "DIGIT": r"[0-9]",
    "HEXDIGIT": r"[0-9a-fA-F]",
    "INT": r"[0-9]+",
    "SIGNED_INT": r"[+-]?[0-9]+",
    "LETTER": r"[A-Za-z]",
    "LCASE_LETTER": r"[a-z]",
    "UCASE_LETTER": r"[A-Z]",
    "WORD": r"[A-Za-z]+",
    "CNAME": r"[A-Za-z_][A-Za-z0-9_]*",
    "ESCAPED_STRING": r'"(?:[^"\\]|\\.)*"',
}

_DEFINITION = re.compile(r"^\s*[?!]?([A-Za-z_][\w-]*)(?:\.-?\d+)?(?:\[[^\]]*\])?\s*:(.*)$")
_IMPORT = re.compile(r"^%import\s+common\s*(?:\.\s*(\w+)|\(([\w\s,]+)\))\s*(?:->\s*(\w+))?$")
_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
    | (?P<comment>(?://|\#)[^\n]*)
    | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
    | (?P<regex>/(?:[^/\\\n]|\\.)+/[a-z]*)
    | (?P<arrow>->\s*[A-Za-z_][\w-]*)
    | (?P<range>~\s*\d+(?:\s*\.\.\s*\d+)?)
    | (?P<braces>\{\s*\d*\s*(?:,\s*\d*\s*)?\})
    | (?P<name>[A-Za-z_][\w-]*)
    | (?P<op>[()\[\]|?*+])
    """,
    re.VERBOSE,
)


_META = set("\\.+*?()|[]{}^$#&-~")
_CONTROLS = {"\n": r"\n", "\r": r"\r", "\t": r"\t"}


def _escape(text: str) -> str:
    """A literal as a regular expression (Rust ``regex``: only metacharacters escaped)."""
    out = []
    for char in text:
        if char in _META:
            out.append("\\" + char)
        elif char in _CONTROLS:
            out.append(_CONTROLS[char])
        elif not char.isprintable():
            out.append(f"\\x{{{ord(char):x}}}")
        else:
            out.append(char)
    return "".join(out)


class _Unsupported(Exception):
    """The grammar is not one this module turns into a regular expression."""


def lark_to_regex(grammar: str) -> str | None:
    """The regular expression of a Lark grammar's ``start`` rule, or None.

    Args:
        grammar: A grammar in Lark's dialect (llguidance's).

    Returns:
        A regular expression (Rust ``regex`` syntax, no anchors) that matches exactly
        what the grammar does, or None for a grammar that is not regular (a rule that
        refers to itself), uses ``%ignore`` or syntax not read here, or whose
        expression would be larger than :data:`MAX_PATTERN`.
    """
    try:
        rules = _definitions(grammar)
        if "start" not in rules:
            return None
        pattern = _Inliner(rules).regex("start")
    except (_Unsupported, ValueError, SyntaxError, RecursionError):
        return None
    return pattern if len(pattern) <= MAX_PATTERN else None


def _definitions(grammar: str) -> dict[str, list[tuple[str, str]]]:
    """Each rule's and terminal's expansion, as tokens; imports as ready patterns."""
    texts: dict[str, str] = {}
    current: str | None = None
    imported: dict[str, str] = {}
    for raw in grammar.splitlines():
        line = raw.strip()
        if not line or line.startswith(("//", "#")):
            continue
        if line.startswith("%"):
            found = _IMPORT.match(line)
            if found is None:
                raise _Unsupported(line)  # %ignore, %declare, %llguidance...
            names = [found.group(1)] if found.group(1) else found.group(2).split(",")
            for name in (n.strip() for n in names):
                if name not in _COMMON:
                    raise _Unsupported(name)
                imported[found.group(3) or name] = _COMMON[name]
            current = None
            continue
        definition = _DEFINITION.match(raw)
        if definition is not None and not line.startswith("|"):
            current = definition.group(1)
            if current in texts:
                raise _Unsupported(f"{current} defined twice")
            texts[current] = definition.group(2)
        elif current is not None:
            texts[current] += "\n" + raw
        else:
            raise _Unsupported(line)
    rules: dict[str, list[tuple[str, str]]] = {
        name: [("pattern", pattern)] for name, pattern in imported.items()
    }
    for name, text in texts.items():
        rules[name] = list(_tokens(text))
    return rules


def _tokens(text: str) -> Iterator[tuple[str, str]]:
    position = 0
    while position < len(text):
        found = _TOKEN.match(text, position)
        if found is None:
            raise _Unsupported(text[position:])
        position = found.end()
        kind = found.lastgroup
        assert kind is not None
        if kind not in ("space", "comment", "arrow"):  # an alias names a tree node only
            yield kind, found.group()


class _Inliner:
    """Rules inlined into their users, each expression parsed from its tokens."""

    def __init__(self, rules: dict[str, list[tuple[str, str]]]):
        self.rules = rules
        self.done: dict[str, str] = {}
        self.open: set[str] = set()

    def regex(self, name: str) -> str:
        if name in self.done:
            return self.done[name]
        if name in self.open:
            raise _Unsupported(f"{name} refers to itself")
        if name not in self.rules:
            raise _Unsupported(f"{name} is not defined")
        self.open.add(name)
        tokens = self.rules[name]
        if tokens and tokens[0][0] == "pattern":
            pattern = tokens[0][1]
        else:
            pattern, end = self._alternatives(tokens, 0)
            if end != len(tokens):
                raise _Unsupported(f"{name}: {tokens[end][1]!r} out of place")
        self.open.discard(name)
        self.done[name] = pattern
        return pattern

    def _alternatives(self, tokens: list[tuple[str, str]], at: int) -> tuple[str, int]:
        options = []
        while True:
            sequence, at = self._sequence(tokens, at)
            options.append(sequence)
            if at < len(tokens) and tokens[at] == ("op", "|"):
                at += 1
                continue
            break
        return (options[0] if len(options) == 1 else "(?:" + "|".join(options) + ")"), at

    def _sequence(self, tokens: list[tuple[str, str]], at: int) -> tuple[str, int]:
        items = []
        while at < len(tokens) and tokens[at] not in (("op", "|"), ("op", ")"), ("op", "]")):
            atom, at = self._atom(tokens, at)
            while at < len(tokens) and tokens[at][0] in ("op", "range", "braces"):
                kind, text = tokens[at]
                if kind == "op" and text not in "?*+":
                    break
                atom = f"(?:{atom}){_quantifier(kind, text)}"
                at += 1
            items.append(atom)
        return "".join(items), at

    def _atom(self, tokens: list[tuple[str, str]], at: int) -> tuple[str, int]:
        kind, text = tokens[at]
        if kind == "string":
            insensitive = text.endswith("i")
            value = ast.literal_eval(text[:-1] if insensitive else text)
            literal = _escape(value)
            return (f"(?i:{literal})" if insensitive else literal), at + 1
        if kind == "regex":
            body, flags = text[1 : text.rindex("/")], text[text.rindex("/") + 1 :]
            if set(flags) - set("is"):
                raise _Unsupported(f"regex flags {flags!r}")
            return (f"(?{flags}:{body})" if flags else f"(?:{body})"), at + 1
        if kind == "name":
            return f"(?:{self.regex(text)})", at + 1
        if (kind, text) in (("op", "("), ("op", "[")):
            close = ")" if text == "(" else "]"
            inner, at = self._alternatives(tokens, at + 1)
            if at >= len(tokens) or tokens[at] != ("op", close):
                raise _Unsupported(f"no closing {close!r}")
            return (f"(?:{inner})" if close == ")" else f"(?:{inner})?"), at + 1
        raise _Unsupported(f"{text!r} out of place")


def _quantifier(kind: str, text: str) -> str:
    """``?``, ``*``, ``+``, ``~ n``, ``~ n..m`` or ``{n}``, ``{n,}``, ``{n,m}`` as a regex's."""
    if kind == "op":
        return text
    if kind == "range":
        low, _, high = text.lstrip("~ ").partition("..")
        return f"{{{int(low)}}}" if not high else f"{{{int(low)},{int(high)}}}"
    low, comma, high = text.strip("{} ").partition(",")
    if not comma:
        return f"{{{int(low)}}}"
    return f"{{{int(low or 0)},{int(high)}}}" if high.strip() else f"{{{int(low or 0)},}}"
