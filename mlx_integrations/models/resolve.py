"""Turn a model name into a folder that ``mlx_lm.load`` opens.

A name is tried, in order, as:

1. a path (absolute, ``./``, ``~``, or a ``.gguf`` file): a model folder is used as is; a
   GGUF file is imported into the store once and the imported folder is used after that;
2. a store name or alias (``qwen3-4b-q4``, ``org/model`` pulled with ``mlxi pull``);
3. a Hub repo id already in the Hugging Face cache (no request is made);
4. an existing folder relative to the working directory.

The engines go through :func:`resolve_model_path`, then check the folder
(:func:`check_model_dir`, which also warns about a model its quantization damaged)
before MLX touches it, and lease a store model while it is loaded (:func:`lease_model`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import struct
from pathlib import Path
from typing import Any, Literal

from mlx_integrations.models.errors import InvalidNameError, ModelNotFoundError
from mlx_integrations.models.names import is_repo_id, is_valid_name, looks_like_path
from mlx_integrations.models.quality.load_warning import warn_if_damaged
from mlx_integrations.models.store import ModelStore, default_store, lease_model_folder

logger = logging.getLogger(__name__)


def resolve_model(
    name: str | Path,
    *,
    store: ModelStore | None = None,
    download: bool = False,
) -> Path:
    """The folder of a model given by store alias, repo id, folder or GGUF file.

    Args:
        name: What to resolve.
        store: The store (default: ``$MLXI_HOME``).
        download: Pull a repo id that is neither stored nor cached (default: never
            touch the network).

    Returns:
        A folder with ``config.json`` and ``*.safetensors``.

    Raises:
        ModelNotFoundError: Nothing by that name; the hint says how to get it.
        InvalidNameError: ``name`` is neither a path nor a valid name.

    Examples:
        >>> resolve_model("qwen3-4b-q4")  # doctest: +SKIP
        PosixPath('/home/me/.cache/mlxi/models/qwen3-4b-q4')
    """
    store = store or default_store()
    text = str(name)
    if isinstance(name, Path) or looks_like_path(text):
        return _resolve_path(Path(text).expanduser(), store)
    if not is_valid_name(text):
        if Path(text).exists():
            return _resolve_path(Path(text), store)
        raise InvalidNameError(
            f"{text!r} is neither a model name nor an existing path.",
            hint="Give a store name (mlxi list), a repo id like org/model, or a folder path.",
        )
    if store.contains(text):
        return store.get(text).path
    if is_repo_id(text):
        cached = _hf_cached(text)
        if cached is not None:
            return cached
    if Path(text).is_dir():
        return Path(text).resolve()
    if download and is_repo_id(text):
        from mlx_integrations.models.hub.pull import pull

        return pull(text, store=store).model.path
    close = _close_names(text, store)
    if close:
        hint = f"Did you mean {close!r}? (mlxi list shows the store)"
    else:
        hint = f"Run: mlxi pull {text}" if is_repo_id(text) else "See what is there: mlxi list"
    raise ModelNotFoundError(
        f"Model {text!r} is not in the store ({store.home}) nor in the Hugging Face cache.",
        hint=hint,
    )


def _close_names(text: str, store: ModelStore) -> str | None:
    """The store name or alias closest to a mistyped ``text``, if one is close."""
    import difflib

    try:
        names = {m.name for m in store.list()} | set(store.aliases())
    except OSError:
        return None  # an unreadable store: the error says where it is
    by_case = {n.lower(): n for n in names}
    close = difflib.get_close_matches(text.lower(), list(by_case), n=1, cutoff=0.75)
    return by_case[close[0]] if close else None


def _resolve_path(path: Path, store: ModelStore) -> Path:
    if path.is_dir():
        return path.resolve()
    if path.is_file() and path.suffix.lower() == ".gguf":
        # Recorded as given (absolute): a link is not followed to a cache blob.
        return _gguf_in_store(Path(os.path.abspath(path)), store)
    if path.is_file() and path.name == "config.json":
        return path.parent.resolve()
    raise ModelNotFoundError(
        f"{str(path)!r} is not a model folder or a .gguf file.",
        hint="Pass a folder with config.json and *.safetensors, or a .gguf file.",
    )


def gguf_store_name(path: Path) -> str:
    """The store name a GGUF file is imported under: the stem of the name given (a link's
    target may be a cache blob named by its hash) plus a hash of where the file is."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(path).stem).strip("-._").lower()[:60] or "model"
    stem = re.sub(r"-{2,}", "-", stem)
    tag = hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:8]
    return f"gguf-{stem}-{tag}"


