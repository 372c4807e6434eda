"""The docs build strictly, the README stays a front page, and every code block runs.

The blocks run against the models that ``scripts/dev demo`` creates, under the same
store names (``smollm2-135m-instruct``, ``all-minilm-l6-v2``), in a store of their own,
offline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.doc_blocks import RUNNER, read_blocks
from tests.support.docs_store import ensure_docs_store

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README_MAX_LINES = 250


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_every_page_is_in_the_nav():
    import yaml

    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)

    def pages(node: object) -> set[str]:
        if isinstance(node, str):
            return {node}
        if isinstance(node, list):
            return set().union(*(pages(item) for item in node))
        if isinstance(node, dict):
            return set().union(*(pages(value) for value in node.values()))
        return set()

    listed = pages(config["nav"])
    written = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert written == listed


def test_docs_build_strictly(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    cli = (tmp_path / "site" / "cli" / "index.html").read_text()
    assert "mlxi quantize" in cli and "--group-size" in cli  # the generated reference


def test_the_block_reader_sees_blocks_and_skips():
    blocks = [b for page in PAGES for b in read_blocks(page, ROOT)]
    assert len([b for b in blocks if not b.skipped]) >= 20
    assert any(b.skipped for b in blocks)


@pytest.mark.smollm
@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if any(not b.skipped for b in read_blocks(p, ROOT))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_code_blocks_run(page: Path, tmp_path):
    blocks = [[b.page, b.line, b.code] for b in read_blocks(page, ROOT) if not b.skipped]
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **os.environ,
        "MLXI_HOME": str(ensure_docs_store(tmp_path / "store")),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps(blocks),
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-5000:]
