"""The Python code blocks of the README and docs/, read and run as a reader would run them.

Each block is a complete script, run as pasted in a fresh interpreter: top-level
``await`` is a syntax error there, so a block that awaits does so inside
``asyncio.run(...)``. A block that goes on from the one before it (a tutorial's next
step, using its ``client`` or ``server``) says so on its first line, where the reader
sees it::

    # Continues the block above (uses `client`).

and runs after that block in the same interpreter. A block that cannot run here (a GPU,
a Hub download, several machines) is preceded by an HTML comment naming why:
``<!-- docs-test: skip (needs a GPU) -->``; the comment does not show on the rendered
page.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.M | re.S)
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\b[^>]*-->\s*$")
CONTINUES = re.compile(r"#\s*continues\b", re.I)


@dataclass(frozen=True)
class Block:
    """One fenced Python block of a page."""

    page: str
    line: int
    code: str
    skipped: bool

    @property
    def continues(self) -> bool:
        """Whether the block says, on its first line, that it goes on from the one before."""
        first = self.code.lstrip("\n").split("\n", 1)[0]
        return bool(CONTINUES.match(first.strip()))


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


def scripts(blocks: list[Block]) -> list[list[Block]]:
    """The blocks that run, grouped into scripts: a block, then those that continue it.

    A block that continues one that is skipped, or that opens the page, is an error: it
    cannot run as its reader would run it.
    """
    out: list[list[Block]] = []
    previous: Block | None = None
    for block in blocks:
        if block.continues:
            if previous is None or previous.skipped:
                raise ValueError(
                    f"{block.page}:{block.line} continues a block that "
                    f"{'is skipped' if previous else 'does not exist'}"
                )
            if not block.skipped:
                out[-1].append(block)
        elif not block.skipped:
            out.append([block])
        previous = block
    return out


RUNNER = """
import json, sys, traceback

blocks = json.loads(sys.stdin.read())
namespace = {"__name__": "__main__"}
for page, line, code in blocks:
    try:
        exec(compile(code, f"{page}:{line}", "exec"), namespace)
    except BaseException:
        print(f"The block at {page}:{line} failed:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""
"""Runs the blocks given as JSON on stdin, ``[[page, line, code], ...]``, as one script."""


def run_script(
    script: list[Block], cwd: Path, env: dict[str, str], timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """Run one script (a block and its continuations) in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps([[b.page, b.line, b.code] for b in script]),
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
