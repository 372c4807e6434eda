"""``mlxi serve`` (the HTTP server), ``mlxi stop``, and ``mlxi ps`` asking a running server.

The server itself is :mod:`mlx_integrations.serve`; this module parses the command
line into a :class:`~mlx_integrations.serve.config.ServeConfig` and talks to a running
server's ``/api/ps`` and ``/api/stop`` with the standard library (no import of the
server's dependencies).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer
from mlx_integrations.cli.errors import handle_errors, print_error
from mlx_integrations.cli.options import JSON_OPTION
from mlx_integrations.cli.output import (
    Result,
    Table,
    loaded_models_result,
    prints_result,
    residency_columns,
)

SERVER_VARIABLE = "MLXI_SERVER"
"""The base URL of the server ``mlxi ps`` and ``mlxi stop`` talk to."""


def default_server_url() -> str:
    """``MLXI_SERVER``, else the address ``mlxi serve`` binds by default (``MLXI_HOST``
    and ``MLXI_PORT`` taken into account)."""
    url = os.environ.get(SERVER_VARIABLE)
    if url:
        return url.rstrip("/")
    host = os.environ.get("MLXI_HOST") or "127.0.0.1"
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://{host}:{os.environ.get('MLXI_PORT') or 8000}"


def _split(values: list[str]) -> list[str]:
    """Repeated options, each also taking a comma-separated list."""
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


@handle_errors
def serve(
    models: list[str] = typer.Argument(
        None, help="Models to load at start (store name, alias, repo id or folder)."
    ),
    host: str | None = typer.Option(
        None, "--host", envvar="MLXI_HOST", help="Address to bind (default 127.0.0.1)."
    ),
    port: int | None = typer.Option(
        None, "--port", "-p", envvar="MLXI_PORT", help="TCP port (default 8000)."
    ),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar="MLXI_API_KEY",
        show_envvar=False,
        help="Require this key (Authorization: Bearer KEY or x-api-key); default MLXI_API_KEY.",
    ),
    config_file: Path | None = typer.Option(
        None,
        "--config",
        "-c",
        envvar="MLXI_SERVE_CONFIG",
        help="TOML or JSON file: per-model engines and options, defaults.",
    ),
    engine_type: str | None = typer.Option(
        None, "--engine-type", help="simple, batched (default) or distributed."
    ),
    keep_alive: str | None = typer.Option(
        None,
        "--keep-alive",
        help="How long an idle model stays loaded: 5m (default), 1h, 0, -1 (forever).",
    ),
    max_memory: str | None = typer.Option(
        None,
        "--max-memory",
        help="Memory budget of all models together: 8GB, 0.6 (of the device), off; idle "
        "models are unloaded to make room (default MLXI_MAX_MEMORY, else none).",
    ),
    max_num_seqs: int | None = typer.Option(
        None, "--max-num-seqs", help="Most requests decoded together (batched engine; default 32)."
    ),
    admission: str | None = typer.Option(
        None,
        "--admission",
        help="wait (queue requests, default) or fail_fast (503 with Retry-After when full).",
    ),
    prompt_lookup: int | None = typer.Option(
        None, "--prompt-lookup", help="Draft up to N tokens from matches in the context."
    ),
    draft_model: str | None = typer.Option(
        None, "--draft-model", help="A small model of the same family that drafts tokens."
    ),
    kv_bits: int | None = typer.Option(None, "--kv-bits", help="Quantize the KV cache to N bits."),
    cache_memory_mb: float | None = typer.Option(
        None, "--cache-memory-mb", help="Prefix cache budget per model (default 1024)."
    ),
    cache_dir: Path | None = typer.Option(
        None, "--cache-dir", help="Folder of the prefix cache's disk tier."
    ),
    max_tokens: int | None = typer.Option(
        None, "--max-tokens", help="Reply length when a request sets none (default: context)."
    ),
    max_body_mb: float | None = typer.Option(
        None, "--max-body-mb", help="Largest request body in MiB (default 32); larger get 413."
    ),
    max_concurrent_requests: int | None = typer.Option(
        None, "--max-concurrent-requests", help="Requests in flight at once; more get 429."
    ),
    only_listed: bool = typer.Option(
        False, "--only-listed", help="Serve only the models named here or in --config."
    ),
    allowed_local_media_path: Path | None = typer.Option(
        None,
        "--allowed-local-media-path",
        help="Images may name local files under this folder (default: no local files).",
    ),
    allowed_media_domains: list[str] = typer.Option(
        [], "--allowed-media-domains", help="Hosts images may be fetched from (repeatable)."
    ),
    allow_private_media_urls: bool = typer.Option(
        False,
        "--allow-private-media-urls",
        help="Let image URLs reach loopback and private addresses.",
    ),
    shutdown_timeout: float | None = typer.Option(
        None,
        "--shutdown-timeout",
        help="Seconds replies in flight get to finish on SIGTERM (default 30); those still "
        "running then end with their API's closing event (at once on Ctrl-C).",
    ),
    stream_keepalive: float | None = typer.Option(
        None,
        "--stream-keepalive",
        help="Seconds of silence after which a stream gets a keep-alive while a long "
        "prompt is processed (default 10); its headers go out within this too.",
    ),
    responses_store_size: int | None = typer.Option(
        None,
        "--responses-store-size",
        help="Responses kept for previous_response_id (default 1000; 0 keeps none).",
    ),
    responses_ttl: str | None = typer.Option(
        None,
        "--responses-ttl",
        help="How long a kept response stays: 1h (default), 30m, seconds, -1 (no expiry).",
    ),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
) -> None:
    """Serve models over OpenAI-, Anthropic- and Ollama-compatible HTTP endpoints.

    Requests name a model by store alias, pulled Hub id or folder; the MODELS given
    load at start, any other loads at its first request and stays loaded for
    --keep-alive after its last. Endpoints: /v1/chat/completions, /v1/completions,
    /v1/embeddings, /v1/responses, /v1/rerank, /v1/models, /v1/messages (Anthropic), Ollama's
    /api/chat, /api/generate, /api/embed, /api/tags... on the same port (--port 11434
    for apps that assume Ollama's address), /health, /metrics; mlxi ps and mlxi stop
    talk to it. Binds 127.0.0.1 unless --host says
    otherwise; SIGTERM lets replies in flight finish. Under mlxi launch
    (mlxi launch -n 2 -- mlxi serve MODEL) the one MODEL is sharded over the ranks.
    """
    import asyncio

    _require_serve_extra()
    from mlx_integrations.serve.config import ServeConfig, models_from_names
    from mlx_integrations.serve.server import security_warnings
    from mlx_integrations.serve.server import serve as run_server

    options: dict[str, Any] = {
        "max_num_seqs": max_num_seqs,
        "admission": admission,
        "prompt_lookup": prompt_lookup,
        "draft_model": draft_model,
        "kv_bits": kv_bits,
        "cache_memory_mb": cache_memory_mb,
        "cache_dir": str(cache_dir) if cache_dir is not None else None,
    }
    given: dict[str, Any] = {
        "host": host,
        "port": port,
        "api_key": api_key or None,
        "engine_type": engine_type,
        "keep_alive": keep_alive,
        "max_memory": max_memory,
        "default_max_tokens": max_tokens,
        "max_body_mb": max_body_mb,
        "max_concurrent_requests": max_concurrent_requests,
        "only_listed": only_listed or None,
        "allowed_local_media_path": str(allowed_local_media_path)
        if allowed_local_media_path is not None
        else None,
        "allowed_media_domains": _split(allowed_media_domains) or None,
        "allow_private_media_urls": allow_private_media_urls or None,
        "shutdown_timeout_s": shutdown_timeout,
        "stream_keepalive_s": stream_keepalive,
        "responses_store_size": responses_store_size,
        "responses_ttl": responses_ttl,
        "engine_options": {k: v for k, v in options.items() if v is not None},
        "models": models_from_names(models or []),
    }
    config = ServeConfig(**{k: v for k, v in given.items() if v is not None})
    if config_file is not None:
        config = config.with_file(config_file)
    for warning in security_warnings(config):
        typer.secho(f"WARNING: {warning}", err=True, fg="red", bold=True)
    names = ", ".join(m.name for m in config.models if m.preload) or "no model preloaded"

    def announce(url: str) -> None:
        typer.echo(
            f"mlxi serve: {names} at {url} (OpenAI API: {url}/v1, Anthropic: {url}/v1/messages, "
            f"Ollama: {url}/api); Ctrl-C stops",
            err=True,
        )

    def stopped(line: str) -> None:
        typer.echo(f"mlxi serve: {line}", err=True)

    def loading(models: list[str]) -> None:
        typer.echo(f"mlxi serve: loading {', '.join(models)}; Ctrl-C stops", err=True)

    try:
        asyncio.run(
            run_server(
                config, log_level=log_level, announce=announce, stopped=stopped, loading=loading
            )
        )
    except KeyboardInterrupt:  # a second Ctrl-C while stopping: the first one said it
        pass
    except Exception as exc:
        from mlx_integrations.runtime.residency import ModelTooLarge
        from mlx_integrations.serve.errors import APIError

        if isinstance(exc, ModelTooLarge):  # a preloaded model over --max-memory
            print_error(
                str(exc),
                "start the server with a higher --max-memory, or serve a smaller or "
                "quantized model",
            )
            raise typer.Exit(1) from None
        if isinstance(exc, APIError):  # a preloaded model that is missing: its 404 text
            raise (FileNotFoundError if exc.status == 404 else ValueError)(exc.message) from None
        raise


def _require_serve_extra() -> None:
    """Stop with the install line when the server's dependencies are missing."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        print_error(
            f"mlxi serve needs the [serve] extra ({exc})",
            "pip install 'mlx-integrations[serve]'",
        )
        raise typer.Exit(1) from None


