"""Thinking models for tests: tiny random models with reasoning templates, and a
processor that makes a random model think on and on (so a budget has to stop it).

The templates switch thinking each in their own way: Qwen3's real template
(``enable_thinking``; the model opens ``<think>`` itself), a template whose generation
prompt opens the block (DeepSeek-R1 style), one that reads ``reasoning_effort``
(gpt-oss style) and one that reads ``/think`` / ``/no_think`` in the system message
(SmolLM3 style).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.chat_templates import TEMPLATES_DIR

QWEN3_TEMPLATE = (TEMPLATES_DIR / "qwen3.jinja").read_text()
QWEN3_TOKENS = ("<tool_response>", "</tool_response>")

# The generation prompt opens the thinking block; enable_thinking=False closes it.
OPENING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)

# The effort goes into a system line, as gpt-oss's template writes "Reasoning: high".
EFFORT_TEMPLATE = (
    "<|im_start|>system\nReasoning: {{ reasoning_effort | default('medium') }}<|im_end|>\n"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)

# /no_think in the system message turns thinking off (an empty block); the flag itself
# is not shown to the model.
FLAGS_TEMPLATE = (
    "{% set ns = namespace(off=false) %}"
    "{% for m in messages %}"
    "{% if m.role == 'system' and '/no_think' in m.content %}{% set ns.off = true %}{% endif %}"
    "<|im_start|>{{ m.role }}\n"
    "{{ m.content | replace('/no_think', '') | replace('/think', '') | trim }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if ns.off %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}"
)


def build_thinking_model(folder: Path, template: str) -> Path:
    """A tiny random Qwen2-shaped model with ``template`` (Qwen3's special tokens added)."""
    from tests.support.tiny_models import build_tiny_model

    special = QWEN3_TOKENS if template is QWEN3_TEMPLATE else ()
    return build_tiny_model(folder, arch="qwen2", chat_template=template, special_tokens=special)


def endless_thinker(tokenizer: Any, *, open_first: bool = False, ban_eos: bool = True) -> Any:
    """A processor that never lets the model close its thinking (nor end, with
    ``ban_eos``); with ``open_first`` its first token is the start marker.

    Only a thinking budget, which runs after it, can write the end marker.
    """
    import mlx.core as mx

    start = tokenizer.think_start_tokens[0]
    banned = [tokenizer.think_end_tokens[0]]
    if ban_eos:
        banned += list(tokenizer.eos_token_ids)
    state: dict[str, int | None] = {"prompt": None}

    def processor(tokens: Any, logits: Any) -> Any:
        if state["prompt"] is None:
            state["prompt"] = tokens.size
        bias = mx.zeros(logits.shape)
        bias[..., mx.array(banned)] = -1e9
        if open_first and tokens.size == state["prompt"]:
            bias = mx.full(logits.shape, -1e9)
            bias[..., start] = 0
        return logits + bias

    return processor


def prompt_recorder() -> tuple[Any, list[list[int]]]:
    """A processor that keeps the prompt's tokens (what its first call sees)."""
    seen: list[list[int]] = []

    def processor(tokens: Any, logits: Any) -> Any:
        if not seen:
            seen.append(tokens.tolist())
        return logits

    return processor, seen
