"""Tool-call families: one module each, one :class:`ToolFormat` object behind one protocol.

The registry picks a model's family once (cached per tokenizer): the user's override
first, then the family mlx-lm's tokenizer names, then the chat template's clues, then
Hermes. Nothing outside this package knows a family's markers.

Examples:
    >>> from mlx_integrations.chat.tool_formats import get_format, parse_calls
    >>> fmt = get_format("pythonic")
    >>> [c.name for c in parse_calls(fmt, '[get_weather(city="Paris")]')]
    ['get_weather']
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from mlx_integrations.chat.tool_formats.base import (
    InvalidToolCall,
    ParsedToolCall,
    ToolFormat,
    new_call_id,
    parse_calls,
)
from mlx_integrations.chat.tool_formats.deepseek import DeepSeekFormat
from mlx_integrations.chat.tool_formats.glm import GlmFormat
from mlx_integrations.chat.tool_formats.hermes import HermesFormat
from mlx_integrations.chat.tool_formats.llama3 import Llama3JsonFormat
from mlx_integrations.chat.tool_formats.mistral import MistralFormat
from mlx_integrations.chat.tool_formats.mlx_lm_family import MlxLmFormat
from mlx_integrations.chat.tool_formats.pythonic import LfmFormat, PythonicFormat
from mlx_integrations.chat.tool_formats.qwen3_coder import Qwen3CoderFormat

__all__ = [
    "FAMILIES",
    "InvalidToolCall",
    "ParsedToolCall",
    "ToolFormat",
    "detect_format",
    "format_names",
    "get_format",
    "new_call_id",
    "parse_calls",
]

# In the order the template clues are tried: the more specific markers first (Qwen3-Coder
# and GLM also write ``<tool_call>``, which alone means Hermes).
FAMILIES: tuple[type[ToolFormat], ...] = (
    Qwen3CoderFormat,
    GlmFormat,
    LfmFormat,
    DeepSeekFormat,
    Llama3JsonFormat,
    PythonicFormat,
    MistralFormat,
    HermesFormat,
)
# mlx-lm parser modules that are one of our families under another name: its
# ``pythonic`` module reads LFM2's ``<|tool_call_start|>[...]<|tool_call_end|>``.
_FROM_MLX_LM = {
    "pythonic": "lfm",
    "json_tools": "hermes",
    "glm47": "glm",
    "qwen3_coder": "qwen3_coder",
    "mistral": "mistral",
}

_cache_lock = threading.Lock()
# Per tokenizer, the family detected ("") and each override asked for by name.
_detected: weakref.WeakKeyDictionary[Any, dict[str, ToolFormat]] = weakref.WeakKeyDictionary()


def format_names() -> list[str]:
    """The names :func:`get_format` takes (mlx-lm's parser module names work too)."""
    return sorted({f.name for f in FAMILIES})


def get_format(name: str, tokenizer: Any = None) -> ToolFormat:
    """The family called ``name`` (or one of its aliases, or an mlx-lm parser module).

    Args:
        name: ``hermes``, ``llama3_json``, ``pythonic``, ``mistral``, ``qwen3_coder``,
            ``glm``, ``lfm``, ``deepseek``, or an ``mlx_lm.tool_parsers`` module name.
        tokenizer: The model's tokenizer, for families that read their layout from the
            template (Mistral).

    Raises:
        ValueError: No family has that name.
    """
    if isinstance(name, ToolFormat):
        return name
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"tool_format must be a family name, got {name!r}")
    for family in FAMILIES:
        if name == family.name or name in family.aliases:
            template = getattr(tokenizer, "chat_template", None)
            found = family.recognise(template, tokenizer) if isinstance(template, str) else None
            return found if isinstance(found, family) else family()
    if MlxLmFormat.exists(name):
        return MlxLmFormat(name)
    raise ValueError(
        f"Unknown tool-call format {name!r}; use one of {', '.join(format_names())} "
        "or an mlx_lm.tool_parsers module name"
    )


def detect_format(tokenizer: Any, override: str | None = None) -> ToolFormat:
    """The tool-call family of a model, picked once per tokenizer.

    Order: the user's ``override``; the parser mlx-lm's ``TokenizerWrapper`` inferred;
    the chat template's clues; Hermes ``<tool_call>``.
    """
    key = override or ""
    try:
        with _cache_lock:
            cached = _detected.get(tokenizer, {}).get(key)
    except TypeError:  # not weakly referenceable: detect every time
        cached = None
    if cached is not None:
        return cached
    found = get_format(override, tokenizer) if override else _detect(tokenizer)
    try:
        with _cache_lock:
            _detected.setdefault(tokenizer, {})[key] = found
    except TypeError:
        pass
    return found


def _detect(tokenizer: Any) -> ToolFormat:
    template = getattr(tokenizer, "chat_template", None)
    parser = getattr(tokenizer, "tool_parser", None)
    if parser is not None:
        module = getattr(parser, "__module__", "").rsplit(".", 1)[-1]
        if module in _FROM_MLX_LM:
            return get_format(_FROM_MLX_LM[module], tokenizer)
        if MlxLmFormat.exists(module):
            return MlxLmFormat(module)
    if isinstance(template, str):
        for family in FAMILIES:
            found = family.recognise(template, tokenizer)
            if found is not None:
                return found
    return HermesFormat(*_tokenizer_markers(tokenizer))


def _tokenizer_markers(tokenizer: Any) -> tuple[str | None, str | None]:
    start = getattr(tokenizer, "tool_call_start", None)
    end = getattr(tokenizer, "tool_call_end", None)
    if isinstance(start, str) and start:
        return start, end if isinstance(end, str) else ""
    return None, None
