"""GGUF import: tiny GGUF files written here, and the real SmolLM2-135M-Instruct."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from mlx.utils import tree_flatten
from mlx_lm import generate
from mlx_lm import load as mlx_lm_load
from mlx_lm.models import llama

from mlx_integrations.models.gguf.convert import import_gguf, read_gguf_header
from tests.support.signals import with_default_sigint
from tests.support.tiny_models import CHATML_TOOLS_TEMPLATE, SPECIAL_TOKENS, train_tokenizer

N_HEADS, N_KV_HEADS = 4, 2

# Hugging Face / mlx-lm names -> GGUF names, as llama.cpp's converter writes them.
_TO_GGUF = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}

TEXTS = [
    "Hello, world! The capital of France is Paris.",
    "café naïve Ünïcödé ß",
    "東京タワー、Привет",
    "emoji 👋🏽🎉 and ★ ✓",
    '  code:\n\tdef f(x):\n\t\treturn {"a": [1, 2.5e-3]}\n\n',
]


def gguf_name(hf_name: str) -> str:
    """The GGUF tensor name llama.cpp gives an mlx-lm llama weight."""
    fixed = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf_name in fixed:
        return fixed[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    return f"blk.{layer}.{_TO_GGUF[rest.removesuffix('.weight')]}.weight"


def llamacpp_permute(w: mx.array, n_heads: int) -> mx.array:
    """Q/K row order of llama.cpp: the two halves of each head's rows, interleaved."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def u32(value: int) -> mx.array:
    return mx.array(value, dtype=mx.uint32)


@pytest.fixture(scope="module")
def tiny_tokenizer():
    return train_tokenizer()


def write_tiny_gguf(
    path: Path,
    tokenizer: Any,
    *,
    tie: bool = True,
    drop: tuple[str, ...] = (),
    metadata_overrides: dict[str, Any] | None = None,
) -> llama.Model:
    """Write a random tiny llama as llama.cpp would, and return the source model."""
    vocab_size = tokenizer.get_vocab_size()
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=96,
        num_attention_heads=N_HEADS,
        num_key_value_heads=N_KV_HEADS,
        rms_norm_eps=1e-5,
        vocab_size=vocab_size,
        rope_theta=50000.0,
        tie_word_embeddings=tie,
        max_position_embeddings=1024,
    )
    mx.random.seed(7)
    model = llama.Model(args)
    weights = dict(tree_flatten(model.parameters()))
    # Norms away from 1, so that swapping two of them changes the logits.
    for name in weights:
        if name.endswith("norm.weight"):
            weights[name] = 1.0 + 0.2 * mx.random.normal(weights[name].shape)
    model.load_weights(list(weights.items()))

    tensors = {}
    for name, w in weights.items():
        if "q_proj" in name:
            w = llamacpp_permute(w, N_HEADS)
        elif "k_proj" in name:
            w = llamacpp_permute(w, N_KV_HEADS)
        tensors[gguf_name(name)] = w
    for name in drop:
        del tensors[name]

    by_id = {i: t for t, i in tokenizer.get_vocab(with_added_tokens=True).items()}
    tokens = [by_id[i] for i in range(vocab_size)]
    merges = [" ".join(m) for m in json.loads(tokenizer.to_str())["model"]["merges"]]
    types = [3 if t in SPECIAL_TOKENS else 1 for t in tokens]
    metadata: dict[str, Any] = {
        "general.architecture": "llama",
        "general.name": "tiny",
        "llama.embedding_length": u32(64),
        "llama.block_count": u32(2),
        "llama.feed_forward_length": u32(96),
        "llama.attention.head_count": u32(N_HEADS),
        "llama.attention.head_count_kv": u32(N_KV_HEADS),
        "llama.attention.layer_norm_rms_epsilon": mx.array(1e-5, dtype=mx.float32),
        "llama.rope.freq_base": mx.array(50000.0, dtype=mx.float32),
        "llama.rope.dimension_count": u32(16),
        "llama.context_length": u32(1024),
        "llama.vocab_size": u32(vocab_size),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": u32(tokens.index("<|endoftext|>")),
        "tokenizer.ggml.eos_token_id": u32(tokens.index("<|im_end|>")),
        "tokenizer.ggml.padding_token_id": u32(tokens.index("<|endoftext|>")),
        "tokenizer.ggml.add_bos_token": mx.array(False),
        "tokenizer.chat_template": CHATML_TOOLS_TEMPLATE,
    }
    metadata.update(metadata_overrides or {})
    mx.save_gguf(str(path), tensors, metadata)
    return model


