"""Quantize a model into the store with mlx-lm (``mlx_lm.convert``).

A vision-language model (config.json with a ``vision_config``) goes through mlx-vlm's
conversion instead (``mlx_vlm.convert``, from the ``[vision]`` extra): it quantizes the
language model, keeps the vision tower as it is and writes the processor files.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from mlx_integrations.models.errors import AlreadyQuantizedError, DamagedQuantizationError
from mlx_integrations.models.folders import read_json_object
from mlx_integrations.models.hub.hashing import FinishedFilesHasher
from mlx_integrations.models.manifest import (
    Manifest,
    ModelSource,
    QuantizationInfo,
    hash_files,
    sha256_file,
)
from mlx_integrations.models.manifest import model_files as list_model_files
from mlx_integrations.models.names import is_valid_name, looks_like_path, validate_name
from mlx_integrations.models.progress import ProgressCallback, report
from mlx_integrations.models.quality.report import QuantizationQuality
from mlx_integrations.models.resolve import resolve_model
from mlx_integrations.models.store import ModelStore, StoredModel, default_store

BITS = (2, 3, 4, 5, 6, 8)
GROUP_SIZES = (16, 32, 64, 128)
DTYPES = ("float16", "bfloat16", "float32")
# mode -> (default group size, allowed bits, allowed group sizes), as in mlx-lm.
MODES: dict[str, tuple[int, tuple[int, ...], tuple[int, ...]]] = {
    "affine": (64, BITS, (32, 64, 128)),
    "mxfp4": (32, (4,), (32,)),
    "nvfp4": (16, (4,), (16,)),
    "mxfp8": (32, (8,), (32,)),
}
RECIPES = ("mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6")


def check_quantization(
    bits: int, group_size: int | None, mode: str, recipe: str | None, dtype: str | None
) -> int:
    """Reject settings mlx-lm cannot use, before any weight is loaded.

    Returns:
        The group size to use (the mode's default when None).
    """
    if mode not in MODES:
        raise ValueError(f"Unknown quantization mode {mode!r}; choose one of {', '.join(MODES)}.")
    default_group, allowed_bits, allowed_groups = MODES[mode]
    if bits not in allowed_bits:
        raise ValueError(
            f"bits={bits} is not possible with mode {mode!r}; "
            f"choose one of {', '.join(map(str, allowed_bits))}."
        )
    group = default_group if group_size is None else group_size
    if group not in allowed_groups:
        raise ValueError(
            f"group_size={group} is not possible with mode {mode!r}; "
            f"choose one of {', '.join(map(str, allowed_groups))}."
        )
    if recipe is not None:
        if recipe not in RECIPES:
            raise ValueError(f"Unknown recipe {recipe!r}; choose one of {', '.join(RECIPES)}.")
        if mode != "affine":
            raise ValueError("Mixed recipes only work with mode 'affine'.")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}.")
    return group


def default_quantized_name(
    source: str, bits: int, mode: str = "affine", recipe: str | None = None
) -> str:
    """``org/model`` + 4 bits -> ``org/model-q4``; a path uses its folder's name."""
    base = source if is_valid_name(source) else Path(source).expanduser().name
    base = re.sub(r"[^A-Za-z0-9._/-]+", "-", base).strip("-./") or "model"
    suffix = recipe.replace("_", "-") if recipe else (f"q{bits}" if mode == "affine" else mode)
    return validate_name(f"{base}-{suffix}")


def quantize_model(
    source: str | Path,
    name: str | None = None,
    *,
    bits: int = 4,
    group_size: int | None = None,
    mode: str = "affine",
    recipe: str | None = None,
    dtype: str | None = None,
    store: ModelStore | None = None,
    overwrite: bool = False,
    evaluate: bool = True,
    strict: bool = False,
    progress: ProgressCallback | None = None,
) -> StoredModel:
    """Quantize a model (store name, repo id, folder or GGUF file) into the store.

    Then the quantized model is compared with its source on a short built-in text
    (perplexity ratio and KL divergence, a few seconds for a small model); the figures
    are kept in the manifest as ``quality``, whose ``warning()`` says when the model lost
    too much. A vision-language model is not compared (``quality`` stays None).

    A model measured as damaged is kept and flagged: ``mlxi list`` and ``mlxi show`` mark
    it, and engines warn when they load it. With ``strict``, it is not kept: the build
    is discarded and the store stays as it was (a model the name held is not replaced).

    Args:
        source: The model to quantize (resolved like :func:`resolve_model`).
        name: Store name of the result (default: ``<source>-q<bits>``).
        bits: 2, 3, 4, 5, 6 or 8.
        group_size: Weights per scale (default: 64 for affine, the mode's size otherwise).
        mode: ``affine``, ``mxfp4``, ``nvfp4`` or ``mxfp8``.
        recipe: A mixed-precision recipe of mlx-lm (``mixed_3_6`` etc.).
        dtype: Dtype of the weights left unquantized (default: the model's).
        store: The store (default: ``$MLXI_HOME``).
        overwrite: Replace a model of that name.
        evaluate: Compare the result with its source (False: skip, ``quality`` is None).
        strict: Refuse a result measured as damaged (needs ``evaluate``; a
            vision-language model, which is not measured, is refused at once).
        progress: Receives ``"quantize"`` updates.

    Returns:
        The quantized model in the store.

    Raises:
        DamagedQuantizationError: With ``strict``, the result was damaged (its figures
            are in the error's ``quality``); nothing was stored.

    Examples:
        >>> model = quantize_model("smollm2-135m-instruct", "smollm2-q4", bits=4)  # doctest: +SKIP
        >>> model.manifest.quality.verdict  # doctest: +SKIP
        'degraded'
    """
    group = check_quantization(bits, group_size, mode, recipe, dtype)
    if strict and not evaluate:
        raise ValueError(
            "strict=True judges the measured result, and evaluate=False skips the "
            "measurement: drop one of them (mlxi quantize: --strict or --no-eval)."
        )
    store = store or default_store()
    name = validate_name(name or default_quantized_name(str(source), bits, mode, recipe))
    gguf = _gguf_file(source)
    src_path = gguf or resolve_model(source, store=store)
    if gguf is None:
        _refuse_quantized(source, src_path, store)
        if strict and _is_vision(src_path):
            raise ValueError(
                f"{str(source)!r} is a vision-language model, whose quantization is not "
                "measured, so strict=True cannot judge it: quantize it without --strict."
            )

    with store.building(name, overwrite=overwrite) as build:
        if gguf is not None:
            # Converted inside the build, which goes with it: a GGUF source leaves no
            # unquantized copy in the store (resolve_model would keep one).
            from mlx_integrations.models.gguf.convert import convert_gguf, read_supported_gguf

            src_path = build.path / "gguf-source"
            src_path.mkdir()
            convert_gguf(read_supported_gguf(gguf), src_path, dtype="float32")
        convert, extra = _converter(src_path)
        # mlx-lm cannot load a vision-language model's folder: it is not compared.
        vision = _is_vision(src_path)
        out = build.path / "converted"
        report(progress, "quantize", f"Quantizing to {bits} bits", 0, 1, "step")
        # mlx-lm writes the weight shards, then their index, then config and tokenizer:
        # the shards are hashed while it writes the rest. mlx-lm reports on stdout;
        # keep stdout for results.
        weights = FinishedFilesHasher(out, "model.safetensors.index.json", _is_weights)
        quantization = QuantizationInfo(bits=bits, group_size=group, mode=mode, recipe=recipe)
        with weights, contextlib.redirect_stdout(sys.stderr):
            convert(str(src_path), str(out), dtype=dtype, **_convert_options(quantization), **extra)
        for item in out.iterdir():
            os.rename(item, build.path / item.name)
        out.rmdir()
        quality = None
        if evaluate and not vision:
            # Against the weights it was made from: for a GGUF source, its conversion.
            quality = replace(_compare(src_path, build.path, progress), reference=_base(source))
            if strict and quality.verdict == "damaged":
                raise _damaged_error(name, quality, quantization)
        if gguf is not None:
            shutil.rmtree(src_path)
        report(progress, "quantize", f"Quantizing to {bits} bits", 1, 1, "step", done=True)
        files = list_model_files(build.path)
        manifest = Manifest(
            name=name,
            source=ModelSource(
                kind="quantize",
                base=_base(source),
                path=str(gguf or src_path),
                sha256=sha256_file(gguf) if gguf is not None else None,
            ),
            files=hash_files(build.path, files, known=weights.entries(build.path, files)),
            quantization=quantization,
            dtype=dtype or _dtype(build.path),
            quality=quality,
        )
        return build.commit(manifest)


def _compare(
    source: Path, quantized: Path, progress: ProgressCallback | None
) -> QuantizationQuality:
    """The quantized model against its source on the built-in text."""
    from mlx_integrations.models.quality.measure import measure_quality

    report(progress, "quantize", "Comparing with the source", 0, 1, "step")
    quality = measure_quality(source, quantized)
    report(progress, "quantize", "Comparing with the source", 1, 1, "step", done=True)
    return quality


def _damaged_error(
    name: str, quality: QuantizationQuality, quantization: QuantizationInfo
) -> DamagedQuantizationError:
    """The error of a strict quantization whose result was damaged (not kept)."""
    advice = quality.warning(quantization, kept=False)
    assert advice is not None  # a damaged model always has one
    return DamagedQuantizationError(
        f"{name!r} was not kept: {advice.message}",
        hint=f"{advice.hint} Without --strict it is kept, flagged as damaged.",
        quality=quality,
    )


def _is_vision(folder: Path) -> bool:
    return isinstance(read_json_object(folder / "config.json").get("vision_config"), dict)


def _base(source: str | Path) -> str:
    """What ``source`` is recorded as: a name as given, a path made absolute."""
    if isinstance(source, str) and not looks_like_path(source):
        return source
    return os.path.abspath(Path(source).expanduser())


def _gguf_file(source: str | Path) -> Path | None:
    """The GGUF file ``source`` names, read as :func:`resolve_model` reads it, or None."""
    text = str(source)
    if not (isinstance(source, Path) or looks_like_path(text) or not is_valid_name(text)):
        return None
    path = Path(text).expanduser()
    # Absolute as given: the manifest names the file the user named, not a link's target.
    is_gguf = path.is_file() and path.suffix.lower() == ".gguf"
    return Path(os.path.abspath(path)) if is_gguf else None


def _refuse_quantized(source: str | Path, folder: Path, store: ModelStore) -> None:
    """Refuse a source that is quantized already: mlx-lm would copy its quantized layers
    as they are, and the result would claim a quantization its weights do not have."""
    from mlx_integrations.models.hub.pull import quantization_of

    q = quantization_of(read_json_object(folder / "config.json"))
    if q is None:
        return
    origin = None
    if isinstance(source, str) and store.contains(source):
        stored = store.get(source).manifest.source
        origin = stored.base if stored.kind == "quantize" else None
    raise AlreadyQuantizedError(
        f"{str(source)!r} is already quantized ({q.bits} bits, group {q.group_size}, "
        f"{q.mode}); quantizing it again would leave its weights at {q.bits} bits.",
        hint=f"Quantize the model it was made from: mlxi quantize {origin} --bits N"
        if origin
        else "Quantize the unquantized (float16, bfloat16 or float32) original instead.",
    )


def _converter(path: Path) -> tuple[Any, dict[str, Any]]:
    """mlx-lm's ``convert`` for a text model, mlx-vlm's for a vision-language model."""
    if not isinstance(read_json_object(path / "config.json").get("vision_config"), dict):
        from mlx_lm.convert import convert

        return convert, {}
    try:
        from mlx_vlm.convert import convert as vision_convert
    except ImportError as exc:
        raise ImportError(
            f"{path.name} is a vision-language model; quantizing it needs mlx-vlm: "
            'pip install "mlx-integrations[vision]"'
        ) from exc
    # Remote code stays off, as for pulls (mlx-vlm's default would run it).
    return vision_convert, {"trust_remote_code": False}


def _convert_options(q: QuantizationInfo) -> dict[str, Any]:
    """The arguments of ``mlx_lm.convert`` that make it quantize as ``q`` records."""
    return {
        "quantize": True,
        "q_bits": q.bits,
        "q_group_size": q.group_size,
        "q_mode": q.mode,
        "quant_predicate": q.recipe,
    }


def _is_weights(name: str) -> bool:
    return name.endswith(".safetensors")


def _dtype(folder: Path) -> str | None:
    from mlx_integrations.models.hub.pull import dtype_of

    return dtype_of(read_json_object(folder / "config.json"))