def _gguf_in_store(path: Path, store: ModelStore) -> Path:
    """Import a GGUF file once per content, saying so on stderr; reuse it after that.

    An import of this file (unchanged), or of a file with the same sha256 under any
    store name (``mlxi import x.gguf name`` included), is used as it is.
    """
    from mlx_integrations.models.importer import import_model, stored_gguf

    stored = stored_gguf(path, store)
    if stored is not None:
        return stored.path
    name = gguf_store_name(path)
    # A conversion takes a while and a few times the file's size on disk: say so, once.
    converted = _converted_bytes(path)
    logger.warning(
        "Importing %s (%s) into the model store as %s (one time%s) ...",
        path.name,
        _megabytes(path.stat().st_size),
        name,
        f": about {_megabytes(converted)} of float32 weights" if converted else "",
    )
    return import_model(path, name, store=store, overwrite=True).path


def _converted_bytes(path: Path) -> int | None:
    """About how many bytes a GGUF file's float32 import holds; None if unknown."""
    from mlx_integrations.models.gguf.reader import read_gguf_header

    try:
        header = read_gguf_header(path)
    except (OSError, ValueError):
        return None  # the import itself says what is wrong with the file
    return 4 * sum(math.prod(t.shape) for t in header.tensors.values())


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def _hf_cached(repo_id: str) -> Path | None:
    """The cached snapshot of ``repo_id`` at ``main``, without any request."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    from mlx_integrations.models.hub.pull import MODEL_FILE_PATTERNS, hub_cache_dir

    try:
        path = Path(
            snapshot_download(
                repo_id,
                local_files_only=True,
                allow_patterns=list(MODEL_FILE_PATTERNS),
                cache_dir=hub_cache_dir(),
            )
        )
    except (LocalEntryNotFoundError, ValueError, OSError):
        return None
    return path if (path / "config.json").is_file() else None


__all__ = ["InvalidNameError", "ModelNotFoundError", "gguf_store_name", "resolve_model"]


def resolve_model_path(model: str | Path) -> Path:
    """Turn a model name into a local folder.

    Accepts a folder path, and (when the model store is installed) a store alias or
    a Hugging Face repo id already pulled with ``mlxi pull``.

    Raises:
        FileNotFoundError: Nothing by that name exists locally.
    """
    if not isinstance(model, (str, Path)) or not str(model).strip():
        raise TypeError(f"model must be a folder path or a model name, got {model!r}")
    path = Path(model).expanduser()
    if path.exists() and path.is_dir():
        return path.resolve()
    text = str(model)
    path_like = path.is_absolute() or text.startswith((".", "~")) or text.count("/") > 1
    if path_like and not path.is_file():
        raise FileNotFoundError(
            f"{text!r} is not a folder; pass the folder of an MLX model (with config.json "
            "and *.safetensors), a .gguf file, or a model name from `mlxi list`"
        )
    try:
        return Path(resolve_model(text))
    except LookupError as exc:
        hint = getattr(exc, "hint", None)
        raise FileNotFoundError(f"{exc} {hint}" if hint else str(exc)) from exc


def lease_model(path: Path) -> Any:
    """Mark a store model as in use by this process (so ``mlxi rm`` keeps it).

    Returns:
        A lease with ``release()``, or None for a folder outside the model store.
    """
    return lease_model_folder(path)


def check_safetensors(path: Path) -> None:
    """Raise ValueError if a safetensors file is truncated or not safetensors at all."""
    size = path.stat().st_size
    fix = "re-download or re-convert the model"
    if size < 8:
        raise ValueError(f"{path} is truncated ({size} bytes); {fix}")
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > size - 8 or header_len > 100 * 1024 * 1024:
            raise ValueError(f"{path} is not a valid safetensors file (bad header); {fix}")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path} has a corrupt safetensors header; {fix}") from exc
    end = max(
        (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
        default=0,
    )
    if 8 + header_len + end > size:
        raise ValueError(
            f"{path} is truncated: it holds {size} bytes but its header needs "
            f"{8 + header_len + end}; {fix}"
        )


def check_model_dir(path: Path) -> dict[str, Any]:
    """Check that ``path`` looks like a loadable MLX/HF model; return its config.

    A store model whose quantization was measured as damaged passes, with a
    :class:`~mlx_integrations.models.quality.load_warning.DamagedModelWarning` (once per
    model in a process): every engine checks its folder here before it loads it.

    Raises:
        FileNotFoundError: The folder, config.json or the weights are missing.
        ValueError: config.json or a weights file is corrupt, or the folder holds an
            embedding model (see :func:`reject_embedding_model`).
    """
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a folder; pass the folder of an MLX model")
    config_file = path / "config.json"
    reject_embedding_model(path)
    if not config_file.is_file():
        raise FileNotFoundError(
            f"{path} is not a model folder: it has no config.json; pass a folder made by "
            "mlx_lm.convert, `mlxi pull` or `mlxi import`"
        )
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{config_file} is not valid JSON: {exc}") from exc
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(
            f"{path} has no *.safetensors weights; convert the model with `mlxi import` "
            "or mlx_lm.convert"
        )
    for file in weights:
        check_safetensors(file)
    warn_if_damaged(path, stacklevel=2)
    return config


ENCODER_MODEL_TYPES = (
    "bert",
    "roberta",
    "xlm-roberta",
    "camembert",
    "mpnet",
    "distilbert",
    "albert",
    "electra",
    "deberta",
    "deberta-v2",
    "modernbert",
    "nomic_bert",
    "jina_bert",
    "mobilebert",
    "ernie",
)
"""``model_type`` values of encoder-only models (BERT family): they embed or classify
text and generate none."""


ModelKind = Literal["chat", "embedding", "reranker"]
"""What a model folder holds, as ``mlxi show`` and the store's summaries say it."""


