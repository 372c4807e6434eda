"""Fill the disk tier ahead of time: the KV of a prompt prefix, written for engines to find.

:func:`warm_disk_cache` renders a system prompt and tools (or a document) as the
engines render a chat, runs the model over the prefix they share with every request,
and writes that KV into an engine's ``cache_dir`` (``mlxi warm MODEL --system ...
--cache-dir DIR``). An engine made with that ``cache_dir`` and the same KV options
then finds it from its first request, in any process, with no warm cache written into
the model folder (:func:`~mlx_integrations.models.warm.warm_model` does that instead).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlx_integrations.engine.cache.disk import open_disk_cache
from mlx_integrations.engine.cache.kv_quantization import maybe_quantize
from mlx_integrations.engine.decoding import prefill
from mlx_integrations.engine.jobs import default_prefill_step_size
from mlx_integrations.engine.options import EngineOptions
from mlx_integrations.models.progress import ProgressCallback, report


@dataclass(frozen=True)
class DiskWarmResult:
    """A prefix written into a disk cache.

    Attributes:
        folder: The folder of the model's entries in ``cache_dir``.
        tokens: Prefix length in tokens.
        seconds: Time spent running the model over the prefix.
        source: What the prefix was made of (``system``, ``tools``, ``text``).
        written: False when the folder already held this prefix (nothing was written).
    """

    folder: str
    tokens: int
    seconds: float
    source: str
    written: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data for ``mlxi warm --cache-dir ... --json``."""
        return asdict(self)


def warm_disk_cache(
    model: str | Path,
    cache_dir: str | Path,
    *,
    system: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    text: str | None = None,
    kv_bits: int | None = None,
    kv_group_size: int = 64,
    prefill_step_size: int | None = None,
    disk_cache_mb: float = 4096,
    progress: ProgressCallback | None = None,
) -> DiskWarmResult:
    """Write the KV of a prompt prefix into the disk cache an engine reads.

    Args:
        model: Store name, repo id or folder.
        cache_dir: The engines' ``cache_dir``.
        system: System prompt the requests start with.
        tools: Tool definitions (OpenAI format) the requests pass.
        text: A document: appended to the system prompt, or a raw prefix on its own.
        kv_bits: The engines' ``kv_bits`` (an entry serves only its own KV format).
        kv_group_size: The engines' ``kv_group_size``.
        prefill_step_size: Tokens per forward pass (the engines' default if None).
        disk_cache_mb: Budget of the model's folder (older files go first).
        progress: Receives ``"warm"`` updates in tokens.

    Returns:
        Where the entry went and how long the prefix is.

    Raises:
        ValueError: Nothing to warm, a vision-language model, or bad options.

    Examples:
        >>> warm_disk_cache("qwen3-4b-q4", "~/.cache/kv", system="You are terse.")  # doctest: +SKIP
        >>> # SimpleEngine("qwen3-4b-q4", cache_dir="~/.cache/kv") finds it
    """
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    from mlx_integrations.engine.vision.vlm import is_vision_config
    from mlx_integrations.models.resolve import check_model_dir, resolve_model_path
    from mlx_integrations.models.warm import prefix_tokens

    options = EngineOptions(
        cache_dir=str(cache_dir),
        disk_cache_mb=disk_cache_mb,
        kv_bits=kv_bits,
        kv_group_size=kv_group_size,
        prefill_step_size=prefill_step_size,
    )
    path = resolve_model_path(model)
    if is_vision_config(check_model_dir(path)):
        raise ValueError(
            f"{model} is a vision-language model; its engine keeps no disk cache (it "
            "reuses a conversation's KV cache from turn to turn instead)"
        )
    step = prefill_step_size or default_prefill_step_size()
    disk = open_disk_cache(path, options, step)
    assert disk is not None
    loaded, tokenizer = load(str(path))[:2]
    ids = prefix_tokens(tokenizer, system=system, tools=tools, text=text)
    source = "+".join(k for k, v in (("system", system), ("tools", tools), ("text", text)) if v)
    cache = make_prompt_cache(loaded)
    disk.bind(cache)
    maybe_quantize(cache, kv_bits, kv_group_size, 0)  # as the engines do, before the first piece
    start = time.perf_counter()
    for i in range(0, len(ids), step):
        prefill(loaded, cache, ids[i : i + step], step, _quantizer(kv_bits, kv_group_size))
        report(progress, "warm", "Warming", min(i + step, len(ids)), len(ids), "token")
    seconds = time.perf_counter() - start
    report(progress, "warm", "Warming", len(ids), len(ids), "token", done=True)
    before = disk.stats()["writes"]
    disk.offer(ids, cache, len(ids), min_tokens=1)
    disk.close()
    del cache
    mx.clear_cache()
    written = disk.stats()["writes"] > before
    return DiskWarmResult(str(disk.folder), len(ids), seconds, source, written)


def _quantizer(kv_bits: int | None, group_size: int) -> Any:
    if kv_bits is None:
        return None
    return lambda cache: maybe_quantize(cache, kv_bits, group_size, 0)
