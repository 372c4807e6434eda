"""Real tool-calling chat templates of the model families, on a tiny tokenizer.

The templates live in ``tests/chat/templates`` (test data; sources in the README
there). A tokenizer folder is written around one and loaded with mlx-lm's own loader,
so format detection and rendering go through the same code as for a real model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
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
        format: Name of our :class:`ToolFormat` for the family.
        reply_start: Text just before the assistant's reply in a rendered conversation.
        reply_end: Text that closes the reply (end of turn).
        parallel: The template renders several calls in one assistant turn.
        special_tokens: The family's own special tokens that the template writes, added
            to the tiny tokenizer (as in the real vocabulary, each is one token).
        tools_kwarg: The template variable the tool definitions go in.
    """

    template: str
    format: str
    reply_start: str
    reply_end: str
    parallel: bool = True
    special_tokens: tuple[str, ...] = ()
    tools_kwarg: str = "tools"


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
    # Tools only as ``custom_tools``: under ``tools`` the template writes its tool system
    # prompt without the definitions. Arguments must be a mapping (a JSON string is
    # iterated character by character); every value is written quoted, through "%s"
    # (days="3", metric="True", hours="[6, 12]"). Results: ipython turns, content
    # JSON-quoted; no name or id needed.
    "llama4_pythonic": Family(
        "llama4_pythonic.jinja",
        "pythonic",
        "<|header_start|>assistant<|header_end|>\n\n",
        "<|eot|>",
        special_tokens=("<|header_start|>", "<|header_end|>", "<|eot|>"),
        tools_kwarg="custom_tools",
    ),
    # Tools in ``tools``. Arguments must be a mapping (a string is written as positional
    # arguments, one per character); values go through tojson (metric=true). Several
    # arguments of one call come out with no comma between them (the template's
    # ``first`` flag is set inside the loop, where Jinja keeps it to one pass):
    # get_weather(city="Paris"days=3). Results: user turns
    # "<tool_response>\n...</tool_response>"; no name or id needed.
    "gemma3_pythonic": Family(
        "gemma3_pythonic.jinja",
        "pythonic",
        "<start_of_turn>model\n",
        "<end_of_turn>",
        special_tokens=("<start_of_turn>", "<end_of_turn>"),
    ),
    # Tools in ``tools``. Arguments must be a mapping: they go through tojson, so a JSON
    # string would be written as a quoted string. The template's own indentation stays
    # in the reply (spaces before the call markers). Results: <｜tool▁output▁begin｜>
    # blocks after the turn; no name or id needed.
    "deepseek_r1": Family(
        "deepseek_r1.jinja",
        "deepseek",
        "<｜Assistant｜>",
        "<｜end▁of▁sentence｜>",
        special_tokens=tuple(
            f"<｜{t}｜>"
            for t in (
                "User",
                "Assistant",
                "end▁of▁sentence",
                "tool▁calls▁begin",
                "tool▁calls▁end",
                "tool▁call▁begin",
                "tool▁call▁end",
                "tool▁sep",
                "tool▁outputs▁begin",
                "tool▁outputs▁end",
                "tool▁output▁begin",
                "tool▁output▁end",
            )
        ),
    ),
    # Tools in ``tools``. Arguments must be a mapping (a string is written as a JSON
    # string). Each call needs an id of 9+ characters, written as its last 9; results
    # need ``tool_call_id`` (also 9+) and go in as [TOOL_RESULTS] {"content": ...,
    # "call_id": ...}[/TOOL_RESULTS], content unquoted; no name needed. No [ARGS] or
    # [CALL_ID] in this template.
    "mistral_small_3.1": Family(
        "mistral_small_3.1.jinja",
        "mistral",
        "[/INST]",
        EOS,
        special_tokens=(
            "[INST]",
            "[/INST]",
            "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_CALLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ),
    ),
    # Tools in ``tools``. Arguments must be a mapping (``.items()``; a string raises);
    # string values written raw, others through tojson. A reply has no end-of-turn
    # marker: the next turn (<|observation|> for results, <|user|>) closes it. Results:
    # one <|observation|> then "\n<tool_response>\n...\n</tool_response>" each; no name
    # or id needed.
    "glm4.6": Family(
        "glm4.6.jinja",
        "glm",
        "<|assistant|>",
        "<|observation|>",
        special_tokens=(
            "[gMASK]",
            "<sop>",
            "<|system|>",
            "<|user|>",
            "<|assistant|>",
            "<|observation|>",
            "<arg_key>",
            "</arg_key>",
            "<arg_value>",
            "</arg_value>",
            "<tool_response>",
            "</tool_response>",
        ),
    ),
    # Tools in ``tools``. Arguments as a mapping (tojson) or a JSON string (written
    # as is); each call's id is written into it. Calls are JSON objects in a list, not
    # pythonic. Results: role "tool" turns, <|tool_response_start|>...<|tool_response_end|>;
    # no name or id needed.
    "lfm2": Family(
        "lfm2.jinja",
        "lfm",
        "<|im_start|>assistant\n",
        EOS,
        special_tokens=(
            "<|tool_list_start|>",
            "<|tool_list_end|>",
            "<|tool_call_start|>",
            "<|tool_call_end|>",
            "<|tool_response_start|>",
            "<|tool_response_end|>",
        ),
    ),
    # Tools in ``tools``. Arguments as a mapping (tojson) or a JSON string (written as
    # is). The last assistant turn after the last user message opens with an empty
    # "<think>\n\n</think>\n\n"; earlier turns without reasoning have none. Results:
    # one user turn of "\n<tool_response>\n...\n</tool_response>" blocks; no name or id.
    "qwen3": Family(
        "qwen3.jinja",
        "hermes",
        "<|im_start|>assistant\n",
        EOS,
        special_tokens=("<tool_response>", "</tool_response>"),
    ),
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


def write_tokenizer(
    folder: Path, chat_template: str | None, special_tokens: Sequence[str] = ()
) -> Path:
    """Write a tiny tokenizer folder with ``chat_template`` in its config.

    ``special_tokens`` are added to the trained vocabulary, one token each.
    """
    from tokenizers import AddedToken

    from tests.support.tiny_models import train_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    if special_tokens:
        tok.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t in special_tokens]
        )
    tok.save(str(folder / "tokenizer.json"))
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
    return load(write_tokenizer(folder, template, family.special_tokens))


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
        messages, tokenize=False, add_generation_prompt=False, **{family.tools_kwarg: TOOLS}
    )
    reply = rendered.rsplit(family.reply_start, 1)[1]
    return reply.split(family.reply_end, 1)[0]