def model_kind(path: Path) -> ModelKind:
    """``reranker``, ``embedding`` or ``chat``, from a model folder's files.

    A reranker is a cross-encoder (an encoder's ``*ForSequenceClassification``
    checkpoint: ms-marco-MiniLM, bge-reranker) or an LLM reranker (a causal LM whose
    folder, or the repository it came from, is named as one: Qwen3-Reranker), whose
    config is that of its base model. An embedding model is an encoder or a
    sentence-transformers folder (``modules.json``).
    """
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    if not isinstance(config, dict):
        config = {}
    architectures = [str(a) for a in config.get("architectures") or []]
    encoder = config.get("model_type") in ENCODER_MODEL_TYPES
    if encoder and any(a.endswith("ForSequenceClassification") for a in architectures):
        return "reranker"
    if any(a.endswith("ForCausalLM") for a in architectures) and any(
        "rerank" in part.lower() for part in path.parts[-4:]
    ):
        return "reranker"
    if encoder or (path / "modules.json").is_file():
        return "embedding"
    return "chat"


def reject_embedding_model(path: Path) -> None:
    """Refuse an embedding model or a cross-encoder where a chat model is wanted, saying
    what to use.

    An encoder (``model_type`` in :data:`ENCODER_MODEL_TYPES`) or a sentence-transformers
    folder (``modules.json``) generates no text: mlx-lm would fail with a bare
    "Model type bert not supported.".

    Raises:
        ValueError: Naming the model, what it is, and the adapters to use.
    """
    why = []
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        config = None  # no readable config: check_model_dir says what is wrong
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type in ENCODER_MODEL_TYPES:
        why.append(f"model_type {model_type!r}")
    if (path / "modules.json").is_file():
        why.append("a sentence-transformers modules.json")
    if not why:
        return
    if model_kind(path) == "reranker":
        raise ValueError(
            f"{str(path)!r} holds a reranker (a cross-encoder, {why[0]}), not a chat model: "
            "ChatMLX, MLXLLM and mlxi run generate text with decoder models. Rerank "
            "documents with it instead: `from mlx_integrations.langchain import MLXRerank; "
            f"MLXRerank(model={str(path)!r})` (LangChain) or `from "
            "mlx_integrations.llama_index import MLXRerank; "
            f"MLXRerank({str(path)!r})` (LlamaIndex)."
        )
    raise ValueError(
        f"{str(path)!r} holds an embedding model ({' and '.join(why)}), not a chat model: "
        "ChatMLX, MLXLLM and mlxi run generate text with decoder models. Embed text "
        "with it instead: `from mlx_integrations.langchain import MLXEmbeddings; "
        f"MLXEmbeddings(model_name={str(path)!r})` (LangChain) or `from "
        "mlx_integrations.llama_index import MLXEmbedding; "
        f"MLXEmbedding(model_name={str(path)!r})` (LlamaIndex)."
    )


def context_length(config: dict[str, Any]) -> int | None:
    """The model's context window from its config, when it says."""
    for key in ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length"):
        value = config.get(key) or (config.get("text_config") or {}).get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def vocab_size(config: dict[str, Any]) -> int | None:
    """Width of the model's logits from its config (may exceed the tokenizer's vocabulary)."""
    for section in (config, config.get("text_config") or {}):
        value = section.get("vocab_size")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
