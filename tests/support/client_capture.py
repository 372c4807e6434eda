"""A loopback server that records what a coding agent sends and answers it minimally.

:class:`CaptureServer` answers the three APIs the coding agents speak with the
smallest valid streamed reply (one text block saying ``Hello.``): Anthropic's Messages
(Claude Code), OpenAI's Responses (Codex) and chat completions (OpenCode, aider, llm).
It records every request (method, path, query, the headers that matter to a server,
the JSON body); ``python -m tests.support.client_capture BIN_DIR`` runs each client
once against it and keeps what it sent, trimmed, as the fixtures of
tests/serve/clients/. Nothing is forwarded anywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

REPLY_TEXT = "Hello."

# Headers a server may act on; the rest (host, lengths, tracing ids) are left out.
KEPT_HEADERS = (
    "accept",
    "anthropic-beta",
    "anthropic-dangerous-direct-browser-access",
    "anthropic-version",
    "authorization",
    "content-type",
    "openai-beta",
    "originator",
    "user-agent",
    "version",
    "x-api-key",
    "x-app",
    "x-stainless-retry-count",
    "x-stainless-timeout",
)
SECRET_HEADERS = ("authorization", "x-api-key")


@dataclass
class Recorded:
    """One request as the client sent it."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "headers": self.headers,
            "body": self.body,
        }


@dataclass
class CaptureServer:
    """Answer on ``http://127.0.0.1:<port>`` and record each request in ``requests``.

    Used as a context manager; ``url`` is ready inside the block.
    """

    model: str = "tiny"
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        capture = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _record(self) -> Recorded:
                parts = urlsplit(self.path)
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                body: Any = None
                if raw:
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        body = raw.decode(errors="replace")
                headers = {
                    k.lower(): ("<secret>" if k.lower() in SECRET_HEADERS else v)
                    for k, v in self.headers.items()
                    if k.lower() in KEPT_HEADERS
                }
                recorded = Recorded(
                    self.command, parts.path, dict(parse_qsl(parts.query)), headers, body
                )
                capture.requests.append(recorded)
                return recorded

            def _send(self, status: int, data: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _answer(self) -> None:
                recorded = self._record()
                status, data, kind = capture.reply(recorded)
                self._send(status, data, kind)

            do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _answer

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_port}"

    def __enter__(self) -> CaptureServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    # ------------------------------------------------------------------ replies

    def reply(self, request: Recorded) -> tuple[int, bytes, str]:
        """(status, body, content type) answering one request."""
        path = request.path.rstrip("/")
        body = request.body if isinstance(request.body, dict) else {}
        if request.method in ("GET", "HEAD") and path == "":
            return 200, b"ok", "text/plain"
        if path.endswith("/models") and request.method == "GET":
            card = {"id": self.model, "object": "model", "created": 0, "owned_by": "capture"}
            return 200, json.dumps({"object": "list", "data": [card]}).encode(), JSON
        if path.endswith("/messages/count_tokens"):
            return 200, json.dumps({"input_tokens": 10}).encode(), JSON
        stream = bool(body.get("stream"))
        if path.endswith("/messages"):
            return (
                (200, anthropic_stream(self.model), SSE)
                if stream
                else (
                    200,
                    json.dumps(anthropic_message(self.model)).encode(),
                    JSON,
                )
            )
        if path.endswith("/responses"):
            return 200, responses_stream(self.model), SSE
        if path.endswith("/chat/completions"):
            if stream:
                return 200, chat_stream(self.model), SSE
            return 200, json.dumps(chat_completion(self.model)).encode(), JSON
        error = {"error": {"message": f"not captured: {request.method} {request.path}"}}
        return 404, json.dumps(error).encode(), JSON


JSON = "application/json"
SSE = "text/event-stream"


def _sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    payload = data if isinstance(data, str) else json.dumps(data)
    return f"{head}data: {payload}\n\n".encode()


def anthropic_message(model: str) -> dict[str, Any]:
    return {
        "id": "msg_capture",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": REPLY_TEXT}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 2},
    }


def anthropic_stream(model: str) -> bytes:
    start = {**anthropic_message(model), "content": [], "stop_reason": None}
    events = [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": REPLY_TEXT},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 2},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(_sse(data, name) for name, data in events)


def responses_stream(model: str) -> bytes:
    part = {"type": "output_text", "text": REPLY_TEXT, "annotations": []}
    item = {
        "type": "message",
        "id": "msg_capture",
        "status": "completed",
        "role": "assistant",
        "content": [part],
    }
    response = {
        "id": "resp_capture",
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "model": model,
        "output": [],
        "usage": None,
    }
    done = {
        **response,
        "status": "completed",
        "output": [item],
        "usage": {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 2,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 12,
        },
    }
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response},
        {"type": "response.in_progress", "response": response},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**item, "status": "in_progress", "content": []},
        },
        {
            "type": "response.content_part.added",
            "item_id": "msg_capture",
            "output_index": 0,
            "content_index": 0,
            "part": {**part, "text": ""},
        },
        {
            "type": "response.output_text.delta",
            "item_id": "msg_capture",
            "output_index": 0,
            "content_index": 0,
            "delta": REPLY_TEXT,
        },
        {
            "type": "response.output_text.done",
            "item_id": "msg_capture",
            "output_index": 0,
            "content_index": 0,
            "text": REPLY_TEXT,
        },
        {
            "type": "response.content_part.done",
            "item_id": "msg_capture",
            "output_index": 0,
            "content_index": 0,
            "part": part,
        },
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": done},
    ]
    return b"".join(
        _sse({**event, "sequence_number": i}, event["type"]) for i, event in enumerate(events)
    )


