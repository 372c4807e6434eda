"""Stateful Responses: the responses kept in memory, and continuing from one.

A response made with ``store`` (OpenAI's default) is kept with its conversation: the
input items it was given (those of the responses before it included), then its own
output. ``previous_response_id`` continues from there: the earlier input and output
items come before the new input (``instructions`` are not carried over, as OpenAI's
are not). The store is bounded: at most ``responses_store_size`` responses, each for
``responses_ttl`` after it was made; the oldest go first. ``GET`` and ``DELETE
/v1/responses/{id}`` read and remove one.

Nothing goes to disk: a restarted server knows no earlier response. The engines'
prefix cache reuses the KV of the earlier turn on its own where the rendered prompt
begins as the earlier one did (``usage.input_tokens_details.cached_tokens`` says how
many tokens it read).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from mlx_integrations.serve.errors import APIError
from mlx_integrations.serve.protocol import responses as wire
from mlx_integrations.serve.protocol.base import ReplyModel
from mlx_integrations.serve.replies import json_reply

__all__ = ["ResponseStore", "StoredResponse", "delete_response", "get_response"]


@dataclass
class StoredResponse:
    """A kept response and the conversation it answered."""

    response: wire.Response
    items: list[Any]
    """The input items it answered (the earlier responses' inputs and outputs first),
    without its ``instructions``."""
    expires: float
    """``time.monotonic()`` past which it is gone."""

    def conversation(self) -> list[Any]:
        """Its input items, then its output as input items: what a response that
        continues from it reads before its own input."""
        return [*self.items, *(as_input_item(item) for item in self.response.output)]


def as_input_item(item: Any) -> Any:
    """An output item as the input item that gives it back to the model."""
    if isinstance(item, wire.OutputMessage):
        text = "".join(part.text for part in item.content)
        content = [{"type": "output_text", "text": text}]
        return wire.MessageItem.model_validate(
            {"type": "message", "role": "assistant", "content": content}
        )
    if isinstance(item, wire.OutputFunctionCall):
        return wire.FunctionCallItem.model_validate(
            {
                "type": "function_call",
                "call_id": item.call_id,
                "name": item.name,
                "arguments": item.arguments,
            }
        )
    if isinstance(item, wire.OutputCustomToolCall):
        return wire.CustomToolCallItem.model_validate(
            {
                "type": "custom_tool_call",
                "call_id": item.call_id,
                "name": item.name,
                "input": item.input,
            }
        )
    return wire.ReasoningItem.model_validate({"type": "reasoning"})  # not shown again


class ResponseStore:
    """The kept responses of one server, by id: at most ``size``, each for ``ttl_s``
    seconds (``math.inf``: until pushed out by newer ones).

    Args:
        size: Most responses kept; 0 keeps none.
        ttl_s: Seconds a response is kept after it was made.
    """

    def __init__(self, size: int, ttl_s: float):
        self.size = size
        self.ttl_s = ttl_s
        self._kept: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._kept)

    def put(self, response: wire.Response, items: list[Any]) -> None:
        """Keep a finished response and the input items it answered."""
        if self.size <= 0:
            return
        expires = time.monotonic() + self.ttl_s if math.isfinite(self.ttl_s) else math.inf
        with self._lock:
            self._kept[response.id] = StoredResponse(response, list(items), expires)
            self._kept.move_to_end(response.id)
            self._expire()
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            self._expire()
            return self._kept.get(response_id)

    def delete(self, response_id: str) -> bool:
        with self._lock:
            self._expire()
            return self._kept.pop(response_id, None) is not None

    def _expire(self) -> None:
        now = time.monotonic()
        for response_id in [k for k, v in self._kept.items() if v.expires <= now]:
            del self._kept[response_id]

    def find(self, response_id: str, param: str | None = None) -> StoredResponse:
        """The kept response of that id.

        Raises:
            APIError: 404 naming the id, and why it may be missing.
        """
        stored = self.get(response_id)
        if stored is not None:
            return stored
        if self.size <= 0:
            why = "this server keeps none (--responses-store-size 0)"
        else:
            ttl = "" if not math.isfinite(self.ttl_s) else f" ({self.ttl_s:g} s)"
            why = (
                f"made with store: false, past --responses-ttl{ttl}, pushed out by "
                f"newer ones (--responses-store-size {self.size}), deleted, or made "
                "before the server restarted"
            )
        raise APIError(
            404,
            f"No response {response_id!r} is kept here ({why}); send the whole "
            "conversation in 'input' instead",
            param=param,
            code="response_not_found",
        )


class DeletedResponse(ReplyModel):
    """The answer of ``DELETE /v1/responses/{id}``."""

    id: str
    object: str = "response"
    deleted: bool = True


async def get_response(response_id: str, request: Request) -> Response:
    """Answer ``GET /v1/responses/{id}``: the kept response."""
    store: ResponseStore = request.app.state.server.responses
    return json_reply(store.find(response_id).response)


async def delete_response(response_id: str, request: Request) -> Response:
    """Answer ``DELETE /v1/responses/{id}``: the response is no longer kept."""
    store: ResponseStore = request.app.state.server.responses
    store.find(response_id)
    store.delete(response_id)
    return json_reply(DeletedResponse(id=response_id))
