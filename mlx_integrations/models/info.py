"""What ``mlxi show`` reports about a model, read from its files without loading weights."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlx_integrations.models.errors import ModelNotFoundError
from mlx_integrations.models.folders import read_json_object
from mlx_integrations.models.hub.pull import dtype_of, quantization_of
from mlx_integrations.models.manifest import FileEntry, Manifest, ModelSource, QuantizationInfo
from mlx_integrations.models.names import is_valid_name
from mlx_integrations.models.quality.report import QuantizationQuality
from mlx_integrations.models.resolve import ModelKind, model_kind, resolve_model
from mlx_integrations.models.store import ModelStore, default_store

_CONTEXT_KEYS = (
    "max_position_embeddings",
    "max_sequence_length",
    "seq_length",
    "n_ctx",
    "max_seq_len",
    "model_max_length",
)


@dataclass(frozen=True)
class GenerationDefaults:
    """The sampling defaults a model ships in ``generation_config.json``.

    Each is None where the file does not set it. The engines sample with the values
    each request passes (``mlxi run --temperature``, the adapters' fields), not these.

    Attributes:
        temperature: Sampling temperature.
        top_p: Nucleus sampling mass.
        top_k: Candidates kept per step.
        min_p: Smallest probability kept, relative to the top token's.
        repetition_penalty: Penalty on tokens already generated.
        max_new_tokens: Longest answer.
        do_sample: False where the model's authors decode greedily.
        eos_token_ids: Tokens that end an answer.
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None
    do_sample: bool | None = None
    eos_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class ModelInfo:
    """A model's facts.

    Attributes:
        name: Store name (or the path given).
        path: Its folder.
        architecture: ``model_type`` of config.json.
        parameters: Parameter count (quantized weights counted unpacked).
        context_length: Longest context the config declares.
        dtype: Dtype of the unquantized weights.
        quantization: Bits, group size, mode, recipe; None when not quantized.
        size_bytes: Bytes of the model files.
        template_takes_tools: True when rendering the chat template with a tool shows it.
        source: Where it came from (None outside the store).
        files: Files with their sha256 (sha256 empty outside the store).
        aliases: Other names of the model.
        warm_caches: Names of stored prefix caches.
        in_use_by: Processes that have the model loaded (store models only).
        vision: A vision-language model (it takes images; config.json has a
            ``vision_config``), served through mlx-vlm.
        chat_template: The chat template the tokenizer renders conversations with
            (``chat_template.jinja``, else ``chat_template`` of tokenizer_config.json);
            None when the model has none.
        chat_template_file: The file ``chat_template`` was read from.
        generation: Defaults of ``generation_config.json``; None without that file.
        quality: What quantization cost, measured when ``mlxi quantize`` made the model
            (None otherwise).
        kind: ``chat``, ``embedding`` or ``reranker`` (see
            :func:`~mlx_integrations.models.resolve.model_kind`).
    """

    name: str
    path: str
    architecture: str | None
    parameters: int | None
    context_length: int | None
    dtype: str | None
    quantization: QuantizationInfo | None
    size_bytes: int
    template_takes_tools: bool | None
    source: ModelSource | None
    files: tuple[FileEntry, ...]
    aliases: tuple[str, ...] = ()
    warm_caches: tuple[str, ...] = ()
    in_use_by: tuple[int, ...] = ()
    vision: bool = False
    chat_template: str | None = None
    chat_template_file: str | None = None
    generation: GenerationDefaults | None = None
    quality: QuantizationQuality | None = None
    kind: ModelKind = "chat"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data for ``mlxi show --json``."""
        data = asdict(self)
        data["quality"] = self.quality.to_dict() if self.quality else None  # with its verdict
        return data


def show_model(name: str | Path, *, store: ModelStore | None = None) -> ModelInfo:
    """Describe a stored model, or any model folder.

    Examples:
        >>> show_model("qwen3-4b-q4").context_length  # doctest: +SKIP
        40960
    """
    store = store or default_store()
    manifest: Manifest | None = None
    aliases: tuple[str, ...] = ()
    users: tuple[int, ...] = ()
    if isinstance(name, str) and is_valid_name(name) and store.contains(name):
        stored = store.get(name)
        path, manifest, aliases, shown = stored.path, stored.manifest, stored.aliases, stored.name
        users = store.users(stored.name)
    else:
        path, shown = resolve_model(name, store=store), str(name)
    config = read_json_object(path / "config.json")
    if not config:
        raise ModelNotFoundError(
            f"{path} has no readable config.json.",
            hint="Pull or import the model again."
            if manifest is not None
            else "Pass a model folder (config.json + *.safetensors) or a .gguf file.",
        )
    if manifest is not None:
        files = manifest.files
    else:
        files = tuple(
            FileEntry(p.name, p.stat().st_size, "") for p in sorted(path.iterdir()) if p.is_file()
        )
    text_config: dict[str, Any] = (
        config["text_config"] if isinstance(config.get("text_config"), dict) else {}
    )
    quant = manifest.quantization if manifest and manifest.quantization else quantization_of(config)
    templates, template_file = chat_templates(path)
    return ModelInfo(
        name=shown,
        path=str(path),
        architecture=config.get("model_type"),
        parameters=count_parameters(path, config),
        context_length=_context_length(config, text_config),
        dtype=(manifest.dtype if manifest else None) or dtype_of(config),
        quantization=quant,
        size_bytes=sum(f.size for f in files),
        template_takes_tools=template_takes_tools(path),
        source=manifest.source if manifest else None,
        files=files,
        aliases=aliases,
        warm_caches=tuple(sorted(p.stem for p in (path / "warm").glob("*.safetensors"))),
        in_use_by=users,
        vision=isinstance(config.get("vision_config"), dict),
        chat_template=templates.get("default"),
        chat_template_file=template_file if "default" in templates else None,
        generation=generation_defaults(path),
        quality=manifest.quality if manifest else None,
        kind=model_kind(path),
    )


def _context_length(config: dict[str, Any], text_config: dict[str, Any]) -> int | None:
    for cfg in (config, text_config):
        for key in _CONTEXT_KEYS:
            if isinstance(cfg.get(key), int):
                return int(cfg[key])
    return None


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (names, dtypes and shapes)."""
    with open(path, "rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(length))


def count_parameters(path: Path, config: dict[str, Any]) -> int | None:
    """Count parameters from safetensors headers; packed quantized weights are unpacked."""
    quant = config.get("quantization") or {}
    default_bits = int(quant.get("bits", 0)) if isinstance(quant, dict) else 0
    total = 0
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        return None
    for file in files:
        try:
            header = safetensors_header(file)
        except (OSError, ValueError, struct.error):
            return None
        header.pop("__metadata__", None)
        for key, meta in header.items():
            if key.endswith((".scales", ".biases")) and key.rsplit(".", 1)[0] + ".weight" in header:
                continue
            n = math.prod(meta.get("shape", []))
            module = key.rsplit(".", 1)[0]
            if meta.get("dtype") == "U32" and f"{module}.scales" in header:
                layer = quant.get(module) if isinstance(quant, dict) else None
                bits = layer.get("bits", default_bits) if isinstance(layer, dict) else default_bits
                n = n * 32 // bits if bits else n
            total += n
    return total


def chat_templates(path: Path) -> tuple[dict[str, str], str | None]:
    """A model's chat templates by name (``default`` for the plain one), and their file.

    Read as transformers reads them: ``chat_template.jinja`` wins over the
    ``chat_template`` of tokenizer_config.json, which is a string or a list of named
    templates; a vision model's processor may keep it in ``chat_template.json``.
    Returns ``({}, None)`` when the model has none.
    """
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        return {"default": jinja_file.read_text(encoding="utf-8")}, jinja_file.name
    template = read_json_object(path / "tokenizer_config.json").get("chat_template")
    if isinstance(template, str):
        return {"default": template}, "tokenizer_config.json"
    if isinstance(template, list):
        named = {
            str(t["name"]): t["template"]
            for t in template
            if isinstance(t, dict) and isinstance(t.get("template"), str) and t.get("name")
        }
        if named:
            return named, "tokenizer_config.json"
    processor = read_json_object(path / "chat_template.json").get("chat_template")
    if isinstance(processor, str):
        return {"default": processor}, "chat_template.json"
    return {}, None


def generation_defaults(path: Path) -> GenerationDefaults | None:
    """The sampling defaults of ``generation_config.json``; None without that file."""
    file = path / "generation_config.json"
    if not file.is_file():
        return None
    data = read_json_object(file)

    def number(key: str, kind: type[int] | type[float]) -> Any:
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if kind is int and not float(value).is_integer():
            return None  # a top_k of 2.5 is no count
        return kind(value)

    eos = data.get("eos_token_id")
    eos_ids = [eos] if isinstance(eos, int) else eos if isinstance(eos, list) else []
    do_sample = data.get("do_sample")
    return GenerationDefaults(
        temperature=number("temperature", float),
        top_p=number("top_p", float),
        top_k=number("top_k", int),
        min_p=number("min_p", float),
        repetition_penalty=number("repetition_penalty", float),
        max_new_tokens=number("max_new_tokens", int),
        do_sample=do_sample if isinstance(do_sample, bool) else None,
        eos_token_ids=tuple(i for i in eos_ids if isinstance(i, int) and not isinstance(i, bool)),
    )


def template_takes_tools(path: Path) -> bool | None:
    """Render the chat template with one tool; True when the tool's name shows up.

    Returns None when the model has no chat template.
    """
    named = chat_templates(path)[0]
    template = named.get("tool_use") or named.get("default")  # as transformers picks
    if template is None:
        return None
    probe = "mlxi_probe_tool_7f3a"
    tool = {
        "type": "function",
        "function": {
            "name": probe,
            "description": "probe",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise ValueError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, indent=indent)
        text = env.from_string(template).render(
            messages=[{"role": "user", "content": "hi"}],
            tools=[tool],
            add_generation_prompt=True,
            bos_token="",
            eos_token="",
        )
    except Exception:
        return "tools" in template
    return probe in text
