"""Logits processors that hold a generation to an llguidance grammar.

The token mask is computed on the CPU by llguidance's matcher and applied with
portable MLX ops (no Metal kernel), so the same processor runs on CPU, CUDA and
Metal. Each processor follows one request: it is stateful and single-use.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    import mlx.core as mx
    from llguidance import LLMatcher, LLTokenizer

logger = logging.getLogger(__name__)

_lock = threading.Lock()
# One llguidance tokenizer per Hugging Face tokenizer object (building one walks the
# whole vocabulary), dropped with the tokenizer.
_tokenizers: weakref.WeakKeyDictionary[Any, tuple[tuple[int, ...], LLTokenizer]] = (
    weakref.WeakKeyDictionary()
)
# Compiled matchers by (tokenizer, grammar); a request gets a deep copy, which skips
# building the lexer again for a schema seen before.
_MATCHER_CACHE_SIZE = 32
_matchers: OrderedDict[tuple[int, str], tuple[LLTokenizer, LLMatcher]] = OrderedDict()


def hf_tokenizer(tokenizer: Any) -> Any:
    """The Hugging Face tokenizer inside an mlx-lm ``TokenizerWrapper`` (or itself)."""
    return getattr(tokenizer, "_tokenizer", tokenizer)


def eos_token_ids(tokenizer: Any) -> list[int]:
    """The token ids that end a generation, as the engines see them."""
    ids = getattr(tokenizer, "eos_token_ids", None)
    if ids:
        return sorted(int(i) for i in ids)
    eos = getattr(hf_tokenizer(tokenizer), "eos_token_id", None)
    if eos is None:
        raise ValueError("The tokenizer has no EOS token; constrained decoding needs one")
    return [int(eos)]


def llguidance_tokenizer(tokenizer: Any) -> LLTokenizer:
    """The llguidance view of a tokenizer, built once per tokenizer and cached.

    Args:
        tokenizer: An mlx-lm ``TokenizerWrapper`` or a fast Hugging Face tokenizer.

    Raises:
        TypeError: The tokenizer is not a fast (Rust-backed) tokenizer.
    """
    import llguidance.hf

    hf = hf_tokenizer(tokenizer)
    eos = tuple(eos_token_ids(tokenizer))
    with _lock:
        cached = _tokenizers.get(hf)
        if cached is not None and cached[0] == eos:
            return cached[1]
    if getattr(hf, "backend_tokenizer", None) is None:
        raise TypeError(
            f"Constrained decoding needs a fast (Rust-backed) Hugging Face tokenizer; got "
            f"{type(hf).__name__}. Convert the model with a tokenizer.json file."
        )
    try:
        built = llguidance.hf.from_tokenizer(hf, eos_token=list(eos))
    except ValueError as exc:
        raise TypeError(f"llguidance cannot read the tokenizer {type(hf).__name__}: {exc}") from exc
    with _lock:
        _tokenizers[hf] = (eos, built)
    return built


def check_grammar(grammar: str, ll_tokenizer: LLTokenizer | None = None) -> list[str]:
    """llguidance's warnings about a grammar that compiles (what it leaves out).

    Raises:
        ValueError: With llguidance's message, when the grammar does not compile.
    """
    from llguidance import LLMatcher

    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, ll_tokenizer)
    if is_error:
        raise ValueError(f"The constraint does not compile: {messages[0] if messages else ''}")
    return list(messages)


def compile_matcher(ll_tokenizer: LLTokenizer, grammar: str) -> LLMatcher:
    """A fresh matcher for ``grammar``, copied from a cached compiled one.

    Raises:
        ValueError: The grammar does not compile (llguidance's message included).
    """
    from llguidance import LLMatcher

    key = (id(ll_tokenizer), grammar)
    with _lock:
        hit = _matchers.get(key)
        if hit is not None and hit[0] is ll_tokenizer:
            _matchers.move_to_end(key)
            return hit[1].deep_copy()
    matcher = LLMatcher(ll_tokenizer, grammar, log_level=0)
    if matcher.is_error():
        raise ValueError(f"The constraint does not compile: {matcher.get_error()}")
    with _lock:
        _matchers[key] = (ll_tokenizer, matcher)
        while len(_matchers) > _MATCHER_CACHE_SIZE:
            _matchers.popitem(last=False)
    return matcher.deep_copy()


class _VocabMasks:
    """Boolean masks over the model's vocabulary, padded or cut to the logits' width."""

    def __init__(self, n_tokens: int, eos: list[int]):
        self.n_tokens = n_tokens
        self.eos = eos
        self._eos_mask: dict[int, mx.array] = {}

    def to_logits_width(self, allowed: np.ndarray, width: int) -> mx.array:
        import mlx.core as mx

        # The model's vocabulary may be padded past the tokenizer's: those ids stay banned.
        if width > allowed.size:
            allowed = np.concatenate([allowed, np.zeros(width - allowed.size, dtype=np.uint8)])
        return mx.array(allowed[:width].view(np.bool_))

    def eos_only(self, width: int) -> mx.array:
        import mlx.core as mx

        mask = self._eos_mask.get(width)
        if mask is None:
            allowed = np.zeros(width, dtype=np.bool_)
            allowed[[i for i in self.eos if i < width]] = True
            mask = self._eos_mask[width] = mx.array(allowed)
        return mask


class GrammarLogitsProcessor:
    """Mask the logits so that only tokens the grammar allows can be sampled.

    Called by the decode loop as ``processor(tokens, logits)``. The first call sees the
    prefilled part of the prompt and records its length; every later call sees one
    more sampled token, which is fed to the matcher before the next mask is computed.
    Once the grammar is complete and admits nothing more, only EOS is allowed, so
    generation ends. Single-use: make one per request.

    Examples:
        >>> from mlx_integrations.chat.constraints import JsonSchemaConstraint
        >>> constraint = JsonSchemaConstraint({"type": "object"})
        >>> processor = constraint.make_processor(tokenizer)  # doctest: +SKIP
        >>> engine.chat(messages, logits_processors=[processor])  # doctest: +SKIP

    Args:
        tokenizer: The model's tokenizer (mlx-lm ``TokenizerWrapper`` or fast HF tokenizer).
        grammar: An llguidance grammar (from ``LLMatcher.grammar_from_*``).
    """

    def __init__(self, tokenizer: Any, grammar: str):
        import llguidance.numpy as llnp

        self._ll_tokenizer = llguidance_tokenizer(tokenizer)
        self._matcher = compile_matcher(self._ll_tokenizer, grammar)
        n_tokens = self._ll_tokenizer.vocab_size
        self._bitmask = llnp.allocate_token_bitmask(1, n_tokens)
        self._masks = _VocabMasks(n_tokens, eos_token_ids(tokenizer))
        self._prompt_len: int | None = None
        self._consumed: list[int] = []
        self._warned = False

    @property
    def tokens(self) -> list[int]:
        """The generated tokens the matcher has consumed so far."""
        return list(self._consumed)

    @property
    def is_accepting(self) -> bool:
        """The tokens consumed so far form a complete output of the grammar."""
        return self._matcher.is_accepting()

    @property
    def error(self) -> str | None:
        """The matcher's error, if a token it did not allow was fed to it."""
        return self._matcher.get_error() if self._matcher.is_error() else None

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        import llguidance.numpy as llnp
        import mlx.core as mx

        if self._prompt_len is None:
            self._prompt_len = tokens.size
        else:
            # Let the forward pass run while the mask is computed on the CPU.
            mx.async_eval(logits)
            self._consume(tokens)
        width = logits.shape[-1]
        neg_inf = mx.array(-mx.inf, dtype=logits.dtype)
        if self._matcher.is_stopped():
            self._warn_on_error()
            return mx.where(self._masks.eos_only(width), logits, neg_inf)
        llnp.fill_next_token_bitmask(self._matcher, self._bitmask)
        # Bit i of the little-endian int32 words is token i (MLX hosts are little-endian).
        allowed = np.unpackbits(
            self._bitmask.view(np.uint8), count=self._masks.n_tokens, bitorder="little"
        )
        return mx.where(self._masks.to_logits_width(allowed, width), logits, neg_inf)

    def _consume(self, tokens: mx.array) -> None:
        assert self._prompt_len is not None
        n_new = tokens.size - self._prompt_len - len(self._consumed)
        if n_new != 1:
            # Within one request every call brings exactly one sampled token.
            raise RuntimeError(
                "A constrained-decoding processor serves one request only; make a new one "
                "for each request with Constraint.make_processor(tokenizer)"
            )
        new = cast(list[int], tokens[-1:].tolist())
        self._consumed.extend(new)
        if not self._matcher.is_stopped():
            self._matcher.consume_tokens(new)

    def _warn_on_error(self) -> None:
        if self._matcher.is_error() and not self._warned:
            self._warned = True
            logger.warning("Constrained decoding stopped early: %s", self._matcher.get_error())


class TokenBanProcessor:
    """Never sample the given token ids (e.g. a tool-call marker that is one special token).

    Args:
        banned: Token ids to mask out.
    """

    def __init__(self, banned: list[int]):
        self._banned = sorted(set(banned))
        self._masks: dict[int, mx.array] = {}

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        import mlx.core as mx

        width = logits.shape[-1]
        mask = self._masks.get(width)
        if mask is None:
            banned = np.zeros(width, dtype=np.bool_)
            banned[[i for i in self._banned if i < width]] = True
            mask = self._masks[width] = mx.array(banned)
        return mx.where(mask, mx.array(-mx.inf, dtype=logits.dtype), logits)
