"""The docs build strictly and quietly, the README stays a front page that a newcomer can
follow top to bottom, and every code block runs as pasted.

The blocks run against the models that ``scripts/dev demo`` creates, under the same
store names (``smollm2-135m-instruct``, ``all-minilm-l6-v2``), in a store of their own,
offline; each Python block in a fresh interpreter (tests/support/doc_blocks.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.doc_blocks import Block, read_blocks, run_script, scripts
from tests.support.docs_store import ensure_docs_store

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README_MAX_LINES = 250
BENCHMARKS_MAX_LINES = 250


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


def test_docs_build_strictly_and_quietly(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NO_MKDOCS_2_WARNING"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    cli = (tmp_path / "site" / "cli" / "index.html").read_text()
    assert "mlxi quantize" in cli and "--group-size" in cli  # the generated reference
    # Nothing but MkDocs' own progress lines: no banner from the theme, no warning.
    noise = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if line.strip() and not line.startswith("INFO")
    ]
    assert noise == [], "\n".join(noise[:20])


def test_the_block_reader_sees_blocks_skips_and_continuations():
    blocks = [b for page in PAGES for b in read_blocks(page, ROOT)]
    assert len([b for b in blocks if not b.skipped]) >= 20
    assert any(b.skipped for b in blocks)
    assert any(b.continues for b in blocks)


def page_scripts() -> list[tuple[str, list[Block]]]:
    return [
        (str(page.relative_to(ROOT)), script)
        for page in PAGES
        for script in scripts(read_blocks(page, ROOT))
    ]


def test_every_block_is_a_script_a_reader_can_paste():
    """No top-level ``await`` (a SyntaxError when pasted into ``python``), and a block
    that continues another says so where that block runs, never after a skipped one."""
    for _, script in page_scripts():
        for block in script:
            try:
                compile(block.code, f"{block.page}:{block.line}", "exec")
            except SyntaxError as exc:
                pytest.fail(f"{block.page}:{block.line} does not run as pasted: {exc}")


def test_a_block_that_leans_on_the_one_before_must_say_so(tmp_path):
    page = tmp_path / "page.md"
    first = "```python\nanswer = 42\n```\n\n"
    page.write_text(first + "```python\nprint(answer)\n```\n")
    (alone,) = [s for s in scripts(read_blocks(page, tmp_path)) if s[0].line > 3]
    failed = run_script(alone, tmp_path, {})
    assert failed.returncode == 1 and "NameError" in failed.stderr
    page.write_text(first + "```python\n# Continues the block above.\nprint(answer)\n```\n")
    (both,) = scripts(read_blocks(page, tmp_path))
    done = run_script(both, tmp_path, {})
    assert done.returncode == 0 and done.stdout == "42\n", done.stderr
    page.write_text("```python\nawait something()\n```\n")
    (awaits,) = scripts(read_blocks(page, tmp_path))
    assert "SyntaxError" in run_script(awaits, tmp_path, {}).stderr
    page.write_text("<!-- docs-test: skip (x) -->\n" + first + "```python\n# continues\n1\n```\n")
    with pytest.raises(ValueError, match="continues a block that is skipped"):
        scripts(read_blocks(page, tmp_path))


def docs_env(tmp_path: Path) -> dict[str, str]:
    return {
        "MLXI_HOME": str(ensure_docs_store(tmp_path / "store")),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


@pytest.mark.smollm
@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if scripts(read_blocks(p, ROOT))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_code_blocks_run(page: Path, tmp_path):
    env = docs_env(tmp_path)
    for n, script in enumerate(scripts(read_blocks(page, ROOT))):
        work = tmp_path / f"work-{n}"
        work.mkdir()
        done = run_script(script, work, env)
        assert done.returncode == 0, done.stderr[-5000:]


def readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def console_commands(section: str) -> list[tuple[str, list[str]]]:
    """The ``$ `` lines of a section's console block, each with the output shown under it."""
    block = re.search(r"```console\n(.*?)```", section, re.S)
    assert block, "no console block"
    out: list[tuple[str, list[str]]] = []
    for line in block.group(1).splitlines():
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif out:
            out[-1][1].append(line)
    return out


