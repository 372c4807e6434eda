"""``GET /v1/models`` and ``GET /v1/models/{model}``: the models requests may name."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from mlx_integrations.serve.errors import APIError
from mlx_integrations.serve.protocol import openai as wire
from mlx_integrations.serve.registry import how_to_get
from mlx_integrations.serve.replies import json_reply
from mlx_integrations.serve.state import ServerState

__all__ = ["get_model", "list_models"]


async def list_models(request: Request) -> Response:
    """Answer ``GET /v1/models``: the configured models, the loaded ones, the store's."""
    state: ServerState = request.app.state.server
    names = await asyncio.to_thread(state.registry.names)
    created = int(state.started_at)
    return json_reply(wire.ModelList(data=[wire.Model(id=n, created=created) for n in names]))


async def get_model(model: str, request: Request) -> Response:
    """Answer ``GET /v1/models/{model}``."""
    state: ServerState = request.app.state.server
    names = await asyncio.to_thread(state.registry.names)
    if model not in names:
        raise APIError(
            404,
            f"The model {model!r} is not served here; GET /v1/models lists the models; "
            f"{how_to_get(model)}",
            param="model",
            code="model_not_found",
        )
    return json_reply(wire.Model(id=model, created=int(state.started_at)))
