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
import json
import os
import threading
import warnings
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

if TYPE_CHECKING:
    import mlx.core as mx

    from mlx_integrations.engine.bert_encoder import BertModel

PoolingMode = Literal["cls", "mean", "max", "mean_sqrt_len"]
EmbeddingDtype = Literal["float32", "float16", "bfloat16"]
POOLING_MODES: tuple[str, ...] = get_args(PoolingMode)
DEFAULT_BATCH_SIZE = 32

# sentence-transformers' Pooling config flags, in the order it reads them.
_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_POOLING_ALIASES = {"cls_token": "cls", "mean_tokens": "mean", "max_tokens": "max"}


class EmbeddingTruncationWarning(UserWarning):
    """Issued when inputs are longer than the model's limit and were truncated."""


@dataclass(frozen=True)
class SentenceEmbeddingConfig:
    """How a sentence-transformers model turns token states into one vector.

    Read from the model folder by :meth:`from_folder`; a folder without ``modules.json``
    (a plain Hugging Face encoder) gets sentence-transformers' defaults: mean pooling,
    no normalisation.
    """

    transformer_dir: Path
    """The folder holding ``config.json``, the weights and the tokenizer."""
    pooling: PoolingMode = "mean"
    """How token states are pooled into one vector."""
    normalize: bool = False
    """Whether vectors are scaled to unit length (a ``Normalize`` module is present)."""
    max_seq_length: int | None = None
    """The limit from ``sentence_bert_config.json``, in tokens, or None when unset."""
    do_lower_case: bool = False
    """Whether sentence-transformers lowercases text before tokenizing."""
    prompts: dict[str, str] = field(default_factory=dict)
    """Named prompts from ``config_sentence_transformers.json`` (e.g. ``query``)."""
    default_prompt_name: str | None = None
    """The prompt applied when none is given, if the model names one."""

    @classmethod
    def from_folder(cls, folder: Path) -> SentenceEmbeddingConfig:
        """Read the sentence-transformers configuration of a model folder.

        Raises:
            ValueError: For a module or pooling mode this engine does not implement.
        """
        modules_file = folder / "modules.json"
        if not modules_file.is_file():
            return cls(transformer_dir=folder, **_read_st_extras(folder, folder))
        modules = _read_json(modules_file)
        transformer_dir = folder
        pooling: PoolingMode | None = None
        normalize = False
        for module in modules:
            kind = str(module.get("type", "")).rsplit(".", 1)[-1]
            path = folder / module.get("path", "")
            # "BERT" is what sentence-transformers 0.x called the Transformer module.
            if kind in ("Transformer", "BERT"):
                transformer_dir = path
            elif kind == "Pooling":
                pooling = _read_pooling(path / "config.json")
            elif kind == "Normalize":
                normalize = True
            else:
                raise ValueError(
                    f"{modules_file} lists a {module.get('type')!r} module, which the MLX "
                    "embedding engine does not implement (it supports Transformer, Pooling "
                    "and Normalize)."
                )
        return cls(
            transformer_dir=transformer_dir,
            pooling=pooling or "mean",
            normalize=normalize,
            **_read_st_extras(folder, transformer_dir),
        )


def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _read_pooling(config_file: Path) -> PoolingMode:
    if not config_file.is_file():
        raise ValueError(
            f"modules.json lists a Pooling module but {config_file} is missing, so the "
            "pooling mode is unknown; copy the whole sentence-transformers model folder, "
            f"including its {config_file.parent.name}/ subfolder."
        )
    raw = _read_json(config_file)
    if "pooling_mode" in raw:
        modes = [_POOLING_ALIASES.get(raw["pooling_mode"], raw["pooling_mode"])]
    else:
        modes = [mode for flag, mode in _POOLING_FLAGS.items() if raw.get(flag)]
    if raw.get("include_prompt") is False:
        raise ValueError(
            f"{config_file} excludes prompt tokens from pooling (include_prompt=false); "
            "the MLX embedding engine pools over every token."
        )
    if not modes:
        return "mean"
    if len(modes) > 1 or modes[0] not in POOLING_MODES:
        raise ValueError(
            f"Pooling {modes} in {config_file} is not supported; the MLX embedding engine "
            f"supports one of {', '.join(POOLING_MODES)}."
        )
    return modes[0]


