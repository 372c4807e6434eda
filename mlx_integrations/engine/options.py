"""The options an mlx-lm engine is made with, checked once, before any model loads."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, ClassVar, Self

from mlx_integrations.chat.fields import (
    RequestError,
    RequestTypeError,
    check_template_kwargs,
    checking,
)
from mlx_integrations.chat.tool_formats import get_format
from mlx_integrations.engine.cache.kv_quantization import validate_kv_options
from mlx_integrations.engine.jobs import Admission
from mlx_integrations.engine.stats import SpeculativeStats
from mlx_integrations.engine.vision.media import MediaLimits
from mlx_integrations.engine.vision.policy import MediaPolicy
from mlx_integrations.models.lora.adapter import read_adapter


@dataclass(frozen=True)
class EngineOptions:
    """How :class:`SimpleEngine` and :class:`BatchedEngine` serve their model.

    Every field is also a keyword argument of both engines (and an entry of the
    adapters' ``engine_options``); keywords given next to an ``options`` object
    override its fields.

    Examples:
        >>> from mlx_integrations.engine.options import EngineOptions
        >>> opts = EngineOptions(admission="fail_fast", cache_memory_mb=256)
        >>> opts.max_cache_entries
        8
        >>> # SimpleEngine(model, options=opts) is SimpleEngine(model, admission=..., ...)

    Raises:
        TypeError, ValueError: For a value of the wrong type or out of range.
    """

    engine_name: ClassVar[str] = "SimpleEngine"
    """The engine these options are for (named in errors)."""

    admission: Admission = "wait"
    """``"wait"`` queues requests the engine cannot take yet (one running for
    ``SimpleEngine``, ``max_num_seqs`` for ``BatchedEngine``); ``"fail_fast"`` raises
    :class:`EngineBusy` instead."""
    cache_memory_mb: float = 1024
    """Budget of the prefix cache (KV of earlier prompts); 0 turns it off."""
    max_cache_entries: int = 8
    """Most prefixes kept in the prefix cache."""
    prefill_step_size: int | None = None
    """Prompt tokens processed per forward pass; a long prompt is prefilled in pieces
    (with ``BatchedEngine``, decode steps of the others run in between). None: 2048 on
    a GPU, 512 on the CPU (where smaller pieces run faster)."""
    prefill_buckets: bool | None = None
    """Pad the last prefill piece of a prompt to one of a few sizes (16, 24, 32, 48...
    up to ``prefill_step_size``), masked and trimmed off the KV cache, so the cache holds
    the prompt's tokens alone: a process then meets few distinct prefill shapes, which
    MLX's CUDA backend sets up once each rather than once per prompt length. Greedy
    replies are those of the unpadded prompt on the CPU, and equal to them up to
    bfloat16 rounding ties on CUDA. False turns the padding off, for replies bit for bit
    those of raw mlx-lm's ``generate_step`` (same ``prefill_step_size``, a prompt not
    served from the prefix cache). None: on with CUDA, off elsewhere (on the CPU the
    padding costs and saves nothing). Requests decoding alone use it; a shared batch
    prefills as mlx-lm does."""
    warmup_shapes: bool | None = None
    """Run each padded prefill shape and a decode step once when the model loads, on
    the thread that serves it, so the first requests find them set up (the seconds it
    took: ``warmup_seconds`` of the engine). None: on where ``prefill_buckets`` is."""
    prefix_key_step: int | None = None
    """Serve a cached prefix in multiples of this many tokens, prefilling the few left
    over again with the new ones. After a cached prefix, the attention's key length is
    the prefix plus the piece, and MLX's CUDA backend sets up each new one (about 70 ms
    on an H200): in whole steps, later turns and shared prefixes meet few key lengths.
    None: 256 where ``prefill_buckets`` is on, 1 (all that is cached) elsewhere."""
    preserve_native_tool_format: bool | None = None
    """Override the flag probed from the chat template at load."""
    chat_template_kwargs: Mapping[str, Any] | None = None
    """Variables passed to the chat template on every call."""
    load_warm_caches: bool = True
    """Load the prefix caches stored with the model by ``mlxi warm``."""
    cache_dir: str | None = None
    """A folder for the disk tier of the prefix cache: prompt KV that outlives the
    process (:mod:`~mlx_integrations.engine.cache.disk`). Entries the memory tier evicts,
    and of each prompt of two prefill pieces or more its longest prefix of a multiple
    of 256 tokens or the longer prefix it shared with an earlier prompt, are written in
    the background; a new engine (in this process or the next) loads the longest stored
    prefix of a prompt instead of prefilling it. One folder may serve many models:
    entries are kept per model weights and KV format. None (the default) keeps the
    prefix cache in memory only. A ``Path`` is taken too."""
    disk_cache_mb: float = 4096
    """Budget of the disk tier, per model and KV format; the least recently used files
    are removed beyond it. Used with ``cache_dir``."""
    tool_format: str | None = None
    """The tool-call family (``hermes``, ``pythonic``, ``mistral``...; see
    :mod:`mlx_integrations.chat.tool_formats`); None detects it once from the tokenizer
    and the chat template at load."""
    adapter_path: str | None = None
    """A LoRA adapter folder as ``mlx_lm.lora`` writes it (``adapter_config.json`` and
    ``adapters.safetensors``; DoRA and full fine-tunes too), applied to the model at each
    load as ``mlx_lm.load(path, adapter_path=...)`` does. Checked here: a missing folder
    or file, or a config mlx-lm cannot apply, is refused before the model loads. The
    warm caches of the base model (``mlxi warm``) are not loaded under an adapter, and
    the disk tier keeps its entries apart. Text models only. A ``Path`` is taken too;
    it is kept absolute."""
    draft_model: str | None = None
    """A small model that drafts tokens for the target to verify (speculative decoding;
    ``BatchedEngine`` drafts for a request while it runs alone): a folder, store name or
    pulled Hub id, resolved like the model. It must share the target's tokenizer.
    Greedy replies are unchanged."""
    num_draft_tokens: int = 3
    """Tokens the draft model proposes per verification step."""
    prompt_lookup: int = 0
    """Most tokens drafted per step from an earlier occurrence (in the prompt or the
    reply so far) of the context's last few tokens; no second model needed.
    ``BatchedEngine`` drafts for requests in its shared batch too (not with ``kv_bits``
    there). 0 turns it off."""
    kv_bits: int | None = None
    """Bits per value of a quantized KV cache (2, 3, 4, 6 or 8; ``SimpleEngine`` and
    ``BatchedEngine``; with ``draft_model``, the target's cache from its first token);
    None keeps the cache in the model's dtype. 8 bits halves
    a float16 cache with little drift in replies, 4 bits takes about 0.28x."""
    kv_group_size: int = 64
    """Values sharing one scale and bias in the quantized KV cache (32, 64 or 128; it
    must divide the model's attention head size)."""
    quantized_kv_start: int = 0
    """Tokens a request's KV cache holds unquantized before it is quantized (mlx-lm's
    ``quantized_kv_start``). 0 quantizes it from the start, so a reply is the same
    whether its prompt came from the prefix cache or was prefilled afresh.
    ``BatchedEngine`` takes only 0: every row of a shared batch is quantized."""

    max_images: int = 8
    """Most images and videos one request may hold (vision-language models)."""
    max_media_mb: float = 20
    """Largest image or video one request may bring, as a file, a data URL or an
    ``http(s)`` download (which is cut off past it)."""
    media_timeout_s: float = 10
    """Seconds an ``http(s)`` image download may take in all (connecting, redirects,
    headers and body)."""
    max_image_pixels: int = 50_000_000
    """Most pixels (width x height) one image may have; checked before it is decoded,
    since a file of a few KiB can hold an image of gigabytes."""
    media_policy: MediaPolicy | None = None
    """Which local files and hosts an image or video source may name; None lets every
    one through (the caller's own files). A server passes
    :meth:`MediaPolicy.restricted() <mlx_integrations.engine.vision.policy.MediaPolicy.restricted>`."""

    def __post_init__(self) -> None:
        # Each check names its field: a RequestError carries the field's path.
        if self.tool_format is not None:
            with checking("tool_format"):
                get_format(self.tool_format)  # an unknown name fails here, not at load
        if self.admission not in ("wait", "fail_fast"):
            raise RequestError(
                f"admission must be 'wait' or 'fail_fast', got {self.admission!r}", "admission"
            )
        budget = self.cache_memory_mb
        if not isinstance(budget, (int, float)) or isinstance(budget, bool):
            raise RequestTypeError(
                f"cache_memory_mb must be a number, got {budget!r}", "cache_memory_mb"
            )
        if not math.isfinite(budget) or budget < 0:
            raise RequestError(
                f"cache_memory_mb must be a finite number >= 0 (0 turns the prefix cache "
                f"off), got {budget}",
                "cache_memory_mb",
            )
        if self.adapter_path is not None:
            with checking("adapter_path"):
                path = str(read_adapter(self.adapter_path).path)
            object.__setattr__(self, "adapter_path", path)
        _check_disk_options(self.cache_dir, self.disk_cache_mb)
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", str(Path(self.cache_dir).expanduser()))
        step = self.prefill_step_size
        if step is not None and step < 1:
            raise RequestError(f"prefill_step_size must be >= 1, got {step}", "prefill_step_size")
        for name in ("prefill_buckets", "warmup_shapes"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise RequestTypeError(
                    f"{name} must be True, False or None (the default for the device), "
                    f"got {value!r}",
                    name,
                )
        key_step = self.prefix_key_step
        if key_step is not None and (
            isinstance(key_step, bool) or not isinstance(key_step, int) or key_step < 1
        ):
            raise RequestError(
                f"prefix_key_step must be a whole number of tokens >= 1 (1 serves all that "
                f"is cached) or None (256 where prefill_buckets is on), got {key_step!r}",
                "prefix_key_step",
            )
        validate_speculative_options(self.draft_model, self.num_draft_tokens, self.prompt_lookup)
        validate_kv_options(self.kv_bits, self.kv_group_size, self.quantized_kv_start)
        if self.kv_bits is not None and self.draft_model is not None and self.quantized_kv_start:
            # mlx-lm's speculative_generate_step would quantize a copy of the cache list
            # midway, so the request's own cache would miss the tokens decoded after it;
            # a cache quantized from its first token is one the draft loop keeps.
            raise RequestError(
                f"kv_bits={self.kv_bits} with draft_model={str(self.draft_model)!r} "
                f"quantizes the KV cache from its first token: quantized_kv_start must "
                f"be 0, got {self.quantized_kv_start}; or use prompt_lookup, which takes "
                "any quantized_kv_start",
                "quantized_kv_start",
            )
        _check_media_limits(self.max_images, self.max_media_mb, self.media_timeout_s)
        pixels = self.max_image_pixels
        if isinstance(pixels, bool) or not isinstance(pixels, int) or pixels < 1:
            raise RequestError(
                f"max_image_pixels must be an integer >= 1, got {pixels!r}", "max_image_pixels"
            )
        if self.media_policy is not None and not isinstance(self.media_policy, MediaPolicy):
            raise RequestTypeError(
                f"media_policy must be a MediaPolicy, got {self.media_policy!r}", "media_policy"
            )
        template_kwargs = check_template_kwargs(self.chat_template_kwargs)
        object.__setattr__(self, "chat_template_kwargs", template_kwargs)

    @property
    def media_limits(self) -> MediaLimits:
        """What one request may bring in images and videos."""
        return MediaLimits(
            self.max_images,
            int(self.max_media_mb * 1024 * 1024),
            float(self.media_timeout_s),
            self.max_image_pixels,
            self.media_policy or MediaPolicy(),
        )

    def vision_kv_options(self) -> dict[str, Any]:
        """The quantized KV cache settings in mlx-vlm's ``generate_step`` keywords."""
        if self.kv_bits is None:
            return {}
        return {
            "kv_bits": self.kv_bits,
            "kv_group_size": self.kv_group_size,
            "quantized_kv_start": self.quantized_kv_start,
        }

    @property
    def speculation(self) -> str:
        """The draft source: ``"draft_model"``, ``"prompt_lookup"`` or ``"off"``."""
        if self.draft_model is not None:
            return "draft_model"
        return "prompt_lookup" if self.prompt_lookup else "off"

    def speculative_stats(self, drafted: int, accepted: int) -> SpeculativeStats:
        """The ``speculative`` entry of ``get_stats()`` for these options."""
        mode = self.speculation
        per_step = {"draft_model": self.num_draft_tokens, "prompt_lookup": self.prompt_lookup}
        return SpeculativeStats(
            mode=mode,
            draft_model=str(self.draft_model) if self.draft_model is not None else None,
            max_draft_tokens=per_step.get(mode, 0),
            drafted_tokens=drafted,
            accepted_tokens=accepted,
            acceptance_rate=accepted / drafted if drafted else 0.0,
        )

    @classmethod
    def build(cls, options: EngineOptions | None, overrides: Mapping[str, Any]) -> Self:
        """``options`` (or the defaults) with the keyword arguments ``overrides`` applied,
        as this engine type's options (the fields an ``EngineOptions`` given to a
        ``BatchedEngine`` has are kept, its own start at their defaults).

        Raises:
            RequestError: A keyword that is not a field of this type (a ``TypeError``
                too), ``options`` of another type, or a bad value (naming its field).
        """
        if options is not None and not isinstance(options, EngineOptions):
            raise RequestTypeError(
                f"options must be an EngineOptions, got {type(options).__name__}", "options"
            )
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(overrides) - set(names))
        if unknown:
            raise RequestTypeError(
                f"unexpected keyword argument(s) {unknown}; the engine options are: "
                f"{', '.join(names)}",
                unknown[0],
            )
        if options is None:
            return cls(**overrides)
        if type(options) is cls:
            return replace(options, **overrides) if overrides else options
        given = {f.name: getattr(options, f.name) for f in fields(options) if f.name in names}
        return cls(**{**given, **overrides})


def _check_disk_options(cache_dir: Any, disk_cache_mb: Any) -> None:
    if cache_dir is not None:
        if not isinstance(cache_dir, (str, Path)) or not str(cache_dir).strip():
            raise RequestTypeError(
                f"cache_dir must be a folder path (str or Path), got {cache_dir!r}; pass "
                "None to keep the prefix cache in memory only",
                "cache_dir",
            )
        folder = Path(cache_dir).expanduser()
        if folder.exists() and not folder.is_dir():
            raise RequestError(
                f"cache_dir={str(cache_dir)!r} is a file, not a folder; pass a folder "
                "(it is made if missing)",
                "cache_dir",
            )
    budget = disk_cache_mb
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise RequestTypeError(f"disk_cache_mb must be a number, got {budget!r}", "disk_cache_mb")
    if not math.isfinite(budget) or budget <= 0:
        raise RequestError(
            f"disk_cache_mb must be a finite number > 0 (MiB of disk for the cache_dir "
            f"tier; cache_dir=None turns it off), got {budget}",
            "disk_cache_mb",
        )


def _check_media_limits(max_images: Any, max_media_mb: Any, timeout: Any) -> None:
    if isinstance(max_images, bool) or not isinstance(max_images, int) or max_images < 1:
        raise RequestError(f"max_images must be an integer >= 1, got {max_images!r}", "max_images")
    for name, value in (("max_media_mb", max_media_mb), ("media_timeout_s", timeout)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RequestTypeError(f"{name} must be a number, got {value!r}", name)
        if not math.isfinite(value) or value <= 0:
            raise RequestError(f"{name} must be a finite number > 0, got {value!r}", name)


def validate_speculative_options(
    draft_model: Any, num_draft_tokens: Any, prompt_lookup: Any
) -> None:
    """Check the speculative decoding options of an engine.

    Raises:
        TypeError: A value of the wrong type. ValueError: out of range, or both sources.
    """
    if draft_model is not None and (
        not isinstance(draft_model, (str, Path)) or not str(draft_model).strip()
    ):
        raise RequestTypeError(
            f"draft_model must be a model folder, store name or pulled Hub id, got "
            f"{draft_model!r}; pass None to decode without a draft model",
            "draft_model",
        )
    for name, value, low, fix in (
        ("num_draft_tokens", num_draft_tokens, 1, "2 to 5 is usual"),
        ("prompt_lookup", prompt_lookup, 0, "0 turns prompt lookup off, 4 to 10 is usual"),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            raise RequestTypeError(f"{name} must be an integer, got {value!r}; {fix}", name)
        if value < low:
            raise RequestError(f"{name} must be >= {low}, got {value}; {fix}", name)
    if draft_model is not None and prompt_lookup:
        raise RequestError(
            f"draft_model={str(draft_model)!r} and prompt_lookup={prompt_lookup} are two "
            "draft sources; pick one (prompt_lookup=0 or draft_model=None)",
            "prompt_lookup",
        )
