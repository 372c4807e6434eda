"""``scripts/dev``, run in a copy of the repository with stand-ins for what it would
change: a ``.venv/bin/python`` that records pip, pytest and the cookbook instead of
running them, an ``ldconfig`` that finds no OpenBLAS, and ``apt-get``, ``id`` and
``sudo`` that record what they were asked.

What it must do: say what it installs and how much, install the demo extra for the demo
and the dev extra for the tests (the demo then needs nothing more), ask before using apt
at a terminal, print the one command without one, and install OpenBLAS under CI.
"""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or shutil.which("bash") is None,
    reason="the Linux paths of a bash script",
)


def stand_in(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + textwrap.dedent(body))
    path.chmod(0o755)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A checkout holding scripts/dev and pyproject.toml, and the stand-ins (``bin/``)."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "dev", root / "scripts" / "dev")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    (root / ".venv" / "bin").mkdir(parents=True)
    log = tmp_path / "log"
    stand_in(
        root / ".venv" / "bin" / "python",
        f"""\
        case "$*" in
            *"-m pip"* | *cookbook/* | *"-m pytest"*) echo "python $*" >>{log}; exit 0 ;;
        esac
        exec {sys.executable} "$@"
        """,
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in(bin_dir / "ldconfig", "echo 'libc.so.6 (libc6,x86-64) => /lib/libc.so.6'\n")
    stand_in(bin_dir / "apt-get", f'echo "apt-get $*" >>{log}\n')
    stand_in(bin_dir / "sudo", f'[ "$1" = -n ] && exit 1; echo "sudo $*" >>{log}\n')
    stand_in(bin_dir / "id", 'echo "${FAKE_UID:-0}"\n')
    return root


def dev(repo: Path, *args: str, tty: bool = False, answer: str = "", **env: str):
    """Run scripts/dev; with ``tty``, its stdin is a terminal that has ``answer`` typed."""
    environ = {k: v for k, v in os.environ.items() if k not in ("CI", "LDCONFIG")}
    environ |= {
        "PATH": f"{repo.parent / 'bin'}{os.pathsep}{environ['PATH']}",
        "LDCONFIG": str(repo.parent / "bin" / "ldconfig"),
        **env,
    }
    stdin: int | None = subprocess.DEVNULL
    if tty:
        main, stdin = pty.openpty()
        os.write(main, answer.encode())
    try:
        done = subprocess.run(
            ["bash", str(repo / "scripts" / "dev"), *args],
            stdin=stdin,
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        if tty:
            os.close(main)
            os.close(stdin)  # type: ignore[arg-type]
    log = repo.parent / "log"
    calls = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return done, calls


def test_the_demo_says_what_it_installs_and_does(repo):
    done, calls = dev(repo, "demo")
    assert done.returncode == 0, done.stderr
    assert "Installing mlx-integrations[cpu,demo] into .venv (about 600 MB" in done.stderr
    assert "Putting the example models in the model store" in done.stderr
    assert "Streaming an answer" in done.stderr
    assert any("pip install -q -e .[cpu,demo]" in c for c in calls), calls
    assert any("cookbook/example_model.py" in c for c in calls)
    assert any("cookbook/quickstart.py" in c for c in calls)
    again, calls = dev(repo, "demo")
    assert "Installing" not in again.stderr and not any("pip" in c for c in calls)


def test_the_tests_take_the_dev_extra_which_serves_the_demo_too(repo):
    done, calls = dev(repo, "test", "-x")
    assert done.returncode == 0, done.stderr
    assert "Installing mlx-integrations[cpu,dev] into .venv (about 1.7 GB" in done.stderr
    assert any("pip install -q -e .[cpu,dev]" in c for c in calls), calls
    assert any("-m pytest" in c and c.endswith("-x") for c in calls), calls
    demo, calls = dev(repo, "demo")
    assert "Installing" not in demo.stderr and not any("pip" in c for c in calls), calls


def test_without_a_terminal_it_prints_the_apt_command_and_runs_nothing(repo):
    done, calls = dev(repo, "demo")
    assert "Hint: OpenBLAS makes CPU inference about 30x faster" in done.stderr
    assert "  apt-get install -y libopenblas0-pthread" in done.stderr
    assert not any(c.startswith("apt-get") for c in calls), calls
    done, calls = dev(repo, "demo", FAKE_UID="1000")  # not root, no password-less sudo
    assert "  sudo apt-get install -y libopenblas0-pthread" in done.stderr
    assert not any(c.startswith(("apt-get", "sudo")) for c in calls), calls


def test_at_a_terminal_it_asks_before_using_apt(repo):
    dev(repo, "demo")  # the install, out of the way
    done, calls = dev(repo, "demo", tty=True, answer="n\n")
    assert "Run 'apt-get install -y libopenblas0-pthread' now? [Y/n]" in done.stderr
    assert not any(c.startswith("apt-get") for c in calls), calls
    done, calls = dev(repo, "demo", tty=True, answer="\n")
    assert "apt-get install -y -qq libopenblas0-pthread" in calls, calls


def test_ci_gets_openblas_without_a_question(repo):
    done, calls = dev(repo, "test", CI="true")
    assert done.returncode == 0, done.stderr
    assert "now? [Y/n]" not in done.stderr
    assert "apt-get install -y -qq libopenblas0-pthread" in calls, calls


def test_the_docs_are_served_beside_mlxi_serve(repo):
    bin_dir = repo / ".venv" / "bin"
    stand_in(bin_dir / "mkdocs", f'echo "mkdocs $*" >>{repo.parent / "log"}\n')
    done, calls = dev(repo, "docs")
    assert done.returncode == 0, done.stderr
    assert "mkdocs serve -a 127.0.0.1:8001" in calls, calls
    assert "http://127.0.0.1:8001" in done.stderr
