"""Sentence embeddings on MLX: BERT-family sentence-transformers models, offline.

An :class:`EmbeddingEngine` loads a model folder (``config.json``, ``*.safetensors``,
tokenizer files and the sentence-transformers files ``modules.json``,
``1_Pooling/config.json``, ``sentence_bert_config.json``) on its own owner thread and
runs every tokenization and forward pass there, since MLX arrays belong to the thread
that made them. Callers on any thread, or on an event loop, submit work to it.

:func:`get_embedding_engine` shares one engine per resolved model folder across the
process, so every adapter object built on the same model holds one copy of the weights.
"""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict, Unpack

from mlx_integrations.embeddings.encoder_engine import (
    EncoderDtype,
    EncoderEngine,
    auto_tokenizer,
    clear_encoder_engines,
    pad_right,
    shared,
    split_batches,
)
from mlx_integrations.embeddings.sentence_head import (
    POOLING_MODES,
    PoolingMode,
    SentenceEmbeddingConfig,
    normalize_vectors,
    pool_hidden_states,
)

if TYPE_CHECKING:
    from mlx_integrations.embeddings.bert import BertModel

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "POOLING_MODES",
    "EmbedOptions",
    "EmbeddingDtype",
    "EmbeddingEngine",
    "EmbeddingModelInfo",
    "EmbeddingTruncationWarning",
    "PoolingMode",
    "SentenceEmbeddingConfig",
    "clear_embedding_engines",
    "get_embedding_engine",
    "plan_batches",
    "resolve_embedding_model",
]

EmbeddingDtype = EncoderDtype
DEFAULT_BATCH_SIZE = 32


class EmbedOptions(TypedDict, total=False):
    """Keyword options of :meth:`EmbeddingEngine.embed` and :meth:`EmbeddingEngine.aembed`."""

    prompt: str
    """Text put before every input (e.g. ``"query: "`` for e5 models); default ``""``."""
    batch_size: int
    """How many texts run through the model at once; default ``DEFAULT_BATCH_SIZE``."""
    pooling: PoolingMode | None
    """Override the model's pooling mode."""
    normalize: bool | None
    """Override whether vectors are scaled to unit length."""
    max_length: int | None
    """A lower token limit than the model's; longer inputs are truncated."""


class EmbeddingTruncationWarning(UserWarning):
    """Issued when inputs are longer than the model's limit and were truncated."""


@dataclass(frozen=True)
class EmbeddingModelInfo:
    """What an :class:`EmbeddingEngine` serves, for adapters and users to inspect."""

    path: Path
    """The resolved model folder."""
    dimension: int
    """The length of each embedding vector."""
    max_length: int
    """Inputs longer than this many tokens (special tokens included) are truncated."""
    pooling: PoolingMode
    """The model's pooling mode."""
    normalize: bool
    """Whether the model's vectors are unit length."""
    prompts: dict[str, str]
    """Named prompts from the model's sentence-transformers config."""
    default_prompt_name: str | None
    """The prompt the model applies when none is given, if any."""
    dtype: EmbeddingDtype
    """The floating point type of the forward pass."""

    def prompt_for(self, role: Literal["query", "document"]) -> str:
        """The model's own prompt for queries or documents, or ``""`` when it has none.

        e5-style models name theirs ``query``/``passage``; others ``query``/``document``.
        """
        names = ("query",) if role == "query" else ("document", "passage", "text")
        for name in names:
            if name in self.prompts:
                return self.prompts[name]
        if self.default_prompt_name:
            return self.prompts.get(self.default_prompt_name, "")
        return ""


