"""Ollama's replies: one JSON object, or newline-delimited JSON objects as they come.

A streamed reply is ``application/x-ndjson``: one object a line, the last one with
``"done": true`` and the counters (``prompt_eval_count``, ``eval_count``, durations in
nanoseconds, ``done_reason``). An error met after the first line is one more line,
``{"error": "..."}``, which Ollama's clients raise. A client that goes away stops the
request between two tokens, as on the other endpoints.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from mlx_integrations.chat.completion import Finished
from mlx_integrations.serve.errors import APIError, api_error
from mlx_integrations.serve.ollama import protocol as wire
from mlx_integrations.serve.ollama.names import iso_time
from mlx_integrations.serve.replies import Accepted
from mlx_integrations.serve.sse import EventStream

__all__ = ["Clock", "error_body", "error_line", "json_answer", "line", "ndjson_reply", "now_iso"]

NDJSON = "application/x-ndjson"


def line(body: BaseModel) -> bytes:
    """One object of a stream: its JSON and a newline."""
    return body.model_dump_json().encode() + b"\n"


def error_body(error: APIError) -> wire.ErrorBody:
    """``{"error": "..."}``, as Ollama answers: the message, after the field at fault
    when the message does not name it (Ollama's errors carry no separate field)."""
    message = error.message
    if error.param and error.param not in message:
        message = f"{error.param}: {message}"
    return wire.ErrorBody(error=message)


def error_line(exc: BaseException) -> bytes:
    """An error met after the stream began, as Ollama sends it."""
    return line(error_body(api_error(exc)))


def now_iso() -> str:
    """Now, RFC 3339 (an object's ``created_at``)."""
    return iso_time(time.time())


def json_answer(body: BaseModel, accepted: Accepted | None = None) -> Response:
    """``body`` as one JSON object (Ollama's answer with ``"stream": false``)."""
    headers = accepted.headers if accepted is not None else None
    return Response(body.model_dump_json(), media_type="application/json", headers=headers)


def ndjson_reply(
    request: Request, lines: AsyncIterator[bytes], accepted: Accepted | None = None
) -> Response:
    """A stream of ``lines``; a client gone mid-stream is counted."""
    state = request.app.state.server
    endpoint = request.url.path

    def gone() -> None:
        state.metrics.add("client_disconnects_total", endpoint=endpoint)

    headers = {"content-type": NDJSON, **(accepted.headers if accepted is not None else {})}
    return EventStream(lines, on_error=error_line, on_disconnect=gone, headers=headers)


@dataclass
class Clock:
    """The durations of the last object: from when the request came, the model's load."""

    started_ns: int = field(default_factory=time.perf_counter_ns)
    load_ns: int = 0

    def counters(self, finished: Finished) -> dict[str, int | str]:
        """``done_reason``, the token counts and the durations (nanoseconds)."""
        total = time.perf_counter_ns() - self.started_ns
        prompt_ns = int(finished.ttft_s * 1e9)
        if finished.generation_tps > 0:
            eval_ns = int(finished.completion_tokens / finished.generation_tps * 1e9)
        else:
            eval_ns = max(total - self.load_ns - prompt_ns, 0)
        return {
            "done_reason": "length" if finished.finish_reason == "length" else "stop",
            "total_duration": total,
            "load_duration": self.load_ns,
            "prompt_eval_count": finished.prompt_tokens,
            "prompt_eval_duration": prompt_ns,
            "eval_count": finished.completion_tokens,
            "eval_duration": eval_ns,
        }
