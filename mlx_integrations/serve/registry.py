"""The models a server serves: a request's model name to its engine, on first use.

Chat models come from the process's engine pool (:mod:`mlx_integrations.engine.pool`),
so residency (keep-alive, the memory budget, eviction) is the pool's; embedding models
from :func:`~mlx_integrations.embeddings.get_embedding_engine`, cross-encoders from
:func:`~mlx_integrations.embeddings.rerank_engine.get_rerank_engine` (an LLM reranker
is a chat model: it runs on a chat engine). The server holds one user of each engine
it made until it shuts down.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mlx_integrations.engine import pool
from mlx_integrations.engine.base import BaseEngine
from mlx_integrations.models.resolve import ENCODER_MODEL_TYPES, model_kind, resolve_model_path
from mlx_integrations.serve.config import SERVER_MAX_NUM_SEQS, ModelConfig, ServeConfig
from mlx_integrations.serve.errors import APIError

logger = logging.getLogger(__name__)

Kind = Literal["chat", "embedding", "reranker"]

__all__ = ["ModelRegistry", "Served", "how_to_get"]


@dataclass
class Served:
    """A model being served: its name in requests, its engine, its folder."""

    name: str
    kind: Kind
    engine: Any
    """A ``BaseEngine`` (chat), an ``EmbeddingEngine`` or a ``RerankEngine``."""
    path: Path
    config: ModelConfig
    pooled: bool = True
    """A chat engine taken from the pool (released when the server stops)."""


def folder_kind(path: Path) -> Kind:
    """What serves a model folder (:func:`~mlx_integrations.models.resolve.model_kind`):
    ``"reranker"`` for a cross-encoder, ``"embedding"`` for an encoder (BERT family) or
    a sentence-transformers folder, else ``"chat"`` (an LLM reranker included: a
    causal LM, it runs on a chat engine, for ``/v1/rerank`` as for chat)."""
    kind = model_kind(path)
    if kind != "reranker":
        return kind
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        config = None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    return "reranker" if model_type in ENCODER_MODEL_TYPES else "chat"


class ModelRegistry:
    """Names to engines for one server.

    Args:
        config: The server's settings (its models, default engine, keep-alive, media
            policy).
        engines: Engines already made, by name: served as they are (for embedding the
            server in a program that holds its engines; never stopped by the server).
    """

    def __init__(self, config: ServeConfig, engines: dict[str, BaseEngine] | None = None):
        self._config = config
        self._lock = threading.Lock()
        self._served: dict[str, Served] = {}
        self._stopped: set[str] = set()
        for name, engine in (engines or {}).items():
            path = Path(str(getattr(engine, "model_path", name)))
            self._served[name] = Served(
                name, "chat", engine, path, ModelConfig(name=name), pooled=False
            )

    @property
    def config(self) -> ServeConfig:
        return self._config

    # ------------------------------------------------------------- lookups

    def get(self, name: str, kind: Kind | None) -> Served:
        """The engine serving ``name``, made on first use (blocking: call it off the
        event loop). Its model loads at its first request (or :meth:`preload`).

        Args:
            name: The model, as requests name it.
            kind: The kind the endpoint serves; None takes any.

        Raises:
            APIError: 404 for a model that is not there (with how to get it), 400 for
                a model of another kind (an embedding model asked to chat...).
        """
        with self._lock:
            served = self._served.get(name)
            if served is None:
                served = self._make(name)
                self._served[name] = served
            elif name in self._stopped:
                self._apply_keep_alive(served)
            self._stopped.discard(name)
        if kind is not None and served.kind != kind:
            raise _wrong_kind(name, served.kind, kind)
        return served

    def _make(self, name: str) -> Served:
        config = self._config.model(name)
        if config is None:
            if self._config.only_listed:
                known = ", ".join(m.name for m in self._config.models) or "none"
                raise APIError(
                    404,
                    f"The model {name!r} is not served here; this server serves only: {known}",
                    param="model",
                    code="model_not_found",
                )
            config = ModelConfig(name=name)
        path = _resolve(name, config.target)
        kind: Kind = config.kind or folder_kind(path)  # type: ignore[assignment]
        keep_alive: Any = (
            config.keep_alive if config.keep_alive is not None else self._config.keep_alive
        )
        if kind == "embedding":
            from mlx_integrations.embeddings import get_embedding_engine

            engine = get_embedding_engine(path, keep_alive=keep_alive)
            return Served(name, kind, engine, path, config, pooled=False)
        if kind == "reranker":
            from mlx_integrations.embeddings.rerank_engine import get_rerank_engine

            engine = get_rerank_engine(path, keep_alive=keep_alive)
            return Served(name, kind, engine, path, config, pooled=False)
        options = {**self._config.engine_options, **config.options}
        engine_type = (
            config.engine_type
            or self._config.engine_type
            or pool.default_engine_type(path, options)
        )
        if engine_type in ("simple", "batched"):
            options.setdefault("media_policy", self._config.media_policy)
        if engine_type == "batched":
            options.setdefault("max_num_seqs", SERVER_MAX_NUM_SEQS)
        if engine_type == "distributed":
            keep_alive = None  # a distributed engine stays loaded
        engine = pool.acquire(
            config.target, engine_type=engine_type, keep_alive=keep_alive, **options
        )
        return Served(name, kind, engine, path, config)

    def _apply_keep_alive(self, served: Served) -> None:
        keep_alive = served.config.keep_alive
        if keep_alive is None:
            keep_alive = self._config.keep_alive
        if hasattr(type(served.engine), "keep_alive"):
            served.engine.keep_alive = keep_alive

    def served(self) -> list[Served]:
        """The models this server has made engines for, in the order first asked."""
        with self._lock:
            return list(self._served.values())

    def names(self) -> list[str]:
        """The model names to list: configured, then made, then the store's."""
        names = [m.name for m in self._config.models]
        names += [s.name for s in self.served()]
        if not self._config.only_listed:
            try:
                from mlx_integrations.models.store import list_models

                for model in list_models():
                    names += [model.name, *model.aliases]
            except Exception:  # an unreadable store lists nothing rather than failing
                logger.warning("The model store could not be listed", exc_info=True)
        return list(dict.fromkeys(names))

    # ---------------------------------------------------------- lifecycle

    async def preload(self) -> None:
        """Load the models marked ``preload`` (those named on the command line)."""
        import asyncio

        for model in self._config.models:
            if not model.preload:
                continue
            served = await asyncio.to_thread(self.get, model.name, None)
            if served.kind == "chat":
                await served.engine.start()
            logger.info("Loaded %s from %s", model.name, served.path)

    async def stop(self, name: str) -> dict[str, Any]:
        """Unload a model now, or as soon as its requests in flight end (as Ollama's
        ``keep_alive=0``); its next request loads it again.

        Raises:
            APIError: 404 when the server has no engine for that name.
        """
        import asyncio

        with self._lock:
            served = self._served.get(name)
            if served is not None:
                self._stopped.add(name)
        if served is None:
            loaded = ", ".join(s.name for s in self.served()) or "none"
            raise APIError(
                404,
                f"The model {name!r} is not loaded by this server (loaded: {loaded})",
                param="model",
                code="model_not_loaded",
            )
        engine = served.engine
        unload = getattr(engine, "unload_if_idle", None)
        unloaded = bool(await asyncio.to_thread(unload)) if unload is not None else False
        if not unloaded and hasattr(type(engine), "keep_alive"):
            try:
                engine.keep_alive = 0  # busy: it goes when its last request ends
            except ValueError:
                pass  # a distributed engine stays loaded
        unloaded = unloaded or not getattr(engine, "is_loaded", True)
        return {"model": name, "unloaded": unloaded, "pending": not unloaded}

    def running(self) -> list[dict[str, Any]]:
        """The models this server holds in memory: each name, its folder, kind and
        engine type, and its residency (memory, last use, keep-alive, expiry; the ``ResidencyStats`` keys)."""
        rows = []
        for served in self.served():
            stats = getattr(served.engine, "residency_stats", None)
            row: dict[str, Any] = dict(stats()) if stats is not None else {"state": "loaded"}
            if row.get("state") == "unloaded":
                continue
            row.update(
                name=served.name,
                model=served.config.target,
                path=str(served.path),
                kind=served.kind,
                engine_type=getattr(served.engine, "engine_type", None),
            )
            rows.append(row)
        return rows

    def close(self) -> None:
        """Let go of the pooled engines (the pool's keep-alive unloads them)."""
        with self._lock:
            served, self._served = list(self._served.values()), {}
        for item in served:
            if item.pooled:
                pool.release(item.engine)