class EmbeddingEngine(EncoderEngine):
    """An embedding model on its own owner thread, callable from any thread or loop.

    Prefer :func:`get_embedding_engine`, which shares one engine per model folder.

    The model loads when the engine is made and stays loaded until :meth:`close`, or
    until it has been idle for ``keep_alive`` (or is the least recently used idle model
    when another needs room within ``MLXI_MAX_MEMORY``); the next call loads it again.

    Examples:
        >>> from mlx_integrations.embeddings.engine import get_embedding_engine
        >>> engine = get_embedding_engine("/path/to/all-MiniLM-L6-v2")  # doctest: +SKIP
        >>> vectors = engine.embed(["MLX runs on Apple silicon.", "So does this."])
        ... # doctest: +SKIP
        >>> len(vectors), len(vectors[0])  # doctest: +SKIP
        (2, 384)
    """

    kind = "embedding"
    _model: BertModel | None
    info: EmbeddingModelInfo

    def check_max_length(self, max_length: int | None, name: object) -> None:
        """Refuse a ``max_length`` above the model's limit (``name`` is the user's model name)."""
        limit = self.info.max_length
        if max_length is not None and max_length > limit:
            raise ValueError(
                f"max_length {max_length} exceeds the limit of {name!r} "
                f"({limit} tokens); use at most {limit}."
            )

    def embed(self, texts: Sequence[str], **options: Unpack[EmbedOptions]) -> list[list[float]]:
        """Embed texts, blocking the calling thread only.

        Args:
            texts: The texts, in order; the result has one vector per text.
            **options: See :class:`EmbedOptions`: ``prompt`` (text put before every
                input, e.g. ``"query: "`` for e5 models), ``batch_size`` (texts run
                through the model at once), ``pooling`` and ``normalize`` (override the
                model's), ``max_length`` (a lower token limit than the model's).

        Returns:
            One vector (a list of floats) per text.

        Raises:
            TypeError: When ``texts`` is a string or holds a non-string.
            ValueError: For a bad batch size, pooling mode or max length.
        """
        request = self._request(texts, **options)
        vectors, truncated = self._submit(self._run, request).result()
        self._warn_truncated(truncated, len(request.texts), request.max_length)
        return vectors

    async def aembed(
        self, texts: Sequence[str], **options: Unpack[EmbedOptions]
    ) -> list[list[float]]:
        """Embed texts without blocking the event loop; arguments as in :meth:`embed`."""
        request = self._request(texts, **options)
        vectors, truncated = await asyncio.wrap_future(self._submit(self._run, request))
        self._warn_truncated(truncated, len(request.texts), request.max_length)
        return vectors

    # -- caller side -------------------------------------------------------------------

    def _request(
        self,
        texts: Sequence[str],
        *,
        prompt: str = "",
        batch_size: int = DEFAULT_BATCH_SIZE,
        pooling: PoolingMode | None = None,
        normalize: bool | None = None,
        max_length: int | None = None,
    ) -> _Request:
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise TypeError(
                f"texts must be a list of strings, not {type(texts).__name__}; "
                "wrap a single text in a list."
            )
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"texts[{i}] is a {type(text).__name__}, not a str.")
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str, not {type(prompt).__name__}.")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}.")
        if pooling is not None and pooling not in POOLING_MODES:
            raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}, not {pooling!r}.")
        limit = self.info.max_length
        if max_length is not None:
            if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
                raise ValueError(f"max_length must be an integer >= 2, not {max_length!r}.")
            if max_length > limit:
                raise ValueError(
                    f"max_length {max_length} exceeds the limit of {self.path.name} "
                    f"({limit} tokens); use at most {limit}."
                )
            limit = max_length
        return _Request(
            texts=[prompt + t for t in texts] if prompt else list(texts),
            batch_size=batch_size,
            pooling=pooling or self.info.pooling,
            normalize=self.info.normalize if normalize is None else bool(normalize),
            max_length=limit,
        )

    def _warn_truncated(self, truncated: int, total: int, limit: int) -> None:
        if truncated:
            warnings.warn(
                f"{truncated} of {total} texts are longer than {limit} tokens, the limit of "
                f"{self.path.name}; they were truncated to their first {limit} tokens.",
                EmbeddingTruncationWarning,
                stacklevel=3,
            )

    # -- owner thread ------------------------------------------------------------------

    def _load_model(self) -> EmbeddingModelInfo:
        import mlx.core as mx

        # Only the tokenizer comes from transformers: its "PyTorch was not found" advice
        # does not apply, and is dropped (that message alone, not process-wide).
        AutoTokenizer = auto_tokenizer()

        from mlx_integrations.embeddings.bert import load_bert

        st_config = SentenceEmbeddingConfig.from_folder(self.path)
        folder = st_config.transformer_dir
        self._st_config = st_config
        self._model = load_bert(folder, dtype=getattr(mx, self.dtype))
        self._tokenizer = AutoTokenizer.from_pretrained(str(folder))
        config = self._model.config
        max_length = config.max_position_embeddings
        if config.positions_after_padding_id:  # positions pad+1 ... pad+n must exist
            max_length -= config.pad_token_id + 1
        if st_config.max_seq_length:
            max_length = min(max_length, int(st_config.max_seq_length))
        else:
            model_max = getattr(self._tokenizer, "model_max_length", None)
            if isinstance(model_max, int) and 0 < model_max < max_length:
                max_length = model_max
        return EmbeddingModelInfo(
            path=self.path,
            dimension=config.hidden_size,
            max_length=max_length,
            pooling=st_config.pooling,
            normalize=st_config.normalize,
            prompts=dict(st_config.prompts),
            default_prompt_name=st_config.default_prompt_name,
            dtype=self.dtype,
        )

    def _run(self, request: _Request) -> tuple[list[list[float]], int]:
        import numpy as np

        texts = request.texts
        if not texts:
            return [], 0
        if self._st_config.do_lower_case:
            texts = [t.lower() for t in texts]
        enc = self._tokenizer(texts, truncation=True, max_length=request.max_length)
        ids: list[list[int]] = enc["input_ids"]
        types: list[list[int]] | None = enc.get("token_type_ids")
        truncated = self._count_truncated(texts, ids, request.max_length)
        lengths = [len(x) for x in ids]
        batches = split_batches(plan_batches(lengths, request.batch_size), lengths)

        def forward(batch: list[int]) -> Any:
            rows = [ids[i] for i in batch]
            return self._embed_batch(rows, [types[i] for i in batch] if types else None, request)

        out = np.zeros((len(texts), self.info.dimension), dtype=np.float32)
        for batch, vectors in zip(batches, self._forward_all(batches, forward), strict=True):
            out[batch] = vectors
        return out.tolist(), truncated

    def _embed_batch(
        self, ids: list[list[int]], types: list[list[int]] | None, request: _Request
    ) -> Any:
        import mlx.core as mx

        assert self._model is not None
        input_ids, mask, token_types = pad_right(ids, types, self._tokenizer.pad_token_id or 0)
        hidden = self._model(input_ids, attention_mask=mask, token_type_ids=token_types)
        pooled = pool_hidden_states(hidden.astype(mx.float32), mask, request.pooling)
        return normalize_vectors(pooled) if request.normalize else pooled

    def _count_truncated(self, texts: list[str], ids: list[list[int]], limit: int) -> int:
        # Only texts that filled the limit can have been cut; count their full lengths.
        candidates = [t for t, row in zip(texts, ids, strict=True) if len(row) >= limit]
        if not candidates:
            return 0
        full = self._tokenizer(candidates, truncation=False, verbose=False)["input_ids"]
        return sum(len(row) > limit for row in full)