def load(path: str) -> tuple[Any, Any]:
    """``mlx_lm.load``: (model, tokenizer)."""
    loaded: Any = mlx_lm_load(path)
    return loaded[0], loaded[1]


def load_arrays(path: Path) -> dict[str, Any]:
    """``mx.load`` of a safetensors file."""
    loaded: Any = mx.load(str(path))
    return loaded


def gguf_metadata(path: Path) -> dict[str, Any]:
    """The metadata of a GGUF file as ``mx.load`` reads it (independent of our reader)."""
    loaded: Any = mx.load(str(path), return_metadata=True)
    return loaded[1]


def logits(model: Any, ids: list[int]) -> np.ndarray:
    out = model(mx.array([ids]))
    return np.array(out.astype(mx.float32))


def leftovers(folder: Path) -> list[str]:
    """Hidden build or replaced folders the importer left behind."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# ---------------------------------------------------------------- tiny GGUF files


def test_our_permutation_is_the_one_mlx_lm_export_writes():
    from mlx_lm.gguf import permute_weights

    w = mx.arange(8 * 16 * 3, dtype=mx.float32).reshape(8 * 16, 3)
    assert mx.array_equal(llamacpp_permute(w, 8), permute_weights(w, 8, 8))
    k = w[: 2 * 16]
    assert mx.array_equal(llamacpp_permute(k, 2), permute_weights(k, 8, 2))


def test_config_comes_from_metadata(tmp_path, tiny_tokenizer):
    write_tiny_gguf(tmp_path / "tiny.gguf", tiny_tokenizer)
    out = import_gguf(tmp_path / "tiny.gguf", tmp_path / "model")

    config = json.loads((out / "config.json").read_text())
    vocab = tiny_tokenizer.get_vocab()
    assert config["model_type"] == "llama"
    assert config["hidden_size"] == 64
    assert config["intermediate_size"] == 96
    assert config["num_hidden_layers"] == 2
    assert config["num_attention_heads"] == N_HEADS
    assert config["num_key_value_heads"] == N_KV_HEADS
    assert config["head_dim"] == 16
    assert config["rope_theta"] == 50000.0
    assert config["rms_norm_eps"] == 1e-5  # the float32 value, written back as 1e-05
    assert config["vocab_size"] == tiny_tokenizer.get_vocab_size()
    assert config["max_position_embeddings"] == 1024
    assert config["tie_word_embeddings"] is True
    assert config["bos_token_id"] == vocab["<|endoftext|>"]
    assert config["eos_token_id"] == vocab["<|im_end|>"]
    assert config["torch_dtype"] == "float32"
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == vocab["<|im_end|>"]
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tokenizer_config["eos_token"] == "<|im_end|>"
    assert tokenizer_config["pad_token"] == "<|endoftext|>"
    assert tokenizer_config["chat_template"] == CHATML_TOOLS_TEMPLATE
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_imported_model_gives_the_source_logits(tmp_path, tiny_tokenizer, tie):
    source = write_tiny_gguf(tmp_path / "tiny.gguf", tiny_tokenizer, tie=tie)
    out = import_gguf(tmp_path / "tiny.gguf", tmp_path / "model")

    model, _ = load(str(out))
    assert ("lm_head" in model) is (not tie)
    ids = tiny_tokenizer.encode(TEXTS[0]).ids
    np.testing.assert_allclose(logits(model, ids), logits(source, ids), rtol=1e-5, atol=1e-5)


def test_permuted_qk_would_change_the_logits(tiny_tokenizer, tmp_path):
    # The logits comparison above can only pass if the import undoes the permutation.
    source = write_tiny_gguf(tmp_path / "tiny.gguf", tiny_tokenizer)
    permuted = llama.Model(source.args)
    weights = dict(tree_flatten(source.parameters()))
    for name, w in weights.items():
        if "q_proj" in name or "k_proj" in name:
            weights[name] = llamacpp_permute(w, N_HEADS if "q_proj" in name else N_KV_HEADS)
    permuted.load_weights(list(weights.items()))
    ids = tiny_tokenizer.encode(TEXTS[0]).ids
    assert np.abs(logits(permuted, ids) - logits(source, ids)).max() > 1e-2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_import(tmp_path, tiny_tokenizer, dtype):
    source = write_tiny_gguf(tmp_path / "tiny.gguf", tiny_tokenizer)
    out = import_gguf(tmp_path / "tiny.gguf", tmp_path / "model", dtype=dtype)

    saved = load_arrays(out / "model.safetensors")
    assert {v.dtype for v in saved.values()} == {getattr(mx, dtype)}
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == dtype
    model, _ = load(str(out))
    ids = tiny_tokenizer.encode(TEXTS[0]).ids
    np.testing.assert_allclose(logits(model, ids), logits(source, ids), atol=0.1)


def test_tokenizer_encodes_like_the_source(tmp_path, tiny_tokenizer):
    write_tiny_gguf(tmp_path / "tiny.gguf", tiny_tokenizer)
    out = import_gguf(tmp_path / "tiny.gguf", tmp_path / "model")

    _, tokenizer = load(str(out))
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == tiny_tokenizer.encode(text).ids
        assert tokenizer.decode(ids) == text
    for token in SPECIAL_TOKENS:
        assert tokenizer.encode(token, add_special_tokens=False) == [
            tiny_tokenizer.token_to_id(token)
        ]
    assert tokenizer.eos_token_ids == {tiny_tokenizer.token_to_id("<|im_end|>")}


def test_chat_template_renders_like_jinja(tmp_path, tiny_tokenizer):
    write_tiny_gguf(tmp_path / "tiny.gguf", tiny_tokenizer)
    out = import_gguf(tmp_path / "tiny.gguf", tmp_path / "model")

    _, tokenizer = load(str(out))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "And in Rome?"},
    ]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    # The environment chat templates are written for (Hugging Face's and llama.cpp's).
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    expected = env.from_string(CHATML_TOOLS_TEMPLATE).render(
        messages=messages, add_generation_prompt=True
    )
    assert rendered == expected
    assert rendered.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("pre", "pieces"),
    [
        ("gpt-2", ["x", "Ġ12345", "Ġabc"]),
        ("smollm", ["x", "Ġ", "1", "2", "3", "4", "5", "Ġabc"]),
        ("llama-bpe", ["x", "Ġ", "123", "45", "Ġabc"]),
    ],
)
def test_pre_tokenizer_follows_tokenizer_ggml_pre(tmp_path, tiny_tokenizer, pre, pieces):
    write_tiny_gguf(
        tmp_path / "tiny.gguf", tiny_tokenizer, metadata_overrides={"tokenizer.ggml.pre": pre}
    )
    out = import_gguf(tmp_path / "tiny.gguf", tmp_path / "model")

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tokenizer.pre_tokenizer is not None
    split = [piece for piece, _ in tokenizer.pre_tokenizer.pre_tokenize_str("x 12345 abc")]
    assert split == pieces


def test_bos_is_added_when_the_file_asks(tmp_path, tiny_tokenizer):
    flag = {"tokenizer.ggml.add_bos_token": mx.array(True)}
    write_tiny_gguf(tmp_path / "tiny.gguf", tiny_tokenizer, metadata_overrides=flag)
    out = import_gguf(tmp_path / "tiny.gguf", tmp_path / "model")

    _, tokenizer = load(str(out))
    bos = tiny_tokenizer.token_to_id("<|endoftext|>")
    ids = tokenizer.encode("Hello")
    assert ids[0] == bos
    assert ids[1:] == tiny_tokenizer.encode("Hello").ids


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(FileNotFoundError, match=r"nope\.gguf"):
        import_gguf(missing, tmp_path / "model")
    assert not (tmp_path / "model").exists()


def test_folder_instead_of_file(tmp_path):
    with pytest.raises(ValueError, match="is a folder"):
        import_gguf(tmp_path, tmp_path / "model")


def test_not_a_gguf_file(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_text('{"not": "gguf"}')
    with pytest.raises(ValueError, match=r"model\.gguf is not a GGUF file"):
        import_gguf(bogus, tmp_path / "model")
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize("keep", [0.6, 0.001], ids=["in-data", "in-header"])
def test_truncated_file(tmp_path, tiny_tokenizer, keep):
    full = tmp_path / "full.gguf"
    write_tiny_gguf(full, tiny_tokenizer)
    data = full.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: max(24, int(len(data) * keep))])

    with pytest.raises(ValueError, match=r"cut\.gguf is truncated.*Fetch the GGUF file again"):
        import_gguf(cut, tmp_path / "model")
    assert not (tmp_path / "model").exists()
    assert leftovers(tmp_path) == []


def test_unsupported_architecture(tmp_path, tiny_tokenizer):
    write_tiny_gguf(
        tmp_path / "q.gguf", tiny_tokenizer, metadata_overrides={"general.architecture": "qwen2"}
    )
    with pytest.raises(ValueError, match="architecture 'qwen2' is not supported"):
        import_gguf(tmp_path / "q.gguf", tmp_path / "model")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("tokenizer.ggml.model", "llama", "tokenizer model 'llama' is not supported"),
        ("tokenizer.ggml.pre", "qwen2", "pre-tokenizer 'qwen2'"),
        ("llama.rope.scaling.type", "yarn", "RoPE scaling 'yarn'"),
    ],
)
def test_unsupported_tokenizer_or_rope(tmp_path, tiny_tokenizer, key, value, message):
    write_tiny_gguf(tmp_path / "t.gguf", tiny_tokenizer, metadata_overrides={key: value})
    with pytest.raises(ValueError, match=message):
        import_gguf(tmp_path / "t.gguf", tmp_path / "model")
    assert not (tmp_path / "model").exists()


def test_bad_dtype(tmp_path):
    with pytest.raises(ValueError, match="dtype must be one of"):
        import_gguf(tmp_path / "any.gguf", tmp_path / "model", dtype="int8")


def test_failure_after_reading_leaves_nothing(tmp_path, tiny_tokenizer):
    # A missing tensor is found only when the weights are loaded into the model,
    # after the build folder exists: it must be removed again.
    write_tiny_gguf(tmp_path / "t.gguf", tiny_tokenizer, drop=("blk.1.ffn_up.weight",))
    with pytest.raises(ValueError, match="do not fit a llama model"):
        import_gguf(tmp_path / "t.gguf", tmp_path / "model")
    assert not (tmp_path / "model").exists()
    assert leftovers(tmp_path) == []


def test_existing_output_is_kept_unless_overwrite(tmp_path, tiny_tokenizer):
    write_tiny_gguf(tmp_path / "t.gguf", tiny_tokenizer)
    out = tmp_path / "model"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")

    with pytest.raises(FileExistsError, match="overwrite=True"):
        import_gguf(tmp_path / "t.gguf", out)
    assert (out / "mine.txt").read_text() == "keep me"

    import_gguf(tmp_path / "t.gguf", out, overwrite=True)
    assert not (out / "mine.txt").exists()
    assert (out / "config.json").exists()
    assert leftovers(tmp_path) == []


def test_header_reader(tmp_path, tiny_tokenizer):
    write_tiny_gguf(tmp_path / "t.gguf", tiny_tokenizer)
    header = read_gguf_header(tmp_path / "t.gguf")

    assert header.architecture == "llama"
    assert header.metadata["llama.block_count"] == 2
    assert header.metadata["tokenizer.ggml.add_bos_token"] is False
    assert header.metadata["tokenizer.chat_template"] == CHATML_TOOLS_TEMPLATE
    assert header.tensors["blk.0.attn_k.weight"].shape == (N_KV_HEADS * 16, 64)
    assert header.tensors["blk.0.attn_k.weight"].type_name == "F32"


# ---------------------------------------------------------------- SmolLM2-135M-Instruct


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return load(str(smollm2_path))


@pytest.fixture(scope="module")
def smollm2_gguf(smollm2_path) -> Path:
    from tests.support.smollm import ensure_smollm2_gguf

    return ensure_smollm2_gguf()


@pytest.mark.smollm
def test_smollm2_config(smollm2_path):
    config = json.loads((smollm2_path / "config.json").read_text())
    expected = {
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    assert {k: config[k] for k in expected} == expected


@pytest.mark.smollm
def test_smollm2_answers_paris(smollm2):
    model, tokenizer = smollm2
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    answer = generate(model, tokenizer, prompt, max_tokens=30, verbose=False)
    assert "Paris" in answer


@pytest.mark.smollm
def test_smollm2_tokenizer_round_trip(smollm2):
    _, tokenizer = smollm2
    for text in [*TEXTS, "<|im_start|>user\nhi<|im_end|>\n"]:
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    assert tokenizer.encode("<|im_start|>", add_special_tokens=False) == [1]
    assert tokenizer.encode("<|im_end|>", add_special_tokens=False) == [2]
    # SmolLM2's pre-tokenizer ('smollm') keeps every digit apart.
    assert len(tokenizer.encode("2025", add_special_tokens=False)) == 4
    assert tokenizer.encode("Hi", add_special_tokens=True) == tokenizer.encode(
        "Hi", add_special_tokens=False
    )  # the file says add_bos_token = false
    assert tokenizer.eos_token_ids == {2}


@pytest.mark.smollm
def test_smollm2_tokenizer_matches_transformers_gguf_reader(smollm2, smollm2_gguf):
    # transformers rebuilds GGUF tokenizers on its own; it does not know the 'smollm'
    # digit split, so give it that one piece and compare everything else.
    mapping = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping")
    if not hasattr(mapping, "GGUF_TOKENIZER_MAPPING"):  # transformers 5.17 has none
        pytest.skip("this transformers has no GGUF tokenizer table to compare with")
    from tokenizers import pre_tokenizers

    metadata = gguf_metadata(smollm2_gguf)
    fields = {}
    for key, name in mapping.GGUF_TOKENIZER_MAPPING["tokenizer"].items():
        if (value := metadata.get(f"tokenizer.{key}")) is not None:
            fields[name] = value.tolist() if isinstance(value, mx.array) else value
    reference, _ = mapping.convert_gguf_tokenizer("llama", fields)
    reference.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(False)]
    )
    _, tokenizer = smollm2
    rng = np.random.default_rng(0)
    vocab = list(tokenizer.get_vocab().values())
    samples = [tokenizer.decode(rng.choice(vocab, 12).tolist()) for _ in range(300)]
    for text in [*TEXTS, *samples]:
        expected = reference.encode(text, add_special_tokens=False).ids
        assert tokenizer.encode(text, add_special_tokens=False) == expected, text


@pytest.mark.smollm
def test_smollm2_chat_template_renders_the_gguf_template(smollm2, smollm2_gguf):
    _, tokenizer = smollm2
    metadata = gguf_metadata(smollm2_gguf)
    template = metadata["tokenizer.chat_template"]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    for messages in (
        [{"role": "user", "content": "What is the capital of France?"}],
        [
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Bonjour !"},
            {"role": "user", "content": "Ça va ?"},
        ],
    ):
        rendered = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        assert rendered == env.from_string(template).render(
            messages=messages, add_generation_prompt=True
        )
    default = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert default.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def _q4_1_reference(raw: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """llama.cpp's Q4_1: per 32 values, float16 d and m, then 16 bytes of nibbles."""
    block = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)])
    blocks = np.frombuffer(raw, dtype=block)
    q = np.concatenate([blocks["qs"] & 0x0F, blocks["qs"] >> 4], axis=1).astype(np.float32)
    d = blocks["d"].astype(np.float32)[:, None]
    m = blocks["m"].astype(np.float32)[:, None]
    return (q * d + m).reshape(shape)


