"""An ``mlxi serve`` for one coding agent: found running at its URL, or started and stopped.

The server runs as a process of its own (``python -m mlx_integrations.cli serve``), in
a session of its own, so the Ctrl-C a person types into the client's terminal never
reaches it, and its log goes to a file rather than over the client's screen. Only the
standard library speaks to it here (no import of the server's dependencies).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = ["LocalServer", "RunningModel", "ServerFailed", "running_models", "server_url"]

DEFAULT_PORT = 8000
STOP_TIMEOUT = 45.0
"""Seconds a stopped server gets to finish its replies and let go of its models."""


class ServerFailed(RuntimeError):
    """The server did not start, or stopped while starting; the message ends with the
    last lines of its log."""


def server_url(host: str = "127.0.0.1", port: int | None = None) -> str:
    """The base URL of a server on ``host`` at ``port`` (default ``$MLXI_PORT``, else 8000)."""
    if port is None:
        port = int(os.environ.get("MLXI_PORT") or DEFAULT_PORT)
    if not 0 < port < 65536:
        raise ValueError(f"port must be between 1 and 65535, got {port}")
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}"


def _get(url: str, path: str, api_key: str | None, timeout: float) -> Any:
    request = urllib.request.Request(url.rstrip("/") + path)
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@dataclass(frozen=True)
class RunningModel:
    """A model a running server holds in memory.

    Attributes:
        name: The name requests give it (the store name, repo id or folder it was
            loaded as).
        context_length: Its context window, when the server says.
    """

    name: str
    context_length: int | None = None


def running_models(
    url: str, *, api_key: str | None = None, timeout: float = 2.0
) -> list[RunningModel] | None:
    """The models an ``mlxi serve`` at ``url`` holds in memory, or None when no mlxi
    server answers there (nothing listens, or another kind of server)."""
    try:
        health = _get(url, "/health", None, timeout)  # Ollama has /api/ps, not this
        data = _get(url, "/api/ps", api_key, timeout)
        listed = _get(url, "/v1/models", api_key, timeout)
    except (urllib.error.URLError, OSError, ValueError):
        return None
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(health, dict) or "status" not in health or not isinstance(models, list):
        return None
    cards = listed.get("data") if isinstance(listed, dict) else None
    ids = {c.get("id") for c in cards if isinstance(c, dict)} if isinstance(cards, list) else set()
    found = []
    for row in models:
        name = row.get("name") if isinstance(row, dict) else None
        if not isinstance(name, str) or not name:
            continue
        # /api/ps names a model as Ollama does (name:tag, ":latest" when it has no tag);
        # requests give the name /v1/models lists.
        if name not in ids and name.endswith(":latest") and name[: -len(":latest")] in ids:
            name = name[: -len(":latest")]
        context = row.get("context_length")
        found.append(RunningModel(name, context if isinstance(context, int) else None))
    return found


class LocalServer:
    """``mlxi serve MODEL`` on ``host:port``, its output in ``log_path``.

    Used as a context manager: the block runs once the model is loaded and the server
    answers, and the server is stopped (SIGTERM, then SIGKILL after
    :data:`STOP_TIMEOUT`) when it ends.

    Args:
        model: The model to load at start.
        host: The address to bind.
        port: The port.
        log_path: Where the server's output goes (its folder is made).
        max_tokens: The reply length of requests that set none (``--max-tokens``).
        extra_args: More ``mlxi serve`` options.
    """

    def __init__(
        self,
        model: str,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        log_path: Path,
        max_tokens: int | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.url = server_url(host, port)
        self.log_path = Path(log_path)
        self.command = [
            sys.executable,
            "-m",
            "mlx_integrations.cli",
            "serve",
            model,
            "--host",
            host,
            "--port",
            str(port),
        ]
        if max_tokens is not None:
            self.command += ["--max-tokens", str(max_tokens)]
        self.command += list(extra_args)
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self, timeout: float = 600.0) -> str:
        """Start the server and wait until it answers; return its URL.

        Raises:
            ServerFailed: It exited, or did not answer within ``timeout`` seconds
                (then it is stopped); the message quotes the end of its log.
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._process = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the terminal's Ctrl-C goes to the client only
        )
        deadline = time.monotonic() + timeout
        api_key = os.environ.get("MLXI_API_KEY") or None
        while True:
            if self._process.poll() is not None:
                code = self._process.returncode
                self._close_log()
                raise ServerFailed(f"mlxi serve exited with code {code}. {self.log_tail()}")
            if running_models(self.url, api_key=api_key, timeout=1.0) is not None:
                return self.url
            if time.monotonic() > deadline:
                self.stop()
                raise ServerFailed(
                    f"mlxi serve did not answer at {self.url} within {timeout:.0f} s. "
                    f"{self.log_tail()}"
                )
            time.sleep(0.2)

    def stop(self) -> int | None:
        """Stop the server (if it runs); return its exit code."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._close_log()
        return process.returncode

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 12) -> str:
        """The last lines of the server's log, introduced by its path."""
        try:
            text = self.log_path.read_text(errors="replace").rstrip()
        except OSError:
            return f"(no log at {self.log_path})"
        tail = "\n".join(text.splitlines()[-lines:])
        return f"The end of its log ({self.log_path}):\n{tail}" if tail else "Its log is empty."

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
