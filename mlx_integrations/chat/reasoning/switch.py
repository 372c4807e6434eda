"""How a chat template turns thinking on and off, and the reasoning effort levels it takes.

Templates switch thinking in one of three ways, found by rendering probes once per
tokenizer: the ``enable_thinking`` variable (Qwen3: off writes an empty thinking
block), the ``reasoning_effort`` variable (gpt-oss: ``low``/``medium``/``high`` go
into the system prompt), or ``/think`` and ``/no_think`` flags in the system message
(SmolLM3). A template that thinks without a switch (DeepSeek-R1) always thinks.

``reasoning_effort`` names a level (``"none"``, ``"low"``, ``"medium"``, ``"high"``);
each template takes the levels it can tell apart: an on/off switch takes ``"none"``
(thinking off) and ``"high"`` (thinking on, the one effort it has).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any, Literal

from mlx_integrations.chat.reasoning.markers import (
    closes_reasoning,
    opens_reasoning,
    think_markers,
)

EFFORT_LEVELS = ("none", "low", "medium", "high")
"""Every ``reasoning_effort`` value, least thinking first."""

SwitchKind = Literal["enable_thinking", "reasoning_effort", "flags", "always", "none"]

_PROBE_REASONING = "zq_probe_reasoning_5521"
_NO_THINK, _THINK = "/no_think", "/think"


@dataclass(frozen=True)
class ReasoningSwitch:
    """What a chat template does with thinking.

    Attributes:
        thinks: The model writes reasoning between think markers (the template
            thinks, with or without a switch).
        kind: How thinking is switched: ``"enable_thinking"``, ``"reasoning_effort"``,
            ``"flags"`` (``/think`` / ``/no_think`` in the system message),
            ``"always"`` (no switch) or ``"none"`` (the model does not think).
        levels: The ``reasoning_effort`` values the template takes, least first.
        renders_reasoning: The template shows an earlier assistant turn's
            ``reasoning_content`` in the prompt (else it is dropped).
        turns_off: ``enable_thinking=False`` turns thinking off (beside an effort
            variable, for ``"none"``).
        default: The level the template renders when no switch is set (Qwen3:
            ``"high"``, thinking on; an effort template: the level it falls back
            to), or None when it matches none of its levels.
    """

    thinks: bool
    kind: SwitchKind
    levels: tuple[str, ...]
    renders_reasoning: bool = False
    turns_off: bool = False
    default: str | None = None


NO_REASONING = ReasoningSwitch(False, "none", ())

_lock = threading.Lock()
_cache: weakref.WeakKeyDictionary[Any, ReasoningSwitch] = weakref.WeakKeyDictionary()


def reasoning_switch(tokenizer: Any) -> ReasoningSwitch:
    """The template's :class:`ReasoningSwitch`, probed once per tokenizer object."""
    try:
        with _lock:
            cached = _cache.get(tokenizer)
    except TypeError:  # a tokenizer that takes no weak reference: probe every time
        return probe_reasoning(tokenizer)
    if cached is not None:
        return cached
    found = probe_reasoning(tokenizer)
    with _lock:
        _cache[tokenizer] = found
    return found


def _template_source(tokenizer: Any) -> str:
    source = getattr(tokenizer, "chat_template", None)
    if isinstance(source, dict):  # named templates: all of them count
        return "\n".join(str(v) for v in source.values())
    return source if isinstance(source, str) else ""


def _render(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str | None:
    generation = kwargs.pop("add_generation_prompt", True)
    try:
        return str(
            tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation, **kwargs
            )
        )
    except Exception:  # the template refuses the probe: it takes no such thing
        return None


def probe_reasoning(tokenizer: Any) -> ReasoningSwitch:
    """Render probe conversations to learn how the template switches thinking."""
    markers = think_markers(tokenizer)
    source = _template_source(tokenizer)
    if markers is None or not (source or getattr(tokenizer, "has_chat_template", False)):
        return NO_REASONING
    question = [{"role": "user", "content": "hi"}]
    on = _render(tokenizer, question, enable_thinking=True)
    off = _render(tokenizer, question, enable_thinking=False)
    turns_off = on is not None and off is not None and on != off
    efforts: dict[str, str] = {}
    for level in ("low", "medium", "high"):
        text = _render(tokenizer, question, reasoning_effort=level)
        if text is not None and text not in efforts.values():
            efforts[level] = text
    answer = {"role": "assistant", "content": "ok", "reasoning_content": _PROBE_REASONING}
    shown = _render(tokenizer, [*question, answer], add_generation_prompt=False) or ""
    renders = _PROBE_REASONING in shown
    none = ("none",) if turns_off else ()
    # What the template does when the request sets no switch.
    plain = _render(tokenizer, question)
    off_by_default = plain is not None and (plain == off if turns_off else False)
    if len(efforts) > 1:
        default = "none" if off_by_default else _level_of(plain, efforts)
        levels = (*none, *efforts)
        return ReasoningSwitch(True, "reasoning_effort", levels, renders, turns_off, default)
    if turns_off:
        default = "none" if off_by_default else ("high" if plain == on else None)
        return ReasoningSwitch(True, "enable_thinking", ("none", "high"), renders, True, default)
    if _NO_THINK in source:
        default = "none" if plain is not None and closes_reasoning(plain, tokenizer) else "high"
        return ReasoningSwitch(True, "flags", ("none", "high"), renders, default=default)
    thinks = (on is not None and opens_reasoning(on, tokenizer)) or any(
        m in source for m in markers
    )
    if thinks:
        return ReasoningSwitch(True, "always", ("high",), renders, default="high")
    return ReasoningSwitch(False, "none", (), renders)