# ------------------------------------------------------------- talking to one


class ServerUnavailable(ConnectionError):
    """No mlxi server answers at the URL."""


def call_server(
    url: str, path: str, body: dict[str, Any] | None = None, timeout: float = 2.0
) -> Any:
    """A JSON request to a running server (``MLXI_API_KEY`` sent when set).

    Raises:
        ServerUnavailable: Nothing answers there, or not an mlxi server.
        RuntimeError: The server answered with an error (its message).
    """
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url.rstrip("/") + path, data=data, method="POST" if data else "GET"
    )
    request.add_header("Content-Type", "application/json")
    key = os.environ.get("MLXI_API_KEY")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except Exception:
            raise ServerUnavailable(
                f"{url} answered HTTP {exc.code}, not as an mlxi server"
            ) from None
        raise RuntimeError(message) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ServerUnavailable(f"no mlxi server answers at {url} ({exc})") from None


def server_models(url: str) -> list[dict[str, Any]] | None:
    """The models a running server holds (``GET /api/ps``), None when none answers."""
    try:
        data = call_server(url, "/api/ps", timeout=1.0)
    except ServerUnavailable:
        return None
    models = data.get("models") if isinstance(data, dict) else None
    return (
        [_served_row(m) for m in models if isinstance(m, dict)]
        if isinstance(models, list)
        else None
    )