def chat_completion(model: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-capture",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": REPLY_TEXT},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
    }


def chat_stream(model: str) -> bytes:
    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        return _sse(
            {
                "id": "chatcmpl-capture",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                **extra,
            }
        )

    usage = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
    return (
        chunk({"role": "assistant", "content": ""})
        + chunk({"content": REPLY_TEXT})
        + chunk({}, "stop", usage=usage)
        + _sse("[DONE]")
    )


# ------------------------------------------------------------ running a client

CLIENT_PREFIXES = ("ANTHROPIC_", "CLAUDE_", "OPENAI_", "CODEX_", "OPENCODE_", "MLXI_")


def client_environment(folder: Path, bin_dir: Path | None = None) -> dict[str, str]:
    """An environment that keeps a client away from the user's own settings and state:
    HOME and the XDG folders under ``folder``, no variable of any client or of mlxi,
    ``bin_dir`` first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLIENT_PREFIXES)}
    env["HOME"] = str(folder / "home")
    for name in ("CONFIG", "DATA", "CACHE", "STATE"):
        env[f"XDG_{name}_HOME"] = str(folder / "xdg" / name.lower())
    if bin_dir is not None:
        env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    (folder / "home").mkdir(parents=True, exist_ok=True)
    return env


def record(
    client: str,
    folder: Path,
    bin_dir: Path,
    *,
    prompt: str = "Say hello",
    extra_args: Sequence[str] = (),
    timeout: float = 300.0,
) -> dict[str, Any]:
    """Run ``client`` for one turn against a :class:`CaptureServer`; return a fixture:
    the client, its version, its command and every request it sent (untrimmed)."""
    from mlx_integrations.coding_agents import client_setup, get_client

    spec = get_client(client)
    env = client_environment(folder, bin_dir)
    work = folder / "work"
    work.mkdir(parents=True, exist_ok=True)
    version = subprocess.run(
        [spec.executable, "--version"], env=env, capture_output=True, text=True, timeout=60
    ).stdout.strip()
    with CaptureServer(model="tiny") as capture:
        setup = client_setup(
            spec,
            url=capture.url,
            model="tiny",
            args=[*spec.one_turn_args(prompt), *extra_args],
            profile=folder / "profile",
        )
        setup.write()
        done = subprocess.run(
            setup.command,
            env={**env, **setup.env},
            cwd=work,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    if done.returncode != 0:
        raise RuntimeError(
            f"{spec.title} exited with {done.returncode}: {done.stderr[-2000:]}{done.stdout[-2000:]}"
        )
    return {
        "client": spec.name,
        "version": version,
        "command": [spec.executable, *setup.command[1:]],
        "requests": [r.to_dict() for r in capture.requests],
        "_folder": str(folder),
    }


# ------------------------------------------------------------ trimming

TRIM_AT = 240
"""Strings longer than this are cut (the clients' prompts and tool descriptions)."""
KEPT_WHOLE = {"definition", "pattern", "syntax"}
"""Keys whose strings are kept whole: a custom tool's grammar, a schema's pattern."""
VOLATILE = {"prompt_cache_key", "user_id", "session_id", "thread_id", "turn_id", "root_turn_id"}


def trim(value: Any, key: str = "") -> Any:
    """``value`` with long strings cut and session identifiers replaced, every key
    and the structure of every schema kept."""
    if isinstance(value, dict):
        return {k: trim(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [trim(v, key) for v in value]
    if not isinstance(value, str):
        return value
    if key in VOLATILE or key.startswith("x-codex-"):
        return f"<{key}>"
    if len(value) > TRIM_AT and key not in KEPT_WHOLE:
        return value[:160] + f" [... {len(value) - 160} characters trimmed]"
    return value


def fixture(recorded: dict[str, Any]) -> dict[str, Any]:
    """A recording as it is kept: trimmed, with the temporary folder's path replaced."""
    folder = recorded["_folder"]
    text = json.dumps({k: v for k, v in recorded.items() if k != "_folder"})
    text = text.replace(folder, "/home/user/project")
    return trim(json.loads(text))


FIXTURES = {
    # fixture file: (client, extra arguments)
    "claude-code.json": ("claude", ()),
    "codex.json": ("codex", ()),
    # A model Codex's catalogue knows: it then sends apply_patch as a custom tool
    # with a Lark grammar, and a tool_search tool.
    "codex-gpt-5.5.json": ("codex", ("-m", "gpt-5.5")),
    "opencode.json": ("opencode", ()),
}


def main(argv: Sequence[str]) -> None:
    """``python -m tests.support.client_capture BIN_DIR [FIXTURE...]``: record the
    fixtures of tests/serve/clients/ again with the clients installed in BIN_DIR."""
    import tempfile

    bin_dir = Path(argv[0]).expanduser()
    out = Path(__file__).resolve().parents[1] / "serve" / "clients"
    for name in argv[1:] or list(FIXTURES):
        client, extra = FIXTURES[name]
        with tempfile.TemporaryDirectory() as tmp:
            recorded = record(client, Path(tmp), bin_dir, extra_args=extra)
        (out / name).write_text(json.dumps(fixture(recorded), indent=1) + "\n")
        print(f"{name}: {len(recorded['requests'])} requests ({recorded['version']})")


if __name__ == "__main__":
    main(sys.argv[1:])