def _read_st_extras(folder: Path, transformer_dir: Path) -> dict[str, Any]:
    extras: dict[str, Any] = {}
    bert_config = transformer_dir / "sentence_bert_config.json"
    if bert_config.is_file():
        raw = _read_json(bert_config)
        extras["max_seq_length"] = raw.get("max_seq_length")
        extras["do_lower_case"] = bool(raw.get("do_lower_case", False))
    st_config = folder / "config_sentence_transformers.json"
    if st_config.is_file():
        raw = _read_json(st_config)
        extras["prompts"] = dict(raw.get("prompts") or {})
        extras["default_prompt_name"] = raw.get("default_prompt_name")
    return extras


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


class EmbeddingEngine:
    """An embedding model on its own owner thread, callable from any thread or loop.

    Prefer :func:`get_embedding_engine`, which shares one engine per model folder.

    Example:
        >>> from mlx_integrations.engine.embedding import get_embedding_engine
        >>> engine = get_embedding_engine("/path/to/all-MiniLM-L6-v2")  # doctest: +SKIP
        >>> vectors = engine.embed(["MLX runs on Apple silicon.", "So does this."])
        ... # doctest: +SKIP
        >>> len(vectors), len(vectors[0])  # doctest: +SKIP
        (2, 384)
    """

    def __init__(self, path: str | os.PathLike[str], *, dtype: EmbeddingDtype = "float32"):
        """Load the model on a new owner thread; returns when it is ready.

        Args:
            path: A model folder (see the module docstring for what it holds).
            dtype: The floating point type of the forward pass.

        Raises:
            ValueError: For an unsupported model or an unknown dtype.
            FileNotFoundError: When the folder lacks config.json or weights.
        """
        if dtype not in get_args(EmbeddingDtype):
            raise ValueError(
                f"dtype must be one of {', '.join(get_args(EmbeddingDtype))}, not {dtype!r}."
            )
        self.path = Path(path).resolve()
        if not (self.path / "config.json").is_file() and not (self.path / "modules.json").is_file():
            raise FileNotFoundError(
                f"{self.path} is not a model folder: it has no config.json or modules.json."
            )
        self.dtype: EmbeddingDtype = dtype
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlxi-embed")
        self._closed = False
        self._model: BertModel | None = None
        self._tokenizer: Any = None
        # An engine dropped without close() still stops its thread and frees its streams.
        self._finalizer = weakref.finalize(self, _stop_owner_thread, self._executor, False)
        try:
            self.info: EmbeddingModelInfo = self._executor.submit(self._load).result()
        except BaseException:
            self.close()
            raise
        _register_exit_hook()
        _live_engines.add(self)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def embed(
        self,
        texts: Sequence[str],
        *,
        prompt: str = "",
        batch_size: int = DEFAULT_BATCH_SIZE,
        pooling: PoolingMode | None = None,
        normalize: bool | None = None,
        max_length: int | None = None,
    ) -> list[list[float]]:
        """Embed texts, blocking the calling thread only.

        Args:
            texts: The texts, in order; the result has one vector per text.
            prompt: Text put before every input (e.g. ``"query: "`` for e5 models).
            batch_size: How many texts run through the model at once.
            pooling: Override the model's pooling mode.
            normalize: Override whether vectors are scaled to unit length.
            max_length: A lower token limit than the model's; longer inputs are truncated.

        Returns:
            One vector (a list of floats) per text.

        Raises:
            TypeError: When ``texts`` is a string or holds a non-string.
            ValueError: For a bad batch size, pooling mode or max length.
        """
        request = self._request(texts, prompt, batch_size, pooling, normalize, max_length)
        vectors, truncated = self._submit(request).result()
        self._warn_truncated(truncated, len(request.texts), request.max_length)
        return vectors

    async def aembed(
        self,
        texts: Sequence[str],
        *,
        prompt: str = "",
        batch_size: int = DEFAULT_BATCH_SIZE,
        pooling: PoolingMode | None = None,
        normalize: bool | None = None,
        max_length: int | None = None,
    ) -> list[list[float]]:
        """Embed texts without blocking the event loop; arguments as in :meth:`embed`."""
        request = self._request(texts, prompt, batch_size, pooling, normalize, max_length)
        vectors, truncated = await asyncio.wrap_future(self._submit(request))
        self._warn_truncated(truncated, len(request.texts), request.max_length)
        return vectors

    def close(self) -> None:
        """Stop the owner thread after the work already submitted; frees the weights."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        self._executor.submit(self._unload)
        _stop_owner_thread(self._executor, True)

    # -- caller side -------------------------------------------------------------------

    def _request(
        self,
        texts: Sequence[str],
        prompt: str,
        batch_size: int,
        pooling: PoolingMode | None,
        normalize: bool | None,
        max_length: int | None,
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

    def _submit(self, request: _Request) -> Any:
        if self._closed:
            raise RuntimeError(f"The embedding engine for {self.path} is closed.")
        return self._executor.submit(self._run, request)

    def _warn_truncated(self, truncated: int, total: int, limit: int) -> None:
        if truncated:
            warnings.warn(
                f"{truncated} of {total} texts are longer than {limit} tokens, the limit of "
                f"{self.path.name}; they were truncated to their first {limit} tokens.",
                EmbeddingTruncationWarning,
                stacklevel=3,
            )

    # -- owner thread ------------------------------------------------------------------

    def _load(self) -> EmbeddingModelInfo:
        import mlx.core as mx
        from transformers import AutoTokenizer

        from mlx_integrations.engine.bert_encoder import load_bert

        st_config = SentenceEmbeddingConfig.from_folder(self.path)
        folder = st_config.transformer_dir
        self._st_config = st_config
        self._model = load_bert(folder, dtype=getattr(mx, self.dtype))
        self._tokenizer = AutoTokenizer.from_pretrained(str(folder))
        config = self._model.config
        max_length = config.max_position_embeddings
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

    def _unload(self) -> None:
        import mlx.core as mx

        self._model = None
        self._tokenizer = None
        mx.clear_cache()

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
        out = np.zeros((len(texts), self.info.dimension), dtype=np.float32)
        for batch in plan_batches([len(x) for x in ids], request.batch_size):
            out[batch] = self._embed_batch(
                [ids[i] for i in batch],
                [types[i] for i in batch] if types is not None else None,
                request,
            )
        return out.tolist(), truncated

    def _embed_batch(
        self, ids: list[list[int]], types: list[list[int]] | None, request: _Request
    ) -> Any:
        import mlx.core as mx
        import numpy as np

        assert self._model is not None
        # Right padding, as BERT expects; pooling and attention ignore the padded slots.
        width = max(len(row) for row in ids)
        pad_id = self._tokenizer.pad_token_id or 0
        ids_np = np.full((len(ids), width), pad_id, dtype=np.int32)
        mask_np = np.zeros((len(ids), width), dtype=np.int32)
        types_np = np.zeros((len(ids), width), dtype=np.int32)
        for row, seq in enumerate(ids):
            ids_np[row, : len(seq)] = seq
            mask_np[row, : len(seq)] = 1
            if types is not None:
                types_np[row, : len(seq)] = types[row]
        mask = mx.array(mask_np)
        hidden = self._model(
            mx.array(ids_np), attention_mask=mask, token_type_ids=mx.array(types_np)
        )
        pooled = pool_hidden_states(hidden.astype(mx.float32), mask, request.pooling)
        if request.normalize:
            pooled = normalize_vectors(pooled)
        return np.array(pooled)

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


def pool_hidden_states(hidden: mx.array, mask: mx.array, mode: PoolingMode) -> mx.array:
    """Pool token states into one vector per row, ignoring padding.

    Args:
        hidden: Token states, shape ``(batch, length, dims)``.
        mask: 1 for real tokens and 0 for padding, shape ``(batch, length)``.
        mode: ``cls`` (first token), ``mean``, ``max`` or ``mean_sqrt_len`` (the sum
            divided by the square root of the token count), as sentence-transformers.

    Returns:
        Shape ``(batch, dims)``.
    """
    import mlx.core as mx

    if mode == "cls":
        return hidden[:, 0]
    weights = mask.astype(hidden.dtype)[..., None]
    if mode == "max":
        # sentence-transformers fills padding with -1e9 before the max.
        return mx.where(weights > 0, hidden, mx.array(-1e9, dtype=hidden.dtype)).max(axis=1)
    summed = (hidden * weights).sum(axis=1)
    counts = mx.maximum(weights.sum(axis=1), 1e-9)
    if mode == "mean":
        return summed / counts
    if mode == "mean_sqrt_len":
        return summed / mx.sqrt(counts)
    raise ValueError(f"Unknown pooling mode {mode!r}; use one of {', '.join(POOLING_MODES)}.")


def normalize_vectors(vectors: mx.array, eps: float = 1e-12) -> mx.array:
    """Scale rows to unit L2 length (rows of zeros stay zero), like torch's normalize."""
    import mlx.core as mx

    norms = mx.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / mx.maximum(norms, eps)


