"""Another library's name for a setting (Ollama's ``num_predict``, Hugging Face's
``max_new_tokens``...) is refused with a pointer to ours, or the honest answer that
there is none, by the chat and the embedding adapters alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_integrations.settings.fields import FOREIGN_NAMES, model_field_names


@pytest.fixture(scope="module")
def minilm_path() -> Path:
    from tests.support.minilm import ensure_minilm

    return ensure_minilm()


def adapter(name: str) -> type:
    if name == "ChatMLX":
        from mlx_integrations.langchain import ChatMLX

        return ChatMLX
    if name == "MLXLLM":
        from mlx_integrations.llama_index import MLXLLM

        return MLXLLM
    if name == "MLXEmbeddings":
        from mlx_integrations.langchain import MLXEmbeddings

        return MLXEmbeddings
    from mlx_integrations.llama_index import MLXEmbedding

    return MLXEmbedding


def refusal(name: str, path: Path, **fields: object) -> str:
    cls = adapter(name)
    key = "model_name" if name.startswith("MLXEmbedding") else "model"
    given = {key: str(path)}
    with pytest.raises(ValueError, match=rf"{name} got unknown field\(s\)") as info:
        cls(**given, **fields)
    assert "Known fields:" in str(info.value)
    return str(info.value)


CHAT = [
    ("num_predict", 64, "num_predict is Ollama's name; use max_tokens"),
    ("repeat_penalty", 1.1, "repeat_penalty is Ollama's name; use repetition_penalty"),
    ("num_gpu", 99, "num_gpu is Ollama's name; no equivalent: MLX runs the whole model"),
    ("num_thread", 8, "num_thread is Ollama's name; no equivalent: MLX and its BLAS"),
    ("repeat_last_n", 64, "repeat_last_n is Ollama's name; no equivalent: repetition_penalty"),
    ("mirostat", 2, "mirostat is Ollama's name; no equivalent: sample with temperature"),
    ("base_url", "http://localhost:11434", "base_url is Ollama's and OpenAI's name; no equiv"),
    ("think", True, "think is Ollama's name; use reasoning"),
    ("num_batch", 512, "num_batch is Ollama's name; use engine_options={'prefill_step_size': N}"),
    ("max_new_tokens", 64, "max_new_tokens is Hugging Face transformers' name; use max_tokens"),
    ("n_ctx", 4096, "n_ctx is llama.cpp's name; "),
    ("n_gpu_layers", -1, "n_gpu_layers is llama.cpp's name; no equivalent: MLX runs"),
    ("max_completion_tokens", 64, "max_completion_tokens is OpenAI's name; use max_tokens"),
    ("frequency_penalty", 0.5, "no equivalent field: use repetition_penalty"),
    ("request_timeout", 30.0, "request_timeout is LlamaIndex's name; use timeout"),
]


@pytest.mark.parametrize("name", ["ChatMLX", "MLXLLM"])
@pytest.mark.parametrize(("field", "value", "pointer"), CHAT)
def test_chat_adapters_point_to_their_field(tiny_llama: Path, name, field, value, pointer):
    assert pointer in refusal(name, tiny_llama, **{field: value})


@pytest.mark.parametrize(
    ("name", "field", "pointer"),
    [
        # Where the adapters differ, each names its own field or says there is none.
        ("ChatMLX", "num_ctx", "num_ctx is Ollama's name; no equivalent: the context window"),
        ("MLXLLM", "num_ctx", "num_ctx is Ollama's name; use context_window"),
        ("ChatMLX", "format", "format is Ollama's name; no equivalent field: use with_structured"),
        ("MLXLLM", "format", "format is Ollama's name; use response_format"),
        ("MLXLLM", "model_name", "model_name is OpenAI's and LangChain's name; use model"),
        ("MLXLLM", "json_mode", "use response_format={'type': 'json_object'}"),
        ("ChatMLX", "context_window", "context_window is LlamaIndex's name; no equivalent"),
    ],
)
def test_the_pointer_fits_the_adapter(tiny_llama: Path, name, field, pointer):
    assert pointer in refusal(name, tiny_llama, **{field: 1})


EMBEDDINGS = [
    ("MLXEmbeddings", "model", "x", "model is Ollama's and OpenAI's name; use model_name"),
    ("MLXEmbeddings", "num_ctx", 512, "num_ctx is Ollama's name; use max_length"),
    ("MLXEmbeddings", "normalize_embeddings", True, "sentence-transformers' name; use normalize"),
    ("MLXEmbedding", "batch_size", 8, "batch_size is MLXEmbeddings' (LangChain) name; use embed"),
    ("MLXEmbeddings", "embed_batch_size", 8, "LlamaIndex's name; use batch_size"),
    ("MLXEmbeddings", "query_instruction", "q: ", "LlamaIndex's name; use query_prompt"),
    ("MLXEmbedding", "query_prompt", "q: ", "use query_instruction"),
    ("MLXEmbeddings", "max_seq_length", 128, "sentence-transformers' name; use max_length"),
    ("MLXEmbedding", "dimensions", 256, "no equivalent: the model's dimension is fixed"),
]


@pytest.mark.parametrize(("name", "field", "value", "pointer"), EMBEDDINGS)
def test_embedding_adapters_point_to_their_field(minilm_path: Path, name, field, value, pointer):
    assert pointer in refusal(name, minilm_path, **{field: value})


@pytest.mark.parametrize("name", ["MLXEmbeddings", "MLXEmbedding"])
def test_chat_settings_get_no_pointer_from_an_embedder(minilm_path: Path, name):
    # num_predict means max_tokens, which an embedder has not; mirostat is about sampling.
    message = refusal(name, minilm_path, num_predict=5, mirostat=1)
    assert "unknown field(s) ['mirostat', 'num_predict']. Known fields:" in message


def test_every_pointer_names_a_real_field():
    fields = set().union(
        *(
            model_field_names(adapter(n))
            for n in ("ChatMLX", "MLXLLM", "MLXEmbeddings", "MLXEmbedding")
        )
    )
    for foreign, entry in FOREIGN_NAMES.items():
        assert entry.use or entry.otherwise, foreign
        for use in entry.use:
            assert use.split("=", 1)[0] in fields, (foreign, use)
        assert entry.needs in ("", *fields), foreign
