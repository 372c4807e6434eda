"""Rebuild a GGUF file's tokenizer as Hugging Face ``tokenizer.json`` and
``tokenizer_config.json`` (chat template kept verbatim).

Supported: GPT-2 style byte-level BPE (``tokenizer.ggml.model == "gpt2"``) with the
pre-tokenizers of GPT-2, SmolLM/StarCoder (digits split first) and Llama 3.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlx_integrations.models.folders import read_json
from mlx_integrations.models.gguf.reader import GGUFHeader

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# llama.cpp token types (tokenizer.ggml.token_type).
_TOKEN_UNKNOWN, _TOKEN_CONTROL, _TOKEN_USER_DEFINED = 2, 3, 4


# Pre-tokenizer regexes, by the name llama.cpp stores in tokenizer.ggml.pre.
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2_PRE = ("default", "gpt-2", "gpt2")
_DIGITS_THEN_GPT2_PRE = ("smollm", "starcoder", "refact")
_LLAMA3_PRE = ("llama-bpe", "llama3")


def check_tokenizer(header: GGUFHeader) -> None:
    """Reject a tokenizer whose tokenization the rebuild could not reproduce."""
    path, meta = header.path, header.metadata
    tokenizer_model = meta.get("tokenizer.ggml.model")
    if tokenizer_model != "gpt2":
        raise ValueError(
            f"{path}: tokenizer model {tokenizer_model!r} is not supported by the GGUF import "
            "(only 'gpt2', byte-level BPE). Convert the original Hugging Face checkpoint "
            "with mlx_lm.convert instead."
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _GPT2_PRE + _DIGITS_THEN_GPT2_PRE + _LLAMA3_PRE:
        raise ValueError(
            f"{path}: pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported by the GGUF "
            "import, so its tokenization could not be reproduced. Convert the original "
            "Hugging Face checkpoint with mlx_lm.convert instead."
        )


def build_tokenizer(header: GGUFHeader) -> tuple[Tokenizer, dict[str, Any]]:
    """A ``tokenizers`` BPE tokenizer and its tokenizer_config.json, from GGUF metadata."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )

    path, meta = header.path, header.metadata
    tokens = meta.get("tokenizer.ggml.tokens")
    merges = meta.get("tokenizer.ggml.merges")
    if not tokens or not merges:
        raise ValueError(
            f"{path} lacks tokenizer.ggml.tokens or tokenizer.ggml.merges; a GPT-2 style "
            "tokenizer cannot be rebuilt without both."
        )
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise ValueError(
            f"{path} lists {len(tokens)} tokens but {len(types)} token types; "
            "its tokenizer metadata is corrupt."
        )
    rows = header.tensors["token_embd.weight"].shape[0]
    if len(tokens) > rows:
        raise ValueError(
            f"{path} lists {len(tokens)} tokens but its embedding has only {rows} rows; "
            "its tokenizer metadata does not belong to these weights."
        )
    vocab: dict[str, int] = {}
    for token_id, token in enumerate(tokens):
        vocab.setdefault(token, token_id)  # a repeated string keeps its first id
    pairs: list[tuple[str, str]] = []
    for merge in merges:
        parts = merge.split(" ")
        if len(parts) != 2:
            raise ValueError(f"{path} has a malformed merge {merge!r} in tokenizer.ggml.merges.")
        pairs.append((parts[0], parts[1]))

    pre = meta.get("tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre not in _LLAMA3_PRE)
    pre_tokenizer: pre_tokenizers.PreTokenizer
    if pre in _DIGITS_THEN_GPT2_PRE:
        # llama.cpp splits every digit first, then applies the GPT-2 regex.
        pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    elif pre in _LLAMA3_PRE:
        split = pre_tokenizers.Split(Regex(_LLAMA3_PATTERN), behavior="isolated", invert=False)
        pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    else:
        pre_tokenizer = byte_level

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre in _LLAMA3_PRE))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    special = {i: tokens[i] for i, t in enumerate(types) if t in (_TOKEN_CONTROL, _TOKEN_UNKNOWN)}
    user_defined = [tokens[i] for i, t in enumerate(types) if t == _TOKEN_USER_DEFINED]
    # Matched whole in the raw text, before pre-tokenization, as llama.cpp does.
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in special.values()]
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in user_defined])

    def token_of(key: str) -> tuple[str, int] | None:
        token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is None or not 0 <= token_id < len(tokens):
            return None
        return tokens[token_id], token_id

    bos, eos = token_of("bos"), token_of("eos")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    byte_level_post = processors.ByteLevel(trim_offsets=False)
    if add_bos or add_eos:
        ends = [end for end, on in ((bos, add_bos), (eos, add_eos)) if on and end]

        def wrap(sequence: str, type_id: int) -> str:
            items = [f"{bos[0]}:{type_id}"] if add_bos and bos else []
            items.append(f"${sequence}:{type_id}")
            items += [f"{eos[0]}:{type_id}"] if add_eos and eos else []
            return " ".join(items)

        template = processors.TemplateProcessing(
            single=wrap("A", 0), pair=f"{wrap('A', 0)} {wrap('B', 1)}", special_tokens=ends
        )
        tokenizer.post_processor = processors.Sequence([byte_level_post, template])
    else:
        tokenizer.post_processor = byte_level_post

    def name_of(key: str) -> str | None:
        found = token_of(key)
        return found[0] if found else None

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": name_of("bos"),
        "eos_token": name_of("eos"),
        "pad_token": name_of("padding"),
        "unk_token": name_of("unknown"),
        "model_max_length": meta.get(f"{header.architecture}.context_length", 2048),
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(token_id): {
                "content": token,
                "special": True,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
            }
            for token_id, token in special.items()
        },
    }
    chat_template = meta.get("tokenizer.chat_template")
    if isinstance(chat_template, str):
        config["chat_template"] = chat_template
    return tokenizer, config


def verify_tokenizer(folder: Path, source: Path) -> None:
    """Reload the written tokenizer and check that every special token maps to one id."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config = read_json(folder / "tokenizer_config.json")
    for token_id, entry in config["added_tokens_decoder"].items():
        ids = tokenizer.encode(entry["content"], add_special_tokens=False).ids
        if ids != [int(token_id)]:
            raise ValueError(
                f"{source}: the rebuilt tokenizer encodes {entry['content']!r} as {ids}, "
                f"not [{token_id}]; its vocabulary metadata is inconsistent."
            )
