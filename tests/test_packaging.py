"""The package as someone without this checkout gets it: the sdist and the wheel build
from the files a clone has, the wheel installs into a fresh virtualenv with only its
runtime extra, and there ``mlxi --help`` answers and ``ChatMLX`` answers a question.

The wheel's dependencies come from PyPI once, into a wheelhouse in the test cache
(``$MLXI_TEST_CACHE``), keyed by what the package requires; later runs install from it
with no index, so the test takes about a minute.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.support.smollm import cache_dir
from tests.support.tiny_models import build_tiny_model

ROOT = Path(__file__).resolve().parent.parent
EXTRA = "cpu" if sys.platform == "linux" else None

pytestmark = pytest.mark.packaging


def run(*cmd: str | Path, cwd: Path | None = None, timeout: float = 600) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{cmd}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def clone(dest: Path) -> Path:
    """The files a clone of this checkout has (tracked, and new files git does not ignore)."""
    listed = run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT)
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def build(src: Path, out: Path) -> tuple[Path, Path]:
    """The sdist of ``src``, then the wheel built from that sdist (as ``python -m build``)."""
    hooks = "from setuptools import build_meta as b; import sys; print(b.{}(sys.argv[1]))"
    out.mkdir()
    sdist = out / run(sys.executable, "-c", hooks.format("build_sdist"), out, cwd=src).split()[-1]
    with tarfile.open(sdist) as tar:
        tar.extractall(out / "unpacked", filter="data")
    (unpacked,) = (out / "unpacked").iterdir()
    wheel = (
        out / run(sys.executable, "-c", hooks.format("build_wheel"), out, cwd=unpacked).split()[-1]
    )
    return sdist, wheel


def requirement(wheel: Path) -> str:
    return f"{wheel}[{EXTRA}]" if EXTRA else str(wheel)


def wheelhouse(wheel: Path) -> Path:
    """The wheels of every dependency of ``wheel`` with its runtime extra, fetched once."""
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA")))
    requires = b"\n".join(line for line in metadata.splitlines() if line.startswith(b"Requires-"))
    key = hashlib.sha256(requires + f"{sys.version_info[:2]}{EXTRA}".encode()).hexdigest()[:12]
    house = cache_dir() / f"wheelhouse-{key}"
    if not house.is_dir():
        partial = cache_dir() / f".wheelhouse-{key}-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        run(sys.executable, "-m", "pip", "download", "-q", "-d", partial, requirement(wheel))
        for own in partial.glob("mlx_integrations-*"):
            own.unlink()
        partial.rename(house)
    return house


def test_the_wheel_installs_alone_and_answers(tmp_path):
    sdist, wheel = build(clone(tmp_path / "clone"), tmp_path / "dist")
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    assert any(n.endswith("/LICENSE") for n in names)
    assert any(n.endswith("/README.md") for n in names)
    with zipfile.ZipFile(wheel) as zf:
        files = zf.namelist()
    # The license ships, and every package of the source tree with its data.
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in files), files[-10:]
    # Every package committed under mlx_integrations/ (pyproject.toml lists them by hand).
    tracked = run("git", "ls-files", "mlx_integrations/*__init__.py", cwd=ROOT).split()
    missing = [name for name in tracked if name not in files]
    assert missing == [], f"not in the wheel (add them to pyproject.toml's packages): {missing}"
    assert "mlx_integrations/cli/main.py" in files

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    house = wheelhouse(wheel)
    run(
        python,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--find-links",
        house,
        requirement(wheel),
    )

    help_text = run(venv / "bin" / "mlxi", "--help")
    assert "pull" in help_text and "quantize" in help_text

    model = build_tiny_model(tmp_path / "tiny")
    script = (
        "from mlx_integrations.langchain import ChatMLX\n"
        f"llm = ChatMLX(model={str(model)!r}, temperature=0, max_tokens=4)\n"
        "reply = llm.invoke('Hello!')\n"
        "print(type(reply).__name__, reply.usage_metadata['output_tokens'])\n"
    )
    # Run away from the checkout, so nothing of it can be imported by accident.
    out = run(python, "-c", script, cwd=tmp_path)
    kind, tokens = out.split()[-2:]
    assert kind == "AIMessage" and 1 <= int(tokens) <= 4, out
    where = run(
        python, "-c", "import mlx_integrations; print(mlx_integrations.__file__)", cwd=tmp_path
    )
    assert str(venv) in where
