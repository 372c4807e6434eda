"""ChatMLX's ``profile``: what the served model takes and does, read from the model itself.

LangChain reads the profile to choose for the model: ``create_agent`` takes the native
structured-output path where ``structured_output`` is true, summarization fits
``max_input_tokens``. The window comes from config.json, the inputs from whether the
model is a vision-language one, and reasoning from the chat template (rendered with
the model's tokenizer, loaded alone: no weights are read).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from langchain_core.language_models.model_profile import ModelProfile

from mlx_integrations.chat.reasoning import NO_REASONING, ReasoningSwitch, reasoning_switch
from mlx_integrations.engine.base import BaseEngine

_lock = threading.Lock()
_facts: dict[tuple[str, float], tuple[ReasoningSwitch, bool]] = {}
_PROBE_SYSTEM = "zq_probe_system_7301"


def model_profile(engine: BaseEngine) -> ModelProfile:
    """The profile of the model ``engine`` serves."""
    vision = bool(engine.is_mllm)
    profile = ModelProfile(
        open_weights=True,
        text_inputs=True,
        image_inputs=vision,
        image_url_inputs=vision,
        video_inputs=vision,
        image_tool_message=vision,
        pdf_inputs=False,
        pdf_tool_message=False,
        audio_inputs=False,
        attachment=False,
        text_outputs=True,
        image_outputs=False,
        audio_outputs=False,
        video_outputs=False,
        tool_calling=True,
        tool_choice=True,
        tool_call_streaming=True,
        structured_output=True,
        temperature=True,
        mid_conversation_tools=False,
    )
    window = getattr(engine, "context_length", None)
    if isinstance(window, int) and window > 0:
        # Prompt and reply share the window: a reply may fill what a prompt leaves.
        profile["max_input_tokens"] = window
        profile["max_output_tokens"] = window
    switch, mid_system = template_facts(engine)
    profile["reasoning_output"] = switch.thinks
    if switch.thinks and switch.levels:
        profile["reasoning_effort_levels"] = list(switch.levels)
        if switch.default is not None:  # what a call without reasoning_effort gets
            profile["reasoning_effort_default"] = switch.default
    profile["mid_conversation_system_messages"] = mid_system
    return profile


def template_facts(engine: BaseEngine) -> tuple[ReasoningSwitch, bool]:
    """How the model's chat template switches thinking, and whether it renders a system
    message in the middle of a conversation where it stands.

    Our engines' tokenizer is loaded alone from the model folder (once per folder and
    process) when the model is not loaded yet; another engine's ``tokenizer`` is read.
    A tokenizer that cannot be loaded alone reports no reasoning.
    """
    path = getattr(engine, "model_path", None)
    if path is None:
        return _read(engine.tokenizer)
    path = Path(path)
    config = path / "tokenizer_config.json"
    key = (str(path), config.stat().st_mtime if config.exists() else 0.0)
    with _lock:
        cached = _facts.get(key)
    if cached is not None:
        return cached
    try:
        from mlx_lm.tokenizer_utils import load

        tokenizer = load(path)
    except Exception:  # a folder mlx-lm cannot read on its own (some vision models)
        return NO_REASONING, False
    found = _read(tokenizer)
    with _lock:
        _facts[key] = found
    return found


def _read(tokenizer: Any) -> tuple[ReasoningSwitch, bool]:
    return reasoning_switch(tokenizer), _renders_mid_system(tokenizer)


def _renders_mid_system(tokenizer: Any) -> bool:
    convo = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "system", "content": _PROBE_SYSTEM},
        {"role": "user", "content": "again"},
    ]
    try:
        text = tokenizer.apply_chat_template(convo, tokenize=False, add_generation_prompt=True)
    except Exception:  # templates that take a system message first only
        return False
    return _PROBE_SYSTEM in text and text.index(_PROBE_SYSTEM) > text.index("hello")
