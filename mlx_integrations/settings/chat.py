"""The fields, checks and engine sharing that ``ChatMLX`` and ``MLXLLM`` have in common."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from mlx_integrations.chat.reasoning import check_budget
from mlx_integrations.chat.request import ChatRequest, RequestTypeError, check_template_kwargs
from mlx_integrations.engine.base import BaseEngine
from mlx_integrations.models.lora.adapter import read_adapter
from mlx_integrations.runtime.memory import parse_keep_alive
from mlx_integrations.settings.fields import (
    check_timeout,
    model_field_names,
    plain_type_errors,
    reject_unknown_fields,
    validate_adapter_settings,
)


class ChatSettings(BaseModel):
    """Sampling and engine fields of a chat adapter, and the engine they run on.

    An adapter subclasses this before its framework's base class. Unknown constructor
    arguments are refused (pydantic would drop them), numbers are checked as the
    engines check them, and an adapter made from ``model`` shares the pooled engine
    of that model (see :mod:`mlx_integrations.engine.pool`).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, use_attribute_docstrings=True)

    model: str | None = None
    """A model folder, a store alias (``mlxi list``) or a Hugging Face repo id pulled with
    ``mlxi pull``. Ignored when ``engine`` is given."""
    engine: BaseEngine | None = Field(default=None, exclude=True)
    """Any engine honouring the ``BaseEngine`` contract; made from ``model`` when absent."""
    engine_type: Literal["simple", "batched", "distributed"] = "batched"
    """Kind of engine made from ``model``. ``"batched"`` (the default,
    ``BatchedEngine``) serves concurrent calls (``abatch``, ``asyncio.gather``, threads)
    together by continuous batching, and a call alone as fast as ``"simple"``;
    ``"simple"`` (``SimpleEngine``) serves one request at a time; ``"distributed"``
    shards the model over the ranks of ``mlxi launch`` (``DistributedEngine``). Left
    unset, what only ``SimpleEngine`` serves gets ``"simple"``: a vision-language model,
    or ``kv_bits`` with ``quantized_kv_start`` above 0; the field then says which kind
    was made."""
    engine_options: dict[str, Any] = Field(default_factory=dict)
    """Options of the engine made from ``model`` (``cache_memory_mb``, ``admission``,
    speculative decoding's ``prompt_lookup`` or ``draft_model``...; see
    :class:`~mlx_integrations.engine.options.EngineOptions`)."""
    adapter_path: str | None = None
    """A LoRA adapter folder as ``mlx_lm.lora`` writes it (``adapter_config.json`` and
    ``adapters.safetensors``), applied to ``model`` as ``mlx_lm.load(model,
    adapter_path=...)`` does; checked when the adapter is made (a missing folder or file
    raises ``ValueError``). A model with and without an adapter (or with two) are two
    pooled engines. An option of the engine made from ``model``, as the fields below."""
    draft_model: str | None = None
    """Speculative decoding: a small model of the same tokenizer drafts tokens for the
    model to verify (a folder, store name or pulled Hub id); greedy replies are unchanged.
    This and the five fields after it are options of the engine made from ``model``
    (the same names as in ``engine_options``, which they join; None leaves the engine's
    default)."""
    num_draft_tokens: int | None = None
    """Tokens the draft model proposes per verification step (engine default 3)."""
    prompt_lookup: int | None = None
    """Most tokens drafted per step from an earlier occurrence of the last few tokens
    in the prompt or the reply (RAG answers that quote, code edits); 0 turns it off."""
    kv_bits: int | None = None
    """Bits per value of a quantized KV cache (2, 3, 4, 6 or 8): long contexts in less
    memory, with replies that may drift."""
    kv_group_size: int | None = None
    """Values sharing one scale in the quantized KV cache (32, 64 or 128)."""
    quantized_kv_start: int | None = None
    """Tokens kept unquantized before the KV cache is quantized. Above 0 (with
    ``kv_bits``) only ``SimpleEngine`` serves it: an unset ``engine_type`` then makes one,
    ``engine_type="batched"`` is refused with ``ValueError``."""
    temperature: float = 0.7
    """Sampling temperature; 0 is greedy."""
    max_tokens: int = 512
    """Most tokens to generate per call."""
    top_p: float = 1.0
    """Nucleus sampling threshold in (0, 1]; 1.0 disables it."""
    top_k: int | None = None
    """Sample among the k most likely tokens; None or 0 disables it."""
    min_p: float | None = None
    """Drop tokens less likely than min_p times the top one."""
    repetition_penalty: float | None = None
    """Penalty (> 1 discourages) for tokens seen recently."""
    seed: int | None = None
    """Random seed, for reproducible sampling."""
    stop: list[str] | None = None
    """Stop sequences; they are never part of the output."""
    reasoning: bool | None = None
    """Turn the model's thinking on or off where its template takes ``enable_thinking``;
    None leaves the template's default. Reasoning never mixes with the answer: ChatMLX
    puts it in ``additional_kwargs["reasoning_content"]`` (and reasoning blocks with v1
    output), MLXLLM in a ``ThinkingBlock``."""
    reasoning_effort: Literal["none", "low", "medium", "high"] | None = None
    """How much the model thinks, through its chat template's own switch: ``"none"``
    turns thinking off where the template can (``enable_thinking``, ``/no_think``); the
    other levels go to a template that reads ``reasoning_effort`` (gpt-oss), and
    ``"high"`` turns an on/off switch on. A level the model does not take is refused,
    naming those it does (ChatMLX lists them in ``profile["reasoning_effort_levels"]``).
    None leaves the template's default. A call may pass its own ``reasoning_effort=``."""
    thinking_budget: int | None = None
    """Most tokens the model may think for: past them the engine writes the end marker
    (``</think>``) for it, and the answer follows (under the call's tool or JSON
    constraint, if any). 0 closes the thinking at once. None: no cap. A call may pass
    its own ``thinking_budget=``; a model that does not think refuses it."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra variables passed to the chat template."""
    logprobs: bool | None = None
    """Report each generated token's log-probability: ChatMLX in
    ``response_metadata["logprobs"]`` (``{"content": [...]}``, as ChatOpenAI), MLXLLM in
    ``ChatResponse.logprobs`` and ``raw["logprobs"]``."""
    top_logprobs: int | None = None
    """And this many most likely alternatives per token (0 to 20)."""
    tool_format: str | None = None
    """Tool-call family (``hermes``, ``llama3_json``, ``pythonic``, ``mistral``,
    ``qwen3_coder``, ``glm``, ``lfm``, ``deepseek`` or an mlx-lm parser name), to override
    the one detected from the model's tokenizer and chat template."""
    timeout: float | None = None
    """Seconds a whole call may take (waiting for the engine, the prompt and every token,
    streamed or not); then its request is stopped on the engine and the call raises
    ``TimeoutError``. None waits as long as the reply takes. A call may pass its own
    ``timeout=``."""
    keep_alive: float | str | None = None
    """How long the model stays in memory after a call, as Ollama's ``keep_alive``:
    seconds, or a duration (``"5m"``, ``"1h30m"``, ``"300ms"``); 0 unloads it as soon as
    a call ends, -1 keeps it loaded. The next call loads it again, unseen but for the
    time it takes. It is the engine's setting (adapters on one pooled engine share it;
    the last one made with a value wins). None (the default) leaves the engine's: for a
    new engine the process default, ``MLXI_KEEP_ALIVE``, else forever."""

    _owns_engine: bool = PrivateAttr(default=False)

    @field_validator("timeout", mode="before")
    @classmethod
    def _positive_timeout(cls, value: Any) -> float | None:
        with plain_type_errors():
            return check_timeout(value)

    @field_validator("thinking_budget", mode="before")
    @classmethod
    def _budget(cls, value: Any) -> int | None:
        return check_budget(value)

    @field_validator("adapter_path", mode="before")
    @classmethod
    def _adapter_folder(cls, value: Any) -> str | None:
        # One spelling of a folder (absolute), so that it makes one pooled engine.
        return None if value is None else str(read_adapter(value).path)

    @field_validator("keep_alive", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is not None:
            parse_keep_alive(value)  # a bad one is refused here, with what to give
        return value

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown_fields(cls, data: Any) -> Any:
        # pydantic would drop them silently: ChatMLX(n=2) or a typo must not pass.
        reject_unknown_fields(cls.__name__, data, model_field_names(cls))
        if isinstance(data, Mapping) and "chat_template_kwargs" in data:
            with plain_type_errors():
                check_template_kwargs(data["chat_template_kwargs"])
        return data

    @model_validator(mode="after")
    def _make_engine(self) -> Self:
        from mlx_integrations.engine import pool

        validate_adapter_settings(self)  # finite numbers and the engines' ranges, up front
        options = _engine_options(self, self.engine)
        if self.engine is None and self.model:
            # The kind chosen for this model, so ChatMLX and MLXLLM share one engine.
            object.__setattr__(self, "engine_type", self.engine_type_for(self.model))
        with plain_type_errors():  # an unknown engine option is a TypeError, as ever
            engine, self._owns_engine = pool.engine_for(
                self,
                self.model,
                self.engine,
                engine_type=self.engine_type,
                options=options,
                adapter=type(self).__name__,
                keep_alive=self.keep_alive,
            )
        object.__setattr__(self, "engine", engine)
        if self.model is None:
            object.__setattr__(self, "model", engine.model_name)
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy that shares the engine and counts as one more user of it in the pool."""
        copy = super().model_copy(update=update, deep=deep)
        if self._owns_engine and copy.engine is not None and copy.engine is self.engine:
            from mlx_integrations.engine import pool

            pool.share(copy, copy.engine)
        return copy

    def made_engine_options(self) -> dict[str, Any]:
        """The options of an engine made from a model name for this adapter:
        ``engine_options`` joined by the engine fields that are set."""
        return _engine_options(self)

    def engine_type_for(self, model: str) -> str:
        """The kind of engine made for ``model`` with this adapter's options:
        ``engine_type`` when it was given, else the default for that model
        (:func:`~mlx_integrations.engine.pool.default_engine_type`)."""
        if "engine_type" in self.model_fields_set:
            return self.engine_type
        from mlx_integrations.engine import pool

        return pool.default_engine_type(model, self.made_engine_options())

    def _served_engine(self) -> BaseEngine:
        assert self.engine is not None  # set by _make_engine
        return self.engine

    def get_stats(self) -> dict[str, Any]:
        """The engine's statistics (requests, tokens, prefix cache, memory)."""
        return self._served_engine().get_stats()

    def clear_runtime_caches(self) -> dict[str, Any] | None:
        """Drop the engine's prompt caches and return MLX's buffer pool to the system.

        Call it in long-lived pipelines when ``get_stats()["memory"]`` grows, between
        unrelated batches of work, or before loading another model. The engine also
        keeps its prefix cache within ``cache_memory_mb`` on its own.
        """
        return self._served_engine().clear_runtime_caches()

    def build_request(
        self,
        messages: list[dict[str, Any]],
        call: Mapping[str, Any],
        *,
        stop: Any = None,
        model: str | None = None,
    ) -> ChatRequest:
        """The checked request of one call: ``call``'s arguments over these fields.

        Args:
            messages: The conversation, in the chat core's neutral form.
            call: The call's keyword arguments: any field that a call may set
                (:data:`CALL_FIELDS`), plus ``tools``, ``tool_choice``,
                ``parallel_tool_calls``, ``response_format`` and ``logits_processors``.
            stop: The call's stop sequences (None: the ``stop`` field).
            model: The model's name as reported back (None: the ``model`` field).

        Raises:
            RequestError: A bad value, naming its field; a ``TypeError`` too for an
                argument no call takes.
        """
        unknown = sorted(set(call) - CALL_FIELDS - CALL_ONLY)
        if unknown:
            known = sorted(CALL_FIELDS | CALL_ONLY)
            close = difflib.get_close_matches(unknown[0], known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise RequestTypeError(
                f"{type(self).__name__} got unexpected arguments: {unknown}{hint}; a call "
                f"takes {', '.join(known)}",
                unknown[0],
            )
        values = {name: call.get(name, getattr(self, name)) for name in CALL_FIELDS}
        template_kwargs = check_template_kwargs(call.get("chat_template_kwargs"))
        return ChatRequest.build(
            messages,
            tools=call.get("tools"),
            tool_choice=call.get("tool_choice"),
            parallel_tool_calls=call.get("parallel_tool_calls"),
            response_format=call.get("response_format"),
            logits_processors=call.get("logits_processors"),
            max_tokens=values["max_tokens"],
            temperature=values["temperature"],
            top_p=values["top_p"],
            top_k=values["top_k"],
            min_p=values["min_p"],
            repetition_penalty=values["repetition_penalty"],
            seed=values["seed"],
            stop=stop if stop is not None else self.stop,
            reasoning_effort=values["reasoning_effort"],
            enable_thinking=values["reasoning"],
            thinking_budget=values["thinking_budget"],
            chat_template_kwargs={**self.chat_template_kwargs, **template_kwargs},
            tool_format=values["tool_format"],
            timeout=values["timeout"],
            logprobs=values["logprobs"],
            top_logprobs=values["top_logprobs"],
            model=model or self.model,
        )


CALL_FIELDS = frozenset(
    {
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "seed",
        "reasoning",
        "reasoning_effort",
        "thinking_budget",
        "tool_format",
        "timeout",
        "logprobs",
        "top_logprobs",
    }
)
"""Adapter fields a call may set for itself (``llm.invoke(..., temperature=0)``);
``chat_template_kwargs`` joins the field's instead."""

CALL_ONLY = frozenset(
    {
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "logits_processors",
        "chat_template_kwargs",
    }
)
"""Call arguments with no adapter field of the same name."""

ENGINE_FIELDS = (
    "adapter_path",
    "draft_model",
    "num_draft_tokens",
    "prompt_lookup",
    "kv_bits",
    "kv_group_size",
    "quantized_kv_start",
)
"""Adapter fields that are options of the engine made from ``model``."""


def _engine_options(settings: ChatSettings, engine: Any = None) -> dict[str, Any]:
    """``engine_options`` joined by the engine fields that are set.

    Raises:
        ValueError: A field set beside a given ``engine`` (that engine has its options),
            or set to another value in ``engine_options`` too.
    """
    given = {name: getattr(settings, name) for name in ENGINE_FIELDS}
    given = {name: value for name, value in given.items() if value is not None}
    adapter = type(settings).__name__
    if given and engine is not None:
        names = ", ".join(f"{k}={v!r}" for k, v in given.items())
        raise ValueError(
            f"{adapter}({names}) sets options of the engine made from model=..., but "
            f"engine= was given: pass them when you make that engine, e.g. "
            f"SimpleEngine(path, {names})"
        )
    options = dict(settings.engine_options)
    if options.get("adapter_path") is not None:  # spelled as the field is
        options["adapter_path"] = str(read_adapter(options["adapter_path"]).path)
    for name, value in given.items():
        if name in options and options[name] != value:
            raise ValueError(
                f"{adapter} got {name}={value!r} and engine_options[{name!r}]="
                f"{options[name]!r}; set it in one place"
            )
        options[name] = value
    return options
