"""The Python code blocks of the README and docs/, read and run as a user would run them.

A page's blocks run in order in one namespace, in a fresh process, so a later block uses
what an earlier one defined; a block with a top-level ``await`` runs in an event loop. A
block that cannot run here (a GPU, a Hub download, several machines) is preceded by an
HTML comment naming why: ``<!-- docs-test: skip (needs a GPU) -->``; the comment does not
show on the rendered page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.M | re.S)
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\b[^>]*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced Python block of a page."""

    page: str
    line: int
    code: str
    skipped: bool


def read_blocks(path: Path, root: Path) -> list[Block]:
    """Every ```python block of ``path``, in order, with whether it is marked to skip."""
    text = path.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").splitlines()
        marked = bool(before) and bool(SKIP.search(before[-1]))
        line = text.count("\n", 0, match.start()) + 2
        blocks.append(Block(str(path.relative_to(root)), line, match.group(1), marked))
    return blocks


RUNNER = """
import ast, asyncio, json, sys, traceback

blocks = json.loads(sys.stdin.read())
namespace = {"__name__": "__main__"}
loop = asyncio.new_event_loop()
asyncio.set_event_loop(loop)
for page, line, code in blocks:
    try:
        compiled = compile(code, f"{page}:{line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        result = eval(compiled, namespace)
        if asyncio.iscoroutine(result):
            loop.run_until_complete(result)
    except BaseException:
        print(f"The block at {page}:{line} failed:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
loop.close()
"""
"""Runs the blocks given as JSON on stdin: ``[[page, line, code], ...]``."""