def _level_of(text: str | None, efforts: dict[str, str]) -> str | None:
    """The effort level whose rendering ``text`` is, if any."""
    return next((level for level, shown in efforts.items() if shown == text), None)


def check_effort(value: Any) -> str | None:
    """A ``reasoning_effort`` value, checked: None or one of :data:`EFFORT_LEVELS`.

    Raises:
        TypeError / ValueError: Another value, naming the valid ones.
    """
    if value is None:
        return None
    if not isinstance(value, str) or value not in EFFORT_LEVELS:
        raise ValueError(
            f"reasoning_effort must be one of {', '.join(map(repr, EFFORT_LEVELS))}, got {value!r}"
        )
    return value


def check_budget(value: Any) -> int | None:
    """A ``thinking_budget``, checked: None or a number of tokens >= 0.

    Raises:
        TypeError: Not an integer.
        ValueError: Below 0.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"thinking_budget must be a number of tokens (an int), got {value!r}")
    if value < 0:
        raise ValueError(
            f"thinking_budget must be >= 0 tokens (0 closes the thinking at once), got {value}"
        )
    return value


def _how(switch: ReasoningSwitch) -> str:
    if switch.kind == "reasoning_effort":
        extra = " and enable_thinking for 'none'" if switch.turns_off else ""
        return f"its chat template reads reasoning_effort{extra}"
    if switch.kind == "enable_thinking":
        return "its chat template only turns thinking on or off (enable_thinking)"
    if switch.kind == "flags":
        return "its chat template only turns thinking on or off (/think, /no_think)"
    return "its chat template always thinks and has no switch"


def model_label(tokenizer: Any) -> str:
    """How errors name the model: its folder, as the tokenizer knows it."""
    return str(getattr(tokenizer, "name_or_path", "") or "The model")


def apply_effort(
    tokenizer: Any,
    level: str | None,
    messages: list[dict[str, Any]],
    template_kwargs: dict[str, Any],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and template variables that ask the template for ``level``.

    Args:
        tokenizer: The model's tokenizer (its template's switch, see
            :func:`reasoning_switch`).
        level: One of :data:`EFFORT_LEVELS`; None changes nothing.
        messages: Normalized messages (a ``/think`` flag goes into the system message).
        template_kwargs: The request's template variables (not changed).

    Raises:
        ValueError: A level the template does not take, listing those it does.
    """
    if check_effort(level) is None:
        return messages, template_kwargs
    assert level is not None
    switch = reasoning_switch(tokenizer)
    if level not in switch.levels:
        name = model_label(tokenizer)
        if not switch.levels:
            raise ValueError(
                f"{name!r} does not think (its chat template has no reasoning), so it "
                f"takes no reasoning_effort; got {level!r}. Leave reasoning_effort unset."
            )
        raise ValueError(
            f"{name!r} takes reasoning_effort {', '.join(map(repr, switch.levels))}, "
            f"not {level!r}: {_how(switch)}."
        )
    kwargs = dict(template_kwargs)
    if switch.kind == "reasoning_effort":
        if level == "none":
            kwargs["enable_thinking"] = False
        else:
            kwargs["reasoning_effort"] = level
    elif switch.kind == "enable_thinking":
        kwargs["enable_thinking"] = level != "none"
    elif switch.kind == "flags":
        messages = with_flag(messages, _NO_THINK if level == "none" else _THINK)
    return messages, kwargs


def with_flag(messages: list[dict[str, Any]], flag: str) -> list[dict[str, Any]]:
    """``flag`` at the end of the system message (one is added when there is none)."""
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0])
        content = first["content"]
        if isinstance(content, list):
            first["content"] = [*content, {"type": "text", "text": f" {flag}"}]
        else:
            first["content"] = f"{content} {flag}" if content else flag
        return [first, *messages[1:]]
    return [{"role": "system", "content": flag}, *messages]


def constraint_markers(prompt: str, tokenizer: Any) -> tuple[str | None, str | None]:
    """``(reasoning_end, reasoning_start)`` for the constraints of a rendered prompt.

    A prompt that opens a thinking block gives its end marker: the constraint holds
    after it. A template with a thinking switch whose prompt leaves the choice to the
    model (Qwen3 with thinking on) gives both: an optional block may come first. A
    prompt that closed the block (thinking off), or a template without a switch,
    gives neither.
    """
    markers = think_markers(tokenizer)
    if markers is None:
        return None, None
    if opens_reasoning(prompt, tokenizer):
        return markers[1], None
    switch = reasoning_switch(tokenizer)
    if switch.kind in ("enable_thinking", "reasoning_effort", "flags") and not closes_reasoning(
        prompt, tokenizer
    ):
        return markers[1], markers[0]
    return None, None
