"""A model store holding the demo's models under the demo's names, for the docs' code.

``scripts/dev demo`` stores SmolLM2-135M-Instruct as ``smollm2-135m-instruct`` and
all-MiniLM-L6-v2 as ``all-minilm-l6-v2``; the README and docs name them so. The store is
built once in the test cache (from the test copies of both models) and each user gets a
copy of it made of hard links, so code that adds or removes models changes only its own.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

from tests.support.minilm import ensure_minilm
from tests.support.smollm import STAMP_NAME, cache_dir, ensure_smollm2

CHAT_NAME = "smollm2-135m-instruct"
EMBEDDER_NAME = "all-minilm-l6-v2"


def _base_store() -> Path:
    from mlx_integrations.models import ModelStore, import_model

    smollm2, minilm = ensure_smollm2(), ensure_minilm()
    # A new conversion of SmolLM2 (the importer changed) builds the store again.
    version = (cache_dir() / STAMP_NAME).read_text().strip()[:16]
    base = cache_dir() / f"docs-store-{version}"
    with open(cache_dir() / ".docs-store.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (base / ".complete").exists():
            shutil.rmtree(base, ignore_errors=True)
            store = ModelStore(base)
            import_model(smollm2, CHAT_NAME, store=store)
            import_model(minilm, EMBEDDER_NAME, store=store)
            (base / ".complete").write_text("")
    return base


def ensure_docs_store(dest: Path) -> Path:
    """A store at ``dest`` holding both demo models (hard links to the cached copy)."""
    base = _base_store()
    shutil.copytree(base, dest, copy_function=os.link, ignore=shutil.ignore_patterns(".complete"))
    return dest
