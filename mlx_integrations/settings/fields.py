"""The checks that the adapters' settings share: sampling fields as the engines check them,
and constructor arguments that no field takes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from mlx_integrations.chat.fields import (
    RequestTypeError,
    Sampling,
    check_max_tokens,
    check_stop,
    check_timeout,
)

__all__ = [
    "check_timeout",
    "model_field_names",
    "plain_type_errors",
    "reject_unknown_fields",
    "validate_adapter_settings",
]


@contextmanager
def plain_type_errors() -> Iterator[None]:
    """Inside a pydantic validator: a wrong type stays a ``TypeError``.

    Pydantic wraps a ``ValueError`` into its ``ValidationError``, and a
    :class:`~mlx_integrations.chat.request.RequestTypeError` is both, so it would be
    wrapped; a field of the wrong type raises a plain ``TypeError``, as it always has.
    """
    try:
        yield
    except RequestTypeError as exc:
        raise TypeError(str(exc)) from None


def validate_adapter_settings(adapter: Any) -> None:
    """Check an adapter's (``ChatMLX``/``MLXLLM``) sampling fields as a request's are
    checked (:class:`~mlx_integrations.chat.request.Sampling`).

    Raises:
        RequestError: A value out of range or not finite (a ``ValueError``), or of the
            wrong type (also a ``TypeError``), naming the field.
    """
    with plain_type_errors():
        check_max_tokens(adapter.max_tokens)
        check_stop(adapter.stop)
        Sampling.check(
            adapter.temperature,
            adapter.top_p,
            top_k=adapter.top_k,
            min_p=adapter.min_p,
            repetition_penalty=adapter.repetition_penalty,
            seed=adapter.seed,
        )


def reject_unknown_fields(adapter: str, data: Any, known: set[str]) -> None:
    """Refuse constructor arguments an adapter has no field for, instead of dropping them.

    A name another library uses (Ollama's ``num_predict``, Hugging Face's
    ``max_new_tokens``...) gets a pointer to ours, from :data:`FOREIGN_NAMES`.

    Raises:
        ValueError: Naming the unknown fields, what to use instead, and the known ones.
    """
    if not isinstance(data, Mapping):
        return
    unknown = sorted(str(k) for k in data if k not in known)
    if not unknown:
        return
    hints = [hint for name in unknown if (hint := foreign_name_hint(name, known))]
    if "n" in unknown:
        hints.append(
            f"{adapter} makes one generation per call; for several, call it several "
            "times (batch) with temperature > 0."
        )
    hint = "".join(f" {h}" if h.endswith(".") else f" {h}." for h in hints)
    raise ValueError(
        f"{adapter} got unknown field(s) {unknown}.{hint} Known fields: {sorted(known)}"
    )


@dataclass(frozen=True)
class ForeignName:
    """What one setting of another library is called here, or why there is none.

    Attributes:
        whose: The libraries that use the name, as the message says it (``"Ollama's"``).
        use: Our equivalents, each ``"field"`` or ``"field=example"``; the first field the
            adapter has is named (the chat and embedding adapters differ).
        otherwise: The honest answer when the adapter has none of them.
        needs: A field the adapter must have for the row to apply at all
            (``"temperature"``: a chat setting; ``"normalize"``: an embedding one).
    """

    whose: str
    use: tuple[str, ...] = ()
    otherwise: str = ""
    needs: str = ""


_OLLAMA = "Ollama's"
_LLAMA_CPP = "llama.cpp's"
_OPENAI = "OpenAI's"
_HF = "Hugging Face transformers'"
_LLAMA_INDEX = "LlamaIndex's"
_LANGCHAIN = "LangChain's"
_ST = "sentence-transformers'"
_MLX_EMBEDDINGS = "MLXEmbeddings' (LangChain)"

_NO_SERVER = (
    "no equivalent: the model runs in this process, with no server to reach; "
    "give model= a folder, a store name (mlxi list) or a pulled Hub id"
)
_CONTEXT = (
    "no equivalent: the context window is the model's own (max_position_embeddings in "
    "its config.json); a longer prompt is refused with ValueError"
)
_GPU_LAYERS = (
    "no equivalent: MLX runs the whole model on its default device (the GPU where there "
    "is one), with no layers to offload"
)
_THREADS = "no equivalent: MLX and its BLAS choose their CPU threads"
_REPEAT_WINDOW = "no equivalent: repetition_penalty looks at the last 20 tokens"
_SAMPLING = "no equivalent: sample with temperature, top_p, top_k and min_p"
_PENALTY = "no equivalent field: use repetition_penalty (> 1 discourages repeats)"
_CHAT = "temperature"  # rows about generating text
_EMBEDDING = "normalize"  # rows about embedding it
_PREFILL = "engine_options={'prefill_step_size': N}"
_AS_FIELDS = (
    "no equivalent: pass each setting as a field (temperature=..., top_k=..., "
    "max_tokens=...); engine settings go in engine_options"
)
_DEVICE = "no equivalent: MLX runs on its default device (the GPU where there is one)"
_STRUCTURED = (
    "no equivalent field: use with_structured_output(schema), or bind(response_format="
    "{'type': 'json_object'})"
)

FOREIGN_NAMES: dict[str, ForeignName] = {
    # Ollama (ChatOllama, OllamaEmbeddings, LlamaIndex's Ollama and OllamaEmbedding)
    "num_predict": ForeignName(_OLLAMA, ("max_tokens",)),
    "num_ctx": ForeignName(_OLLAMA, ("context_window", "max_length"), _CONTEXT),
    "repeat_penalty": ForeignName(_OLLAMA, ("repetition_penalty",)),
    "repeat_last_n": ForeignName(_OLLAMA, (), _REPEAT_WINDOW, _CHAT),
    "num_gpu": ForeignName(_OLLAMA, (), _GPU_LAYERS),
    "num_thread": ForeignName(_OLLAMA, (), _THREADS),
    "num_batch": ForeignName(_OLLAMA, (_PREFILL,)),
    "mirostat": ForeignName(_OLLAMA, (), _SAMPLING, _CHAT),
    "mirostat_eta": ForeignName(_OLLAMA, (), _SAMPLING, _CHAT),
    "mirostat_tau": ForeignName(_OLLAMA, (), _SAMPLING, _CHAT),
    "tfs_z": ForeignName(_OLLAMA, (), _SAMPLING, _CHAT),
    "format": ForeignName(_OLLAMA, ("response_format",), _STRUCTURED, _CHAT),
    "json_mode": ForeignName(_LLAMA_INDEX, ("response_format={'type': 'json_object'}",)),
    "think": ForeignName(_OLLAMA, ("reasoning",)),
    "thinking": ForeignName(_LLAMA_INDEX, ("reasoning",)),
    "base_url": ForeignName(f"{_OLLAMA} and {_OPENAI}", (), _NO_SERVER),
    "client_kwargs": ForeignName(_OLLAMA, (), _NO_SERVER),
    "request_timeout": ForeignName(_LLAMA_INDEX, ("timeout",)),
    "additional_kwargs": ForeignName(_LLAMA_INDEX, (), _AS_FIELDS),
    "ollama_additional_kwargs": ForeignName(_LLAMA_INDEX, (), _AS_FIELDS),
    # llama.cpp (LlamaCpp, LlamaIndex's LlamaCPP)
    "n_ctx": ForeignName(_LLAMA_CPP, ("context_window", "max_length"), _CONTEXT),
    "n_gpu_layers": ForeignName(_LLAMA_CPP, (), _GPU_LAYERS),
    "n_threads": ForeignName(_LLAMA_CPP, (), _THREADS),
    "n_batch": ForeignName(_LLAMA_CPP, (_PREFILL,)),
    "model_path": ForeignName(_LLAMA_CPP, ("model", "model_name")),
    "last_n_tokens_size": ForeignName(_LLAMA_CPP, (), _REPEAT_WINDOW, _CHAT),
    # OpenAI and LangChain
    "model_name": ForeignName(f"{_OPENAI} and {_LANGCHAIN}", ("model",)),
    "max_completion_tokens": ForeignName(_OPENAI, ("max_tokens",)),
    "frequency_penalty": ForeignName(_OPENAI, (), _PENALTY, _CHAT),
    "presence_penalty": ForeignName(_OPENAI, (), _PENALTY, _CHAT),
    "logit_bias": ForeignName(
        _OPENAI, (), "no equivalent field: pass logits_processors= in a call", _CHAT
    ),
    "api_base": ForeignName(_OPENAI, (), _NO_SERVER),
    "openai_api_base": ForeignName(_OPENAI, (), _NO_SERVER),
    "openai_api_key": ForeignName(_OPENAI, (), "no equivalent: a local model needs no key"),
    "max_retries": ForeignName(
        _OPENAI, (), "no equivalent: a local call has no network to retry over"
    ),
    "model_kwargs": ForeignName(f"{_OPENAI} and {_HF}", (), _AS_FIELDS),
    "dimensions": ForeignName(
        _OPENAI,
        (),
        "no equivalent: the model's dimension is fixed (see .info.dimension)",
        _EMBEDDING,
    ),
    # Hugging Face (transformers' generate, HuggingFacePipeline, HuggingFaceLLM)
    "max_new_tokens": ForeignName(_HF, ("max_tokens",)),
    "max_length": ForeignName(_HF, ("max_tokens",), needs=_CHAT),
    "model_id": ForeignName(_HF, ("model", "model_name")),
    "tokenizer_name": ForeignName(
        _HF, (), "no equivalent: the tokenizer is the one in the model's folder"
    ),
    "do_sample": ForeignName(
        _HF, (), "no equivalent: temperature=0 is greedy, above 0 samples", _CHAT
    ),
    "num_beams": ForeignName(_HF, (), "no equivalent: beam search is not implemented", _CHAT),
    "generate_kwargs": ForeignName(_HF, (), _AS_FIELDS),
    "pipeline_kwargs": ForeignName(_HF, (), _AS_FIELDS),
    "device": ForeignName(_HF, (), _DEVICE),
    "device_map": ForeignName(_HF, (), _DEVICE),
    "context_window": ForeignName(_LLAMA_INDEX, ("max_length",), _CONTEXT),
    # Embeddings (HuggingFaceEmbeddings, sentence-transformers, and each other's names)
    "model": ForeignName(f"{_OLLAMA} and {_OPENAI}", ("model_name",)),
    "encode_kwargs": ForeignName(
        _LANGCHAIN,
        (),
        "no equivalent: pass its settings as fields (normalize=..., max_length=..., "
        "and the batch size)",
        _EMBEDDING,
    ),
    "normalize_embeddings": ForeignName(_ST, ("normalize",)),
    "max_seq_length": ForeignName(_ST, ("max_length",)),
    "cache_folder": ForeignName(
        _LANGCHAIN,
        (),
        "no equivalent: models come from the mlxi store (MLXI_HOME) or the Hugging Face "
        "cache (HF_HOME); see mlxi pull",
    ),
    "embed_batch_size": ForeignName(_LLAMA_INDEX, ("batch_size",)),
    "batch_size": ForeignName(_MLX_EMBEDDINGS, ("embed_batch_size",)),
    "query_instruction": ForeignName(_LLAMA_INDEX, ("query_prompt",)),
    "text_instruction": ForeignName(_LLAMA_INDEX, ("document_prompt",)),
    "embed_instruction": ForeignName(_LANGCHAIN, ("document_prompt", "text_instruction")),
    "query_prompt": ForeignName(_MLX_EMBEDDINGS, ("query_instruction",)),
    "document_prompt": ForeignName(_MLX_EMBEDDINGS, ("text_instruction",)),
}
"""Settings of other libraries, by name: where ours is, or the honest answer.

Add a row when a user tries another library's name; a row whose ``use`` field the
adapter lacks gives its ``otherwise`` (or nothing, when that is empty)."""


def foreign_name_hint(name: str, known: set[str]) -> str | None:
    """``"num_predict is Ollama's name; use max_tokens"`` for a name another library uses,
    naming the first equivalent the adapter has (``known``); None for a name no library
    in :data:`FOREIGN_NAMES` uses."""
    entry = FOREIGN_NAMES.get(name)
    if entry is None or (entry.needs and entry.needs not in known):
        return None
    for use in entry.use:
        if use.split("=", 1)[0] in known:
            return f"{name} is {entry.whose} name; use {use}"
    if entry.otherwise:
        return f"{name} is {entry.whose} name; {entry.otherwise}"
    return None


def model_field_names(model_cls: Any) -> set[str]:
    """A pydantic model's field names and aliases (what its constructor accepts)."""
    names: set[str] = set()
    for name, info in model_cls.model_fields.items():
        names.add(name)
        for alias in (info.alias, info.validation_alias):
            if isinstance(alias, str):
                names.add(alias)
    return names