@pytest.mark.smollm
def test_the_readme_mlxi_block_runs_after_the_demo(tmp_path):
    """As pasted, after ``scripts/dev demo``: the demo's store at ``~/.cache/mlxi``, with
    the GGUF file it fetched kept in ``downloads/``, and ``mlxi`` on the PATH."""
    from tests.support.smollm import ensure_smollm2_gguf

    home = tmp_path / "home"
    store = ensure_docs_store(home / ".cache" / "mlxi")
    (store / "downloads").mkdir()
    shutil.copy(ensure_smollm2_gguf(), store / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLXI_", "HF_"))}
    env |= {
        "HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    }
    commands = console_commands(readme_section("The `mlxi` command"))
    assert {c.split()[0] for c, _ in commands} == {"mlxi", "echo"}
    for command, shown in commands:
        done = subprocess.run(
            ["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=600
        )
        wanted = 1 if "exit 1" in command else 0
        assert done.returncode == wanted, f"$ {command}\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
        if shown:
            assert done.stdout.splitlines()[-len(shown) :] == shown, (command, done.stdout)
        if command.startswith("mlxi show"):
            source = next(line for line in done.stdout.splitlines() if line.startswith("source "))
            assert Path(source.split(": ", 1)[1]).exists(), source


def test_install_lines_work_without_pypi():
    """The package is not on PyPI: the pages install it from a clone or a built wheel."""
    first_install = re.compile(r'pip install "?mlx-integrations(\[[a-z0-9,]+\])?"?\s*(#|$)', re.M)
    for page in (ROOT / "README.md", ROOT / "docs" / "getting-started.md"):
        text = page.read_text()
        assert 'pip install -e ".[cpu]"' in text, page
        assert not first_install.search(text.split("Once the package is installed")[0]), page
    assert "python -m build" in (ROOT / "README.md").read_text()


def test_the_docs_server_leaves_mlxi_serves_port_free():
    dev = (ROOT / "scripts" / "dev").read_text()
    assert "mkdocs serve -a 127.0.0.1:8001" in dev
    for page in ("README.md", "docs/development.md"):
        text = (ROOT / page).read_text()
        assert "scripts/dev docs" in text and "8001" in text, page
        commands = [line for line in text.splitlines() if "mkdocs serve" in line]
        assert all("8001" in line or "scripts/dev docs" in line for line in commands), commands


def test_the_family_count_is_the_registrys():
    from mlx_integrations.chat.tool_formats import FAMILIES

    words = {"seven": 7, "eight": 8, "nine": 9, "ten": 10}
    pattern = re.compile(r"\b(\d+|seven|eight|nine|ten) (?:tool-call )?families\b")
    counted = 0
    for page in PAGES:
        for found in pattern.findall(page.read_text()):
            counted += 1
            number = int(found) if found.isdigit() else words[found]
            assert number == len(FAMILIES), f"{page.name} says {found} families"
    assert counted >= 1  # the README's table


def test_the_benchmarks_page_dates_every_figure_and_says_how_to_measure_it():
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    assert len(text.splitlines()) <= BENCHMARKS_MAX_LINES
    for section in ("## CPU", "## CUDA"):
        body = text.split(section, 1)[1].split("\n## ", 1)[0]
        rows = [line for line in body.splitlines() if line.startswith("| ") and "---" not in line]
        assert len(rows) > 5, section
        for row in rows[1:]:  # the header row names the columns
            assert re.search(r"2026-\d\d-\d\d", row), row
            assert "bench/bench_" in row, row
    for script in re.findall(r"`(bench_\w+\.py)`", text):
        assert (ROOT / "bench" / script).is_file(), script


def test_the_license_is_the_one_pyproject_names():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()
    assert "END OF TERMS AND CONDITIONS" in text
