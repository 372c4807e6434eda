"""Warm caches: prefix KV caches stored with a model, loaded by engines at start.

``warm`` renders a prefix (a system prompt, tool definitions, a document) with the
model's chat template, runs the model over its tokens once, and saves the KV cache in
``<model dir>/warm/<name>.safetensors`` with the token ids in its metadata. An engine
calls :func:`load_warm_caches` at start and puts the caches in its prefix cache, so the
first request that begins with such a prefix skips that part of the prefill.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlx_integrations.chat.template import probe_template, render_chat_prompt
from mlx_integrations.chat.tool_formats import detect_format
from mlx_integrations.models.errors import StoreError
from mlx_integrations.models.folders import read_json_object
from mlx_integrations.models.manifest import MANIFEST_FILE, Manifest
from mlx_integrations.models.names import validate_name
from mlx_integrations.models.progress import ProgressCallback, report
from mlx_integrations.models.resolve import resolve_model
from mlx_integrations.models.store import ModelStore, default_store

WARM_DIR = "warm"
# User messages that differ from their first character; the renderings of a
# conversation that ends with each of them agree exactly on the shared prefix.
_PROBES = ("Hello, how are you today?", "7 + 5 = ?", "¿Qué tal? 東京")


@dataclass(frozen=True)
class WarmResult:
    """A stored warm cache.

    Attributes:
        name: Its name (the file stem).
        path: The ``.safetensors`` file.
        tokens: Prefix length in tokens.
        seconds: Time spent running the model over the prefix.
        source: What the prefix was made of (``system``, ``tools``, ``text``).
    """

    name: str
    path: str
    tokens: int
    seconds: float
    source: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data for ``mlxi warm --json``."""
        return asdict(self)


def common_prefix(seqs: list[list[int]]) -> list[int]:
    """The longest list that starts every list of ``seqs``."""
    if not seqs:
        return []
    first = seqs[0]
    n = len(first)
    for seq in seqs[1:]:
        n = min(n, len(seq))
        for i in range(n):
            if seq[i] != first[i]:
                n = i
                break
    return first[:n]


def prefix_tokens(
    tokenizer: Any,
    *,
    system: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    text: str | None = None,
) -> list[int]:
    """The token ids every chat request with this system prompt and these tools starts with.

    The conversation is rendered with the chat template, as the engines render it, once
    per probe user message; the tokens shared by all renderings, less the last one (it
    could merge with the user's text), form the prefix. ``text`` alone is a raw prefix
    that is tokenized without a template.
    """
    if system is None and not tools:
        if not text:
            raise ValueError("Give a system prompt, tools or a text to warm.")
        bos = getattr(tokenizer, "bos_token", None)
        ids = list(
            tokenizer.encode(text, add_special_tokens=bos is None or not text.startswith(bos))
        )
        return ids[:-1]
    if text:
        system = f"{system}\n\n{text}" if system else text
    renderings = [
        tokenizer.encode(_render(tokenizer, system, tools, probe), add_special_tokens=False)
        for probe in _PROBES
    ]
    ids = common_prefix([list(r) for r in renderings])
    if not ids:
        raise ValueError("The chat template renders nothing before the user message to warm.")
    return ids[:-1]


def _render(
    tokenizer: Any, system: str | None, tools: list[dict[str, Any]] | None, user: str
) -> str:
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": user}
    ]
    caps = probe_template(tokenizer)
    return render_chat_prompt(
        tokenizer,
        messages,
        tools=tools,
        native_tool_format=caps.renders_tool_messages,
        capabilities=caps,
        tool_format=detect_format(tokenizer),
    )


def warm_model(
    model: str | Path,
    name: str = "default",
    *,
    system: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    text: str | None = None,
    store: ModelStore | None = None,
    step_size: int = 512,
    progress: ProgressCallback | None = None,
) -> WarmResult:
    """Compute and store the KV cache of a prefix with the model.

    Args:
        model: Store name, repo id or folder.
        name: Name of the warm cache (one per prefix; the same name replaces it).
        system: System prompt the requests start with.
        tools: Tool definitions (OpenAI format) the requests pass.
        text: A document: appended to the system prompt, or a raw prefix on its own.
        store: The store (default: ``$MLXI_HOME``).
        step_size: Tokens per forward pass.
        progress: Receives ``"warm"`` updates in tokens.

    Returns:
        Where the cache is and how long the prefix is.

    Examples:
        >>> warm_model("qwen3-4b-q4", "agent", system="You are terse.", tools=tools)  # doctest: +SKIP
    """
    validate_name(name, what="warm cache name")
    if "/" in name:
        raise StoreError(f"The warm cache name {name!r} cannot hold '/'.")
    path = resolve_model(model, store=store or default_store())
    if isinstance(read_json_object(path / "config.json").get("vision_config"), dict):
        raise StoreError(
            f"{model} is a vision-language model; warm caches are for text models.",
            hint="Its engine reuses a conversation's KV cache from turn to turn instead.",
        )
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache, save_prompt_cache

    loaded, tokenizer = load(str(path))[:2]
    ids = prefix_tokens(tokenizer, system=system, tools=tools, text=text)
    source = "+".join(k for k, v in (("system", system), ("tools", tools), ("text", text)) if v)
    cache = make_prompt_cache(loaded)
    start = time.perf_counter()
    for i in range(0, len(ids), step_size):
        loaded(mx.array(ids[i : i + step_size])[None], cache=cache)
        mx.eval([c.state for c in cache])
        report(progress, "warm", "Warming", min(i + step_size, len(ids)), len(ids), "token")
    seconds = time.perf_counter() - start
    report(progress, "warm", "Warming", len(ids), len(ids), "token", done=True)
    warm_dir = path / WARM_DIR
    warm_dir.mkdir(exist_ok=True)
    target = warm_dir / f"{name}.safetensors"
    tmp = warm_dir / f".{name}.{uuid.uuid4().hex[:8]}.safetensors"
    metadata = {"tokens": json.dumps(ids), "source": source, "model": _model_digest(path)}
    try:
        save_prompt_cache(str(tmp), cache, metadata=metadata)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return WarmResult(name, str(target), len(ids), seconds, source)