def _release_thread_streams() -> None:
    import mlx.core as mx

    # MLX needs a thread's streams destroyed before that thread ends, or the process
    # may abort at exit ("terminate called without an active exception").
    clear_streams = getattr(mx, "clear_streams", None)
    if clear_streams is not None:
        clear_streams()


def _stop_owner_thread(executor: ThreadPoolExecutor, wait: bool) -> None:
    try:
        executor.submit(_release_thread_streams)
    except RuntimeError:  # already shut down
        return
    executor.shutdown(wait=wait)


_live_engines: weakref.WeakSet[EmbeddingEngine] = weakref.WeakSet()
_exit_hook_registered = False


def _close_live_engines() -> None:
    for engine in list(_live_engines):
        engine.close()


def _register_exit_hook() -> None:
    # Owner threads must release their streams before the interpreter joins them, which
    # happens before atexit handlers run; threading's own exit hooks run early enough.
    global _exit_hook_registered
    if _exit_hook_registered:
        return
    _exit_hook_registered = True
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        register(_close_live_engines)
    else:
        import atexit

        atexit.register(_close_live_engines)


# -- the process-wide pool ---------------------------------------------------------------

_pool: dict[tuple[Path, str], EmbeddingEngine] = {}
_pool_lock = threading.Lock()


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
    from mlx_integrations.engine.loading import resolve_model_path

    return resolve_model_path(os.fspath(name) if isinstance(name, os.PathLike) else name)


def get_embedding_engine(
    model: str | os.PathLike[str], *, dtype: EmbeddingDtype = "float32"
) -> EmbeddingEngine:
    """Return the process-wide engine for a model, loading it on first use.

    Engines are keyed by resolved model folder and dtype, so every caller that names
    the same model shares one copy of its weights.

    Args:
        model: A model name (see :func:`resolve_embedding_model`).
        dtype: The floating point type of the forward pass.

    Returns:
        A loaded engine.
    """
    path = resolve_embedding_model(model)
    key = (path, dtype)
    with _pool_lock:
        engine = _pool.get(key)
        if engine is None or engine.closed:
            engine = EmbeddingEngine(path, dtype=dtype)
            _pool[key] = engine
        return engine


def clear_embedding_engines() -> int:
    """Close every pooled engine and free its weights.

    Adapter objects that still hold a closed engine load a fresh one on their next call.

    Returns:
        How many engines were closed.
    """
    with _pool_lock:
        engines = list(_pool.values())
        _pool.clear()
    for engine in engines:
        engine.close()
    return len(engines)