def _served_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row of ``/api/ps`` as ``mlxi ps`` shows it: the served name (Ollama's
    ``name:latest`` without its tag) and ``expires_at`` in seconds since the epoch
    (Ollama's is a date)."""
    from datetime import datetime

    out = dict(row)
    name = out.get("name")
    if isinstance(name, str) and name.endswith(":latest"):
        out["name"] = name.removesuffix(":latest")
    expires = out.get("expires_at")
    if isinstance(expires, str):
        try:
            out["expires_at"] = datetime.fromisoformat(expires).timestamp()
        except ValueError:
            out["expires_at"] = None
    return out


def server_ps_result(url: str, models: list[dict[str, Any]]) -> Result:
    """``mlxi ps`` of a server: one row per model it holds in memory."""
    import time

    now = time.time()
    rows = [
        [m.get("name", "-"), m.get("kind", "-"), *residency_columns(m, now), m.get("path", "-")]
        for m in models
    ]
    headers = ["NAME", "KIND", "MEMORY", "LAST USED", "UNTIL", "PATH"]
    return Result(
        {"server": url, "models": models},
        [f"server {url}"],
        table=Table(headers, rows),
        names=[m.get("name", "") for m in models],
    )


@handle_errors
@prints_result
def stop(
    model: str = typer.Argument(..., help="The model's name as the server serves it."),
    server: str | None = typer.Option(
        None, "--server", help=f"The server's URL (default ${SERVER_VARIABLE} or 127.0.0.1:8000)."
    ),
    json_output: bool = JSON_OPTION,
) -> Result:
    """Unload a model from a running mlxi serve now (or once its requests end); the
    next request for it loads it again."""
    url = (server or default_server_url()).rstrip("/")
    try:
        data = call_server(url, "/api/stop", {"model": model}, timeout=60.0)
    except ServerUnavailable as exc:
        raise ConnectionError(f"{exc}; start one with: mlxi serve {model}") from None
    except RuntimeError as exc:
        raise ValueError(str(exc)) from None
    line = (
        f"stopped {model}"
        if data.get("unloaded")
        else f"{model} will unload once its requests in flight end"
    )
    return Result(data, [line])


@handle_errors
@prints_result
def ps(
    server: str | None = typer.Option(
        None,
        "--server",
        help=f"Ask this mlxi serve (default ${SERVER_VARIABLE} or 127.0.0.1:8000).",
    ),
    json_output: bool = JSON_OPTION,
) -> Result:
    """List the loaded models: a running mlxi serve's (when one answers), else the
    stored models that running processes have loaded (engines, mlxi run): memory held,
    last use, and until when each stays loaded (its keep-alive)."""
    url = (server or default_server_url()).rstrip("/")
    models = server_models(url)
    if models is not None:
        return server_ps_result(url, models)
    if server is not None:
        raise ConnectionError(f"no mlxi server answers at {url}; start one with: mlxi serve")
    from mlx_integrations.models.store import default_store

    return loaded_models_result(default_store().loaded())