def _q8_0_reference(raw: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """llama.cpp's Q8_0: per 32 values, a float16 d, then 32 signed bytes."""
    blocks = np.frombuffer(raw, dtype=np.dtype([("d", "<f2"), ("qs", "i1", 32)]))
    return (blocks["qs"].astype(np.float32) * blocks["d"].astype(np.float32)[:, None]).reshape(
        shape
    )


@pytest.mark.smollm
@pytest.mark.parametrize(
    ("gguf_tensor", "hf_tensor", "reference", "block_bytes"),
    [
        ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight", _q4_1_reference, 20),
        ("token_embd.weight", "model.embed_tokens.weight", _q8_0_reference, 34),
    ],
)
def test_smollm2_dequantized_weights_match_llamacpp_formulas(
    smollm2_path, smollm2_gguf, gguf_tensor, hf_tensor, reference, block_bytes
):
    header = read_gguf_header(smollm2_gguf)
    info = header.tensors[gguf_tensor]
    rows, cols = 256, info.shape[1]  # the first rows are enough, and quick
    with smollm2_gguf.open("rb") as f:
        f.seek(header.data_offset + info.offset)
        expected = reference(f.read(rows * cols // 32 * block_bytes), (rows, cols))
    imported = load_arrays(smollm2_path / "model.safetensors")
    np.testing.assert_allclose(np.array(imported[hf_tensor][:rows]), expected, rtol=0, atol=1e-6)


@pytest.mark.smollm
def test_interrupted_import_leaves_no_model(tmp_path, smollm2_gguf):
    out = tmp_path / "model"
    script = (
        "import sys, mlx_integrations\n"
        "from mlx_integrations.models.gguf.convert import import_gguf\n"
        "import_gguf(sys.argv[1], sys.argv[2])\n"
    )
    proc = subprocess.Popen(
        with_default_sigint([sys.executable, "-c", script, str(smollm2_gguf), str(out)]),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not any(p.name.startswith(".model.importing-") for p in tmp_path.iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, "import never started"
            time.sleep(0.02)
        # Like a user pressing Ctrl-C until it stops: Python drops a KeyboardInterrupt
        # that lands inside a __del__, so one signal is not always enough.
        signals = 0
        while proc.poll() is None and time.monotonic() < deadline:
            proc.send_signal(signal.SIGINT)
            signals += 1
            time.sleep(0.5)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in stderr
    assert not out.exists()
    # A second Ctrl-C may cut the clean-up short; what stays is hidden, never a model.
    assert all(name.startswith(".model.importing-") for name in leftovers(tmp_path))
    if signals == 1:
        assert leftovers(tmp_path) == []
