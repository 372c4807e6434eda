"""Ollama's API on ``mlxi serve``, for the apps that know only it.

The endpoints (``/api/chat``, ``/api/generate``, ``/api/embed``, ``/api/embeddings``,
``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version``, ``/api/pull``,
``/api/delete``, ``/api/copy``, ``/api/create``, ``GET /``) are served on the server's
one port beside the OpenAI and Anthropic APIs, on the same engines: start the server
with ``--port 11434`` and an app that assumes Ollama's address works unchanged.

- :mod:`.protocol`: the requests and replies as Pydantic models;
- :mod:`.names`: ``name:tag`` to the store's names and back, and what clients read
  about a model (details, capabilities);
- :mod:`.requests`: a chat or generate body as the chat core's request;
- :mod:`.chat`: ``/api/chat`` and ``/api/generate``; :mod:`.ndjson`: their replies;
- :mod:`.embed`: embeddings; :mod:`.catalog`: ``/``, version, tags, show, ps;
- :mod:`.store`: pull, delete, copy (the model store), create (501);
- :mod:`.routes`: the routes, and Ollama's error shape.
"""

from mlx_integrations.lazy_imports import lazy_attributes

__all__ = ["GENERATING", "PATHS", "add_routes", "error_body", "is_ollama_path"]

# Resolved on first use, so that the modules here importing one another through this
# package never make a loop.
__getattr__ = lazy_attributes(
    __name__,
    {
        "GENERATING": "mlx_integrations.serve.ollama.routes",
        "PATHS": "mlx_integrations.serve.ollama.routes",
        "add_routes": "mlx_integrations.serve.ollama.routes",
        "error_body": "mlx_integrations.serve.ollama.ndjson",
        "is_ollama_path": "mlx_integrations.serve.ollama.routes",
    },
)