def _resolve(name: str, target: str) -> Path:
    try:
        return resolve_model_path(target)
    except (FileNotFoundError, LookupError, ValueError, TypeError) as exc:
        detail = str(exc).rstrip(".")
        # The store's message may say already what to run (mlxi pull, mlxi list).
        hint = how_to_get(target) if "mlxi " not in detail else _IMPORT
        hint = "" if "mlxi pull" in detail else f"; {hint}"
        raise APIError(
            404,
            f"The model {name!r} does not exist here: {detail}{hint} (or list what is "
            "served: GET /v1/models)",
            param="model",
            code="model_not_found",
        ) from None


_IMPORT = "a model folder or GGUF file goes in with: mlxi import PATH NAME"


def how_to_get(name: str) -> str:
    """How a model that is not here can be had: ``mlxi pull`` for a Hub repo id, else
    the store's list or an import (a store name or folder cannot be pulled)."""
    from mlx_integrations.models.names import is_repo_id

    if is_repo_id(name):
        return f"pull it first: mlxi pull {name}"
    return f"mlxi list shows the store's names; {_IMPORT}"


_WHAT = {
    "chat": "a chat model",
    "embedding": "an embedding model",
    "reranker": "a reranker (a cross-encoder)",
}
_WHERE = {
    "chat": "POST /v1/chat/completions (or /v1/messages, /v1/responses)",
    "embedding": "POST /v1/embeddings",
    "reranker": "POST /v1/rerank",
}
_WANTED = {
    "chat": "a chat model",
    "embedding": "an embedding model (a BERT-family or sentence-transformers folder)",
    "reranker": "a cross-encoder (ms-marco-MiniLM, bge-reranker) or a chat model",
}


def _wrong_kind(name: str, kind: Kind, wanted: Kind) -> APIError:
    """A 400 for a model of another kind than the endpoint's: what it is, where to send
    it, and what to name here."""
    message = (
        f"The model {name!r} is {_WHAT[kind]}; send it to {_WHERE[kind]}, or name "
        f"{_WANTED[wanted]} here"
    )
    if kind == "embedding" and wanted == "chat":
        message = message.replace("; send", " and generates no text; send")
    return APIError(400, message, param="model", code="wrong_model_kind")
