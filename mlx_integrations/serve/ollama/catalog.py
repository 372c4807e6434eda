"""What Ollama's clients ask before they chat: is it running, which version, which
models (``/api/tags``), what one can do (``/api/show``), which are loaded (``/api/ps``).

``GET /`` answers ``Ollama is running`` in plain text, the probe Ollama's clients
send (a 200 is all the OpenAI and Anthropic clients' probes, Claude Code's ``HEAD /``
among them, look for). ``/api/ps`` is also what ``mlxi ps`` reads: each model is
Ollama's object (``name``, ``model``, ``size``, ``size_vram``, ``expires_at`` in
RFC 3339, ``details``, ``context_length``) with this server's residency figures beside
it (``kind``, ``path``, ``source``, ``engine_type``, ``memory_bytes``, ``last_used``,
``keep_alive_s``, ``expires_in_s``...). Where both name one thing, Ollama's meaning
is kept: ``model`` is the name (the folder or store name it was loaded from is
``source``), and ``expires_at`` is a date.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

import mlx_integrations
from mlx_integrations.serve.errors import APIError
from mlx_integrations.serve.ollama import protocol as wire
from mlx_integrations.serve.ollama.names import (
    ModelFacts,
    facts_of,
    iso_time,
    ollama_name,
    served_name,
    unknown_tag,
)
from mlx_integrations.serve.ollama.ndjson import json_answer
from mlx_integrations.serve.state import ServerState

logger = logging.getLogger(__name__)

__all__ = ["OLLAMA_VERSION", "ps", "root", "show", "tags", "version"]

OLLAMA_VERSION = "0.12.0"
"""The Ollama release whose API this server answers as (clients check a minimum)."""

RUNNING = "Ollama is running"


async def root(request: Request) -> Response:
    """``GET /`` and ``HEAD /``: ``Ollama is running`` while serving, 503 while draining."""
    state: ServerState = request.app.state.server
    if state.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    return PlainTextResponse(RUNNING)


async def version(request: Request) -> Response:
    """Answer ``GET /api/version``."""
    return json_answer(wire.Version(version=OLLAMA_VERSION, mlxi=mlx_integrations.__version__))


def _stamp(path: Path) -> int:
    """Changes when the folder's files do (a pull or a copy replaces the folder)."""
    try:
        return path.stat().st_mtime_ns + (path / "config.json").stat().st_mtime_ns
    except OSError:
        return 0


@functools.lru_cache(maxsize=256)
def _cached_facts(path: str, kind: str | None, stamp: int) -> ModelFacts:
    return facts_of(Path(path), kind)


def model_facts(state: ServerState, name: str) -> ModelFacts:
    """The facts of a model the server can serve, by its served name (blocking).

    Raises:
        APIError: 404 when the name is not served here or nothing has that name.
    """
    from mlx_integrations.models.resolve import resolve_model_path

    registry = state.registry
    served = {s.name: s for s in registry.served()}
    config = registry.config.model(name)
    kind: str | None = None
    if name in served:
        path, kind = served[name].path, served[name].kind
    else:
        if config is None and registry.config.only_listed:
            raise _not_found(name)
        target = config.target if config is not None else name
        kind = config.kind if config is not None else None
        try:
            path = resolve_model_path(target)
        except (LookupError, ValueError, TypeError, OSError):
            raise _not_found(name) from None
    return _cached_facts(str(path), kind, _stamp(path))


def _not_found(name: str) -> APIError:
    tagged = unknown_tag(name)
    if tagged is not None:
        return tagged
    return APIError(
        404,
        f"model {ollama_name(name)!r} not found; GET /api/tags lists the models, and "
        "POST /api/pull fetches one from the Hugging Face Hub (a repo id such as "
        "mlx-community/SmolLM2-135M-Instruct-8bit)",
        param="model",
        code="model_not_found",
    )


def _listing(state: ServerState) -> list[wire.ModelEntry]:
    entries = []
    for name in state.registry.names():
        try:
            entries.append(model_facts(state, name).entry(name))
        except Exception:  # one unreadable model leaves the others listed
            logger.warning("The model %r could not be described for /api/tags", name, exc_info=True)
    return entries


async def tags(request: Request) -> Response:
    """Answer ``GET /api/tags``: the models requests may name, each as ``name:latest``."""
    state: ServerState = request.app.state.server
    return json_answer(wire.Tags(models=await asyncio.to_thread(_listing, state)))


async def show(body: wire.ShowRequest, request: Request) -> Response:
    """Answer ``POST /api/show``: template, parameters, details, capabilities."""
    state: ServerState = request.app.state.server
    name = served_name(body.named)
    facts = await asyncio.to_thread(model_facts, state, name)
    return json_answer(facts.show())


def _running(state: ServerState) -> list[dict[str, Any]]:
    engines = {s.name: s.engine for s in state.registry.served()}
    rows = []
    for ours in state.registry.running():
        name = ours["name"]
        try:
            facts: ModelFacts | None = model_facts(state, name)
        except Exception:
            facts = None
        size = int(ours.get("memory_bytes") or (facts.size if facts else 0))
        expires = ours.get("expires_at")
        context = getattr(engines.get(name), "context_length", None)
        ollama = wire.RunningModel(
            name=ollama_name(name),
            model=ollama_name(name),
            size=size,
            digest=facts.digest if facts else "",
            details=facts.details if facts else wire.ModelDetails(),
            expires_at=iso_time(expires) if isinstance(expires, (int, float)) else None,
            size_vram=size,
            context_length=context if isinstance(context, int) else None,
        ).model_dump()
        rest = {k: v for k, v in ours.items() if k not in ollama and k != "model"}
        rows.append({**ollama, "source": ours.get("model"), **rest})
    return rows


async def ps(request: Request) -> Response:
    """Answer ``GET /api/ps``: the models in memory (Ollama's objects, with the
    residency figures ``mlxi ps`` shows)."""
    state: ServerState = request.app.state.server
    return json_answer(wire.RunningModels(models=await asyncio.to_thread(_running, state)))
