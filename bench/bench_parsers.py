"""Parsing overhead per streamed token: ChatOutputParser against plain concatenation.

A long reply (reasoning, a few thousand characters of answer, then tool calls) is cut
into word-sized pieces, as a detokenizer streams them, and fed one piece at a time to
:class:`ChatOutputParser`; the baseline only appends each piece to a string. The
difference, divided by the number of pieces, is what parsing adds to each streamed
token. One row per tool-call format, plus a reply with a long call argument full of
braces (the worst case for formats without an end marker, whose calls are tried
at each closing bracket).

Run: ``.venv/bin/python bench/bench_parsers.py [--rounds 15 --answer-chars 6000]``
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlx_integrations.chat.output_parser import ChatOutputParser
from mlx_integrations.chat.tool_formats import ToolFormat, format_names, get_format

CALLS = [
    ("get_weather", {"city": "Paris", "days": 3, "metric": True}),
    ("get_time", {"zone": "Europe/Paris"}),
]
PROSE = (
    "The forecast for Paris shows a mild week: 21 C on Monday, light rain <5 mm> on "
    "Tuesday, then sun. Values in [brackets] and {braces} are estimates; see (1) and "
    "(2) below. Temperatures use the metric scale, as asked.\n"
)


@dataclass
class Result:
    """Timing of one reply."""

    name: str
    tokens: int
    parser_us: float
    """Median microseconds per token with the parser."""
    concat_us: float
    """Median microseconds per token of plain concatenation."""

    @property
    def overhead_us(self) -> float:
        return self.parser_us - self.concat_us


def _calls(fmt: str, calls: list[tuple[str, dict]]) -> str:
    """The calls as the family writes them."""
    return get_format(fmt).write_calls(calls)


def build_reply(fmt: str | None, answer_chars: int, calls: list[tuple[str, dict]]) -> str:
    """Reasoning, answer text and calls, where the format puts them."""
    reasoning = (
        "<think>" + ("The user wants the weather, so I call the tool. " * 12) + "</think>\n\n"
    )
    answer = (PROSE * (answer_chars // len(PROSE) + 1))[:answer_chars]
    if fmt is None:
        return reasoning + answer
    if fmt == "pythonic":  # a pythonic call list only counts where the reply starts
        return reasoning + _calls(fmt, calls) + "\n" + answer
    return reasoning + answer + _calls(fmt, calls)


def pieces_of(text: str) -> list[str]:
    """Word-sized pieces, as a BPE detokenizer yields them (a space joins the next word)."""
    return re.findall(r" ?\w+| ?[^\w\s]| *\n|\s+", text)


def measure(name: str, fmt: ToolFormat | None, pieces: list[str], rounds: int) -> Result:
    """Median per-token time of feeding ``pieces`` to a parser, and of concatenating them."""
    parser_times, concat_times = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        text = ""
        for piece in pieces:
            text += piece
        concat_times.append(time.perf_counter() - start)

        start = time.perf_counter()
        parser = ChatOutputParser(tool_format=fmt)
        for piece in pieces:
            parser.feed(piece)
        parser.finish()
        parser_times.append(time.perf_counter() - start)
    n = len(pieces)
    return Result(
        name,
        n,
        statistics.median(parser_times) / n * 1e6,
        statistics.median(concat_times) / n * 1e6,
    )


def run(rounds: int = 15, answer_chars: int = 6000) -> list[Result]:
    """One result per format, a text-only reply, and a long-argument worst case."""
    results = [measure("no tools", None, pieces_of(build_reply(None, answer_chars, [])), rounds)]
    for name in format_names():
        fmt = get_format(name)
        pieces = pieces_of(build_reply(name, answer_chars, CALLS))
        assert "".join(pieces) == build_reply(name, answer_chars, CALLS)
        results.append(measure(name, fmt, pieces, rounds))
    code = "".join(f"def f{i}(x): return {{'k': [x, ({i})]}}\n" for i in range(150))
    long_call = [("run_python", {"code": code})]
    for name in ("hermes", "mistral"):
        pieces = pieces_of(build_reply(name, 200, long_call))
        results.append(measure(f"{name}, 6 KB argument", get_format(name), pieces, rounds))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15, help="timed repetitions (median)")
    ap.add_argument("--answer-chars", type=int, default=6000, help="length of the answer text")
    args = ap.parse_args()
    results = run(args.rounds, args.answer_chars)
    print(
        f"{'reply':<22} {'tokens':>7} {'parser us/tok':>14} {'concat us/tok':>14} {'overhead us/tok':>16}"
    )
    for r in results:
        print(
            f"{r.name:<22} {r.tokens:>7} {r.parser_us:>14.2f} {r.concat_us:>14.3f} "
            f"{r.overhead_us:>16.2f}"
        )
    worst = max(r.overhead_us for r in results[: 1 + len(format_names())])
    print(f"\nParsing overhead per streamed token: at most {worst:.1f} us across formats")


if __name__ == "__main__":
    main()