def _model_digest(path: Path) -> str:
    """The manifest digest of a stored model ("" outside the store)."""
    if not (path / MANIFEST_FILE).is_file():
        return ""
    try:
        return Manifest.read(path).digest
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def load_warm_caches(model_dir: str | Path) -> list[tuple[list[int], list[Any]]]:
    """Load the warm caches stored with a model, as (prefix token ids, KV cache) pairs.

    Caches made for other weights (the model was pulled again at another revision) are
    left out.

    Examples:
        >>> for tokens, cache in load_warm_caches(path):  # doctest: +SKIP
        ...     prefix_cache.put(tokens, cache, pinned=True)
    """
    from mlx_lm.models.cache import load_prompt_cache

    model_dir = Path(model_dir)
    digest = _model_digest(model_dir)
    out: list[tuple[list[int], list[Any]]] = []
    for file in sorted((model_dir / WARM_DIR).glob("*.safetensors")):
        if file.name.startswith("."):
            continue
        cache, metadata = load_prompt_cache(str(file), return_metadata=True)
        if digest and metadata.get("model") and metadata["model"] != digest:
            continue
        tokens = [int(t) for t in json.loads(metadata["tokens"])]
        out.append((tokens, cache))
    return out


@dataclass(frozen=True)
class WarmCacheFile:
    """One warm cache file: its name, path and size in bytes."""

    name: str
    path: str
    size: int


@dataclass(frozen=True)
class WarmRemoval:
    """The warm caches removed from a model (or that a dry run would remove).

    Attributes:
        model: The model as given.
        removed: The caches, each with its file and size.
        freed_bytes: Bytes their files held (leftovers of interrupted warms included).
        dry_run: True when nothing was deleted.
    """

    model: str
    removed: tuple[WarmCacheFile, ...]
    freed_bytes: int
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data for ``mlxi warm --rm --json``."""
        return asdict(self)


def remove_warm_cache(
    model: str | Path,
    name: str | Iterable[str] | None = None,
    *,
    dry_run: bool = False,
    store: ModelStore | None = None,
) -> WarmRemoval:
    """Delete warm caches stored with a model: the named ones, or all of them.

    Every name is checked before anything is deleted. Engines already running keep the
    caches they loaded at start; the next engine starts without them.

    Args:
        model: Store name, repo id or folder.
        name: A cache name, several, or None for all the model's caches (and the
            leftovers of interrupted warms).
        dry_run: Only report what would be deleted.
        store: The store (default: ``$MLXI_HOME``).

    Returns:
        What was (or would be) deleted, and the bytes freed.

    Raises:
        StoreError: The model has no warm cache of a given name.

    Examples:
        >>> remove_warm_cache("qwen3-4b-q4", "agent").freed_bytes  # doctest: +SKIP
        18874368
    """
    warm_dir = resolve_model(model, store=store or default_store()) / WARM_DIR
    present = {p.stem: p for p in sorted(warm_dir.glob("*.safetensors"))}
    caches = {n: p for n, p in present.items() if not n.startswith(".")}
    if name is None:
        chosen, files = list(caches), list(present.values())
    else:
        chosen = [name] if isinstance(name, str) else list(dict.fromkeys(name))
        for n in chosen:
            validate_name(n, what="warm cache name")
            if n not in caches:
                have = f"it has: {', '.join(caches)}" if caches else "it has none"
                raise StoreError(
                    f"{model} has no warm cache {n!r} ({have}).",
                    hint=f"See its warm caches: mlxi show {model}",
                )
        files = [caches[n] for n in chosen]
    sizes = {p: p.stat().st_size for p in files}
    if not dry_run:
        for p in files:
            p.unlink(missing_ok=True)
        if warm_dir.is_dir() and not any(warm_dir.iterdir()):
            warm_dir.rmdir()
    removed = tuple(WarmCacheFile(n, str(caches[n]), sizes[caches[n]]) for n in chosen)
    return WarmRemoval(str(model), removed, sum(sizes.values()), dry_run)


def list_warm_caches(model_dir: str | Path) -> list[str]:
    """Names of the warm caches stored with a model."""
    return sorted(
        p.stem
        for p in (Path(model_dir) / WARM_DIR).glob("*.safetensors")
        if not p.name.startswith(".")
    )


def warm_weights(
    model: str | Path, *, store: ModelStore | None = None, progress: ProgressCallback | None = None
) -> int:
    """Read a model's weight files once so the OS keeps them in its page cache.

    Returns:
        Bytes read.
    """
    path = resolve_model(model, store=store or default_store())
    files = sorted(path.glob("*.safetensors"))
    total = float(sum(f.stat().st_size for f in files))
    done = 0
    for file in files:
        with open(file, "rb") as fh:
            while chunk := fh.read(1 << 24):
                done += len(chunk)
                report(progress, "weights", "Reading weights", done, total, "B")
    report(progress, "weights", "Reading weights", done, total, "B", done=True)
    return done
