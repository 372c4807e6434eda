"""Ollama's model names (``name:tag``) and what Ollama's clients read about a model.

Ollama names a model ``name:tag``, and ``name`` alone means ``name:latest``. The store
names a model without a tag (a store name, an alias, a Hub id, a folder), so a name
that comes in loses its ``:latest``, and a name that goes out gains it: the store's
``smollm2-135m-instruct`` and its aliases are listed as ``smollm2-135m-instruct:latest``
and found under both spellings. Another tag names nothing here except where the server
was configured with that exact name (a model called ``tiny:q4`` in the config file).

The facts (size, digest, family, parameter count, quantization, template,
capabilities) are read from the model's files as ``mlxi show`` reads them, without
loading its weights.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlx_integrations.chat.reasoning import THINK_MARKERS
from mlx_integrations.serve.errors import APIError
from mlx_integrations.serve.ollama import protocol as wire

__all__ = [
    "LATEST",
    "ModelFacts",
    "facts_of",
    "iso_time",
    "ollama_name",
    "served_name",
    "unknown_tag",
]

LATEST = "latest"


def _split(name: str) -> tuple[str, str | None]:
    """``name:tag`` as (name, tag); a colon inside a path or a host's port is no tag."""
    base, sep, tag = name.rpartition(":")
    if not sep or not base or not tag or "/" in tag:
        return name, None
    return base, tag


def served_name(name: str) -> str:
    """The name the server knows a request's model by: ``x:latest`` is ``x``."""
    base, tag = _split(name.strip())
    return base if tag == LATEST else name.strip()


def ollama_name(name: str) -> str:
    """The name Ollama's clients list: ``x`` is ``x:latest``; a tagged name stays."""
    return name if _split(name)[1] is not None else f"{name}:{LATEST}"


def unknown_tag(name: str) -> APIError | None:
    """The 404 for ``name:tag`` (a tag other than ``latest``) that names nothing here,
    saying how models are named; None for a name without such a tag."""
    base, tag = _split(name)
    if tag is None or tag == LATEST:
        return None
    return APIError(
        404,
        f"model {name!r} not found: tags other than ':latest' name nothing here (the "
        f"store names models without tags); try {base!r}, or GET /api/tags for the names",
        param="model",
        code="model_not_found",
    )


def iso_time(seconds: float | None) -> str:
    """Seconds since the epoch as RFC 3339 in UTC (Ollama's time format)."""
    when = dt.datetime.fromtimestamp(seconds if seconds is not None else 0, dt.UTC)
    return when.isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class ModelFacts:
    """What Ollama's clients read about one model (``/api/tags``, ``/api/show``)."""

    path: Path
    size: int
    digest: str
    modified_at: str
    details: wire.ModelDetails
    capabilities: list[str]
    template: str
    parameters: dict[str, Any]
    model_info: dict[str, Any]

    def entry(self, name: str) -> wire.ModelEntry:
        """The model's line in ``/api/tags`` under ``name``."""
        listed = ollama_name(name)
        return wire.ModelEntry(
            name=listed,
            model=listed,
            modified_at=self.modified_at,
            size=self.size,
            digest=self.digest,
            details=self.details,
        )

    def show(self) -> wire.ShowResponse:
        """The answer of ``/api/show``."""
        lines = [
            f"{key} {_parameter(value)}"
            for key, values in self.parameters.items()
            for value in (values if isinstance(values, list) else [values])
        ]
        modelfile = [f"# mlxi serve: the model at {self.path}", f"FROM {self.path}"]
        if self.template:
            modelfile.append(f'TEMPLATE """{self.template}"""')
        modelfile += [f"PARAMETER {line}" for line in lines]
        return wire.ShowResponse(
            modelfile="\n".join(modelfile) + "\n",
            parameters="\n".join(lines),
            template=self.template,
            details=self.details,
            model_info=self.model_info,
            capabilities=self.capabilities,
            modified_at=self.modified_at,
        )


def _parameter(value: Any) -> str:
    return (
        f'"{value}"'
        if isinstance(value, str)
        else f"{value:g}"
        if isinstance(value, float)
        else str(value)
    )


def _count(parameters: int | None) -> str:
    """``135M``, ``7.6B`` (Ollama's ``parameter_size``)."""
    if not parameters:
        return ""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if parameters >= scale:
            value = parameters / scale
            return f"{value:.1f}".rstrip("0").rstrip(".") + unit
    return str(parameters)


def _level(info: Any) -> str:
    """``Q4`` for 4-bit weights, else the weights' dtype (``BF16``, ``F32``)."""
    if info.quantization is not None:
        return f"Q{info.quantization.bits}"
    dtype = str(info.dtype or "").lower()
    return {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}.get(dtype, dtype.upper())


def _thinks(template: str) -> bool:
    """The chat template switches thinking, or opens it in the generation prompt (a
    template that only shows an earlier turn's reasoning does not count)."""
    if any(word in template for word in ("enable_thinking", "reasoning_effort", "/no_think")):
        return True
    _, found, prompt = template.rpartition("add_generation_prompt")
    return bool(found) and THINK_MARKERS[0] in prompt


def facts_of(target: str | Path, kind: str | None = None) -> ModelFacts:
    """The facts of a model (a store name or alias, a pulled Hub id, a folder), read
    as ``mlxi show`` reads them; ``kind`` (``chat``, ``embedding``, ``reranker``) overrides the
    kind its files say.

    Raises:
        LookupError, ValueError, OSError: The model cannot be found or read.
    """
    from mlx_integrations.models.info import show_model
    from mlx_integrations.models.manifest import model_identity

    info = show_model(target)
    path = Path(info.path)
    kind = kind or info.kind
    stored = _stored_at(path)
    modified = stored or iso_time((path / "config.json").stat().st_mtime)
    arch = info.architecture or ""
    template = info.chat_template or ""
    if kind in ("embedding", "reranker"):
        capabilities = ["embedding"] if kind == "embedding" else []  # Ollama names no rerank
    else:
        capabilities = ["completion"]
        if info.template_takes_tools:
            capabilities.append("tools")
        if info.vision:
            capabilities.append("vision")
        if _thinks(template):
            capabilities.append("thinking")
    parameters: dict[str, Any] = {}
    defaults = info.generation
    if defaults is not None:
        for key, value in (
            ("temperature", defaults.temperature),
            ("top_p", defaults.top_p),
            ("top_k", defaults.top_k),
            ("min_p", defaults.min_p),
            ("repeat_penalty", defaults.repetition_penalty),
        ):
            if value is not None:
                parameters[key] = value
    model_info: dict[str, Any] = {"general.architecture": arch}
    if info.parameters:
        model_info["general.parameter_count"] = info.parameters
    if info.context_length:
        model_info[f"{arch or 'general'}.context_length"] = info.context_length
    details = wire.ModelDetails(
        family=arch,
        families=[arch] if arch else None,
        parameter_size=_count(info.parameters),
        quantization_level=_level(info),
    )
    return ModelFacts(
        path=path,
        size=info.size_bytes,
        digest=model_identity(path),
        modified_at=modified,
        details=details,
        capabilities=capabilities,
        template=template,
        parameters=parameters,
        model_info=model_info,
    )


def _stored_at(path: Path) -> str | None:
    """When the store made the model (its manifest's date), RFC 3339; None outside it."""
    from mlx_integrations.models.manifest import Manifest

    try:
        created = Manifest.read(path).created_at
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not created:
        return None
    return created.replace("+00:00", "Z")