def plan_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Group inputs into batches of similar token lengths, longest first.

    A batch holds at most ``batch_size`` inputs, and a new one starts when the next
    input is less than half as long as the batch's longest (and at least 16 tokens
    shorter), so one long text does not make a whole batch pad to its length.

    Args:
        lengths: The token count of each input.
        batch_size: The most inputs in one batch.

    Returns:
        Batches of input indices; together they hold every index once.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        n = lengths[i]
        split = bool(current) and 2 * n < longest and longest - n >= 16
        if current and (len(current) >= batch_size or split):
            batches.append(current)
            current = []
        if not current:
            longest = n
        current.append(i)
    if current:
        batches.append(current)
    return batches


@dataclass(frozen=True)
class _Request:
    texts: list[str]
    batch_size: int
    pooling: PoolingMode
    normalize: bool
    max_length: int


# -- the process-wide pool ---------------------------------------------------------------


def resolve_embedding_model(name: str | os.PathLike[str]) -> Path:
    """Turn a model name into a model folder, as the chat engines do.

    Args:
        name: A model folder, a store name or alias, or a Hugging Face repo id already
            pulled with ``mlxi pull`` (or present in the Hugging Face cache).

    Returns:
        The resolved folder.

    Raises:
        FileNotFoundError: When nothing by that name exists locally; the message says
            how to get it.
    """
    from mlx_integrations.models.resolve import resolve_model_path

    return resolve_model_path(os.fspath(name) if isinstance(name, os.PathLike) else name)


def get_embedding_engine(
    model: str | os.PathLike[str], *, dtype: EmbeddingDtype = "float32", keep_alive: Any = None
) -> EmbeddingEngine:
    """Return the process-wide engine for a model, loading it on first use.

    Engines are keyed by resolved model folder and dtype, so every caller that names
    the same model shares one copy of its weights.

    Args:
        model: A model name (see :func:`resolve_embedding_model`).
        dtype: The floating point type of the forward pass.
        keep_alive: Set the shared engine's keep-alive (seconds or ``"5m"``; 0: unload
            after each call; -1: keep loaded); None leaves it as it is.

    Returns:
        An engine (its model loaded unless it was unloaded while idle).
    """
    return shared(EmbeddingEngine, resolve_embedding_model(model), dtype, keep_alive)


def clear_embedding_engines() -> int:
    """Close every pooled engine and free its weights.

    Adapter objects that still hold a closed engine load a fresh one on their next call.

    Returns:
        How many engines were closed.
    """
    return clear_encoder_engines(EmbeddingEngine)
