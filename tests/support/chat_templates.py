"""Real tool-calling chat templates of the model families, on a tiny tokenizer.

The templates live in ``tests/chat/templates`` (test data; sources in the README
there). A tokenizer folder is written around one and loaded with mlx-lm's own loader,
so format detection and rendering go through the same code as for a real model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TEMPLATES_DIR = Path(__file__).resolve().parents[1] / "chat" / "templates"
BOS = "<|endoftext|>"
EOS = "<|im_end|>"


@dataclass(frozen=True)
class Family:
    """One model family's template and where its assistant reply sits in a render.

    Attributes:
        template: File name in :data:`TEMPLATES_DIR`.
        format: Name of our :class:`ToolCallFormat` for the family.
        reply_start: Text just before the assistant's reply in a rendered conversation.
        reply_end: Text that closes the reply (end of turn).
        parallel: The template renders several calls in one assistant turn.
    """

    template: str
    format: str
    reply_start: str
    reply_end: str
    parallel: bool = True


_LLAMA_ASSISTANT = "<|start_header_id|>assistant<|end_header_id|>\n\n"

FAMILIES: dict[str, Family] = {
    "hermes": Family("hermes.jinja", "hermes", "<|im_start|>assistant\n", EOS),
    "llama3.1_json": Family(
        "llama3.1_json.jinja", "llama3_json", _LLAMA_ASSISTANT, "<|eot_id|>", parallel=False
    ),
    "llama3.2_pythonic": Family(
        "llama3.2_pythonic.jinja", "pythonic", _LLAMA_ASSISTANT, "<|eot_id|>"
    ),
    "mistral_parallel": Family("mistral_parallel.jinja", "mistral", "[/INST]", EOS),
    "qwen3coder": Family("qwen3coder.jinja", "qwen3_coder", "<|im_start|>assistant\n", EOS),
}

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name."},
                    "days": {"type": "integer", "description": "Days ahead."},
                    "metric": {"type": "boolean", "description": "Celsius if true."},
                    "hours": {
                        "type": "array",
                        "items": {"type": "integer"},
                        "description": "Hours of the day.",
                    },
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in a zone.",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "description": "Time zone."}},
                "required": ["zone"],
            },
        },
    },
]


def write_tokenizer(folder: Path, chat_template: str | None) -> Path:
    """Write a tiny tokenizer folder with ``chat_template`` in its config."""
    from tests.support.tiny_models import train_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    train_tokenizer().save(str(folder / "tokenizer.json"))
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "clean_up_tokenization_spaces": False,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def load_family_tokenizer(folder: Path, family: Family) -> Any:
    """mlx-lm's ``TokenizerWrapper`` around the family's real template."""
    from mlx_lm.tokenizer_utils import load

    template = (TEMPLATES_DIR / family.template).read_text()
    return load(write_tokenizer(folder, template))


def tool_calls_message(
    calls: list[tuple[str, dict[str, Any]]], content: str = ""
) -> dict[str, Any]:
    """An assistant message with OpenAI-style ``tool_calls`` (ids of 9+ characters)."""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {
                "id": f"call{i:05d}abcd",
                "type": "function",
                "function": {"name": name, "arguments": args},
            }
            for i, (name, args) in enumerate(calls)
        ],
    }


def render_reply(
    tokenizer: Any,
    family: Family,
    calls: list[tuple[str, dict[str, Any]]],
    content: str = "",
) -> str:
    """The text the family's template writes for an assistant turn with ``calls``.

    This is what the model learnt to write, so it is what the parser must read.
    """
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        tool_calls_message(calls, content),
    ]
    rendered = tokenizer.apply_chat_template(
        messages, tools=TOOLS, tokenize=False, add_generation_prompt=False
    )
    reply = rendered.rsplit(family.reply_start, 1)[1]
    return reply.split(family.reply_end, 1)[0]
