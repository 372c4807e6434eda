"""The code stays lint-clean and type-checks (ruff and mypy, configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_lint_is_clean():
    done = run("ruff", "check", "mlx_integrations", "cli", "tests", "cookbook", "bench")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_is_clean_on_the_package():
    done = run("mypy", "mlx_integrations", "cli")
    assert done.returncode == 0, done.stdout + done.stderr
