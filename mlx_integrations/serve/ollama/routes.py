"""The Ollama routes of the app, and Ollama's error shape (``{"error": "..."}``)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from mlx_integrations.serve.ollama import catalog, chat, embed, store
from mlx_integrations.serve.ollama import protocol as wire
from mlx_integrations.serve.ollama.ndjson import error_body

__all__ = ["GENERATING", "PATHS", "add_routes", "error_body", "is_ollama_path"]

GENERATING = frozenset({"/api/chat", "/api/generate", "/api/embed", "/api/embeddings"})
"""The Ollama endpoints that run a model (counted by ``--max-concurrent-requests``)."""

PATHS = frozenset(
    {
        *GENERATING,
        "/api/tags",
        "/api/show",
        "/api/ps",
        "/api/version",
        "/api/pull",
        "/api/delete",
        "/api/copy",
        "/api/create",
    }
)
"""Every Ollama endpoint (their errors take Ollama's shape)."""

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": wire.ErrorBody, "description": "An error"} for status in ("4XX", "5XX")
}
_NDJSON = "; with `stream: true` (the default), one object a line (`application/x-ndjson`)"


def is_ollama_path(path: str) -> bool:
    """An endpoint whose errors Ollama's clients read (``{"error": "..."}``)."""
    return path in PATHS


def add_routes(app: FastAPI) -> None:
    """Add Ollama's endpoints, and ``GET``/``HEAD /`` (``Ollama is running``)."""

    def route(path: str, handler: Any, method: str, reply: Any = None, **extra: Any) -> None:
        answers: dict[int | str, dict[str, Any]] = dict(_ERRORS)
        if reply is not None:
            answers[200] = {"model": reply, **extra}
        app.add_api_route(
            path, handler, methods=[method], tags=["Ollama"], responses=answers, response_model=None
        )

    app.add_api_route("/", catalog.root, methods=["GET", "HEAD"], include_in_schema=False)
    route(
        "/api/chat",
        chat.chat,
        "POST",
        wire.ChatResponse,
        description=f"The reply{_NDJSON}, the last with `done: true` and the counters.",
    )
    route(
        "/api/generate",
        chat.generate,
        "POST",
        wire.GenerateResponse,
        description=f"The reply{_NDJSON}, the last with `done: true` and the counters.",
    )
    route("/api/embed", embed.embed, "POST", wire.EmbedResponse)
    route("/api/embeddings", embed.embeddings, "POST", wire.EmbeddingsResponse)
    route("/api/tags", catalog.tags, "GET", wire.Tags)
    route("/api/show", catalog.show, "POST", wire.ShowResponse)
    route("/api/ps", catalog.ps, "GET", wire.RunningModels)
    route("/api/version", catalog.version, "GET", wire.Version)
    route(
        "/api/pull",
        store.pull,
        "POST",
        wire.Progress,
        description=f"`success`{_NDJSON}, Ollama's progress lines.",
    )
    route("/api/delete", store.delete, "DELETE")
    route("/api/copy", store.copy, "POST")
    route("/api/create", store.create, "POST")
