"""Tiny random MLX models with a tokenizer trained on the spot and a tool-aware template.

They load with ``mlx_lm.load`` like any model folder and build in about a second, so
tests of structure, streaming, batching, caches and cancellation need no download.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# A ChatML template that takes tools, assistant tool_calls and role="tool" messages,
# in the Hermes/Qwen2.5 style (<tool_call>{json}</tool_call>).
CHATML_TOOLS_TEMPLATE = r"""
{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}
{{- '# Tools\n\nYou may call one or more functions. Function signatures:\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools>\n\nFor each call, return <tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call><|im_end|>\n' }}
{%- elif messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message['role'] == 'user' or (message['role'] == 'system' and not loop.first) %}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}
{%- elif message['role'] == 'assistant' %}
{{- '<|im_start|>assistant\n' }}
{%- if message.get('reasoning_content') %}{{- '<think>' + message['reasoning_content'] + '</think>' }}{%- endif %}
{%- if message['content'] %}{{- message['content'] }}{%- endif %}
{%- for tool_call in message.get('tool_calls') or [] %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '<tool_call>{"name": "' + tool_call.name + '", "arguments": ' + (tool_call.arguments | tojson) + '}</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message['role'] == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
""".strip()

# A template that knows nothing of tools: only user/assistant/system text.
PLAIN_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
]

_CORPUS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "Hello! How can I help you today? I am a helpful assistant.",
    "What is the weather in Paris? It is sunny and 21 degrees.",
    'Call {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    '{"a": 1, "b": [true, false, null], "c": "text", "d": 3.5, "e": {"f": -2}}',
    "system user assistant tool tools function arguments name description parameters",
    "Unicode: café, naïve, 東京, Привет, 👋🏽, ü ö ä ß, ★ ✓",
    "0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ? ' \" _ | # @ $ % ^ & ~ `",
    "The quick brown fox jumps over the lazy dog. Lorem ipsum dolor sit amet.",
    "Tools: You may call one or more functions. Function signatures: return a call.",
]


def train_tokenizer(vocab_size: int = 512):
    """Train a byte-level BPE tokenizer (all of UTF-8 is encodable) on a tiny corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    return tok


def build_tiny_model(
    out_dir: Path,
    *,
    arch: str = "llama",
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int | None = None,
    chat_template: str | None = CHATML_TOOLS_TEMPLATE,
    seed: int = 0,
    max_position_embeddings: int = 4096,
    dtype: str = "float32",
    special_tokens: Sequence[str] = (),
    tie_word_embeddings: bool = True,
) -> Path:
    """Write a random model folder that ``mlx_lm.load`` opens.

    Args:
        out_dir: Folder to create (must not hold another model).
        arch: ``"llama"``, ``"qwen2"`` or ``"ministral3"`` (which mlx-lm splits by
            layers, as a pipeline).
        hidden_size: Width of the model.
        num_hidden_layers: Depth.
        num_attention_heads: Query heads.
        num_key_value_heads: KV heads (grouped-query attention when fewer).
        intermediate_size: MLP width (default 2x hidden).
        chat_template: Jinja template stored in tokenizer_config.json, or None.
        seed: Random seed of the weights.
        max_position_embeddings: Context length written to config.json.
        dtype: Weight dtype.
        special_tokens: More special tokens (a model family's markers), one token each.
        tie_word_embeddings: Share the input embedding as output head. A random model
            with tied weights tends to repeat one token under greedy decoding; an own
            head gives varied greedy replies.
    """
    import mlx.core as mx
    from mlx_lm.models import llama, ministral3, qwen2

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    if special_tokens:
        from tokenizers import AddedToken

        tok.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t in special_tokens]
        )
    vocab_size = tok.get_vocab_size()
    eos_id = tok.token_to_id("<|im_end|>")
    config = {
        "model_type": arch,
        "hidden_size": hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "intermediate_size": intermediate_size or 2 * hidden_size,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab_size,
        "max_position_embeddings": max_position_embeddings,
        "rope_theta": 10000.0,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": tok.token_to_id("<|endoftext|>"),
        "eos_token_id": eos_id,
        "torch_dtype": dtype,
    }
    if arch == "ministral3":  # a Llama-like model that mlx-lm can split as a pipeline
        config["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": max_position_embeddings,
        }
    module = {"llama": llama, "qwen2": qwen2, "ministral3": ministral3}[arch]
    args = module.ModelArgs.from_dict(config)
    mx.random.seed(seed)
    model = module.Model(args)
    save_model(out_dir, model, config, dtype)
    tok.save(str(out_dir / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": max_position_embeddings,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": added_tokens_decoder(
            {t: tok.token_to_id(t) for t in (*SPECIAL_TOKENS, *special_tokens)}
        ),
    }
    if chat_template is not None:
        tokenizer_config["chat_template"] = chat_template
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    )
    return out_dir


def save_model(out_dir: Path, model: Any, config: dict[str, Any], dtype: str) -> None:
    """The model's weights in ``dtype`` as model.safetensors, and its config.json."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    weights = {k: v.astype(getattr(mx, dtype)) for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))


def noisy_copy(source: Path, out_dir: Path, scale: float = 0.5, seed: int = 1) -> Path:
    """A copy of a tiny model whose output head has noise added (``scale`` times the
    head's standard deviation): a draft model that agrees with ``source`` on some
    tokens and not others, with the same tokenizer."""
    import shutil

    import mlx.core as mx

    shutil.copytree(source, out_dir)
    path = out_dir / "model.safetensors"
    weights = mx.load(str(path))
    assert isinstance(weights, dict)
    head = "lm_head.weight"
    assert head in weights, f"{source} ties its output head to the embedding"
    mx.random.seed(seed)
    w = weights[head]
    weights[head] = w + scale * mx.std(w) * mx.random.normal(w.shape, dtype=w.dtype)
    mx.save_safetensors(str(path), weights, metadata={"format": "mlx"})
    return out_dir


def added_tokens_decoder(ids: dict[str, int]) -> dict[str, dict[str, Any]]:
    """tokenizer_config.json's entries for special tokens, ``{token: id}``."""
    flags = {"special": True, "lstrip": False, "rstrip": False, "normalized": False}
    return {str(i): {"content": t, **flags, "single_word": False} for t, i in ids.items()}


def cached_tiny_model(name: str = "tiny-llama", **kwargs: object) -> Path:
    """A tiny model built once per machine (``$MLXI_TEST_CACHE``) and reused across runs.

    The folder name carries a hash of this module and the arguments, so a change to
    the builder builds it again. Used where a path is needed outside fixtures (the
    langchain-tests suites read their model parameters from class properties).
    """
    return cached_build(name, build_tiny_model, [Path(__file__)], **kwargs)


def cached_build(
    name: str, build: Callable[..., object], sources: list[Path], **kwargs: object
) -> Path:
    """``build(folder, **kwargs)`` once per machine, in a folder named by a hash of the
    builder's ``sources`` and the arguments; concurrent test processes build it once."""
    import fcntl
    import hashlib
    import os
    import shutil
    import tempfile

    root = Path(os.environ.get("MLXI_TEST_CACHE") or "~/.cache/mlx-integrations-tests")
    root = root.expanduser()
    root.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(
        b"".join(source.read_bytes() for source in sources) + repr(sorted(kwargs.items())).encode()
    ).hexdigest()[:12]
    target = root / f"{name}-{digest}"
    if (target / "config.json").exists():
        return target
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").exists():
            tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
            try:
                build(tmp, **kwargs)
                os.rename(tmp, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return target
