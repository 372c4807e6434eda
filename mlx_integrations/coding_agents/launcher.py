"""``mlxi code``'s work: point a coding agent at ``mlxi serve`` and run it.

:func:`plan_launch` decides everything without side effects (which server, the client's
settings, whether the model's window holds what the client sends);
:func:`launch` carries a plan out: it starts a server when none runs at the URL, writes
the client's settings into its profile, runs the client in this terminal, and stops the
server it started once the client exits.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlx_integrations.coding_agents.clients import (
    ClientSetup,
    CodingClient,
    client_setup,
    get_client,
    profile_dir,
)
from mlx_integrations.coding_agents.local_server import LocalServer, running_models, server_url

__all__ = [
    "ClientNotInstalled",
    "ContextCheck",
    "LaunchPlan",
    "check_context",
    "find_executable",
    "launch",
    "plan_launch",
    "run_client",
]


class ClientNotInstalled(FileNotFoundError):
    """The client's command is not on PATH; the message says how to install it."""


@dataclass(frozen=True)
class ContextCheck:
    """Whether a model's context window holds what a client sends before the user types.

    Attributes:
        client: The client.
        model: The model.
        window: The model's context window; None when unknown.
    """

    client: CodingClient
    model: str
    window: int | None

    @property
    def needed(self) -> int:
        """The client's first request and room for its reply, in tokens."""
        return self.client.context_needed

    @property
    def too_small(self) -> bool:
        """The window is known and smaller than :attr:`needed`."""
        return self.window is not None and self.window < self.needed

    def message(self) -> str | None:
        """One line saying the window is too small and what to do; None when it fits
        (or is unknown)."""
        if not self.too_small:
            return None
        advised = 1 << (self.needed - 1).bit_length()  # the next power of two
        return (
            f"{self.model} holds {self.window:,} tokens of context, and {self.client.title} "
            f"sends about {self.client.prompt_tokens:,} before you type: its requests will be "
            f"refused or cut; serve a model with a context of {advised // 1024}k or more"
        )


def check_context(client: str | CodingClient, model: str, window: int | None) -> ContextCheck:
    """Compare ``window`` (a model's context length) with what ``client`` needs.

    Examples:
        >>> check_context("claude", "smollm2-135m-instruct", 8192).too_small
        True
    """
    spec = client if isinstance(client, CodingClient) else get_client(client)
    return ContextCheck(spec, model, window)


@dataclass(frozen=True)
class LaunchPlan:
    """What :func:`launch` will do.

    Attributes:
        setup: The client's command, variables and settings files.
        server: The server to start; None when an ``mlxi serve`` already answers at
            ``setup.url`` (it is used as it is).
        context: The model's window against the client's needs.
    """

    setup: ClientSetup
    server: LocalServer | None
    context: ContextCheck

    @property
    def server_running(self) -> bool:
        """A server already answers at the URL."""
        return self.server is None

    def lines(self) -> list[str]:
        """The plan as shell lines (``mlxi code --config``)."""
        if self.server is None:
            server = f"# uses the mlxi serve running at {self.setup.url}"
        else:
            shown = shlex.join(["mlxi", *self.server.command[3:]])
            server = f"# starts: {shown}   (log: {self.server.log_path})"
        lines = self.setup.shell_lines()
        return [lines[0], server, *lines[1:]]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (``mlxi code --config --json``)."""
        return {
            **self.setup.to_dict(),
            "server_running": self.server is None,
            "server_command": None if self.server is None else self.server.command,
            "server_log": None if self.server is None else str(self.server.log_path),
            "context_needed": self.context.needed,
            "context_warning": self.context.message(),
        }


def _model_window(model: str) -> int | None:
    from mlx_integrations.models.info import show_model

    return show_model(model).context_length


def plan_launch(
    client: str | CodingClient,
    model: str | None = None,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    args: Sequence[str] = (),
    max_tokens: int | None = None,
    profile: Path | None = None,
) -> LaunchPlan:
    """Decide how to run ``client`` on ``model``; nothing is started or written.

    Args:
        client: ``claude``, ``codex`` or ``opencode``.
        model: A store name, pulled Hub id or folder (the server serves it under that
            name). None: the model a running server holds.
        host: The server's address.
        port: The server's port (default ``$MLXI_PORT``, else 8000). A server already
            answering there is used; otherwise one is started there.
        args: The client's own arguments.
        max_tokens: A cap on each reply (the clients' and the started server's).
        profile: The client's settings folder (default ``$MLXI_HOME/clients/<client>``).

    Raises:
        ValueError: No model given and none to take from a running server; a bad value.
        ModelNotFoundError: The model is nowhere here (and no running server to ask).
    """
    from mlx_integrations.models.errors import StoreError

    spec = client if isinstance(client, CodingClient) else get_client(client)
    url = server_url(host, port)
    api_key = os.environ.get("MLXI_API_KEY") or None
    loaded = running_models(url, api_key=api_key)
    if model is None or not model.strip():
        if not loaded:
            where = "the server at " + url if loaded is not None else "no server at " + url
            raise ValueError(
                f"name a model: mlxi code {spec.name} --model NAME ({where} holds none; "
                "mlxi list shows the store)"
            )
        model = loaded[0].name
    try:
        window = _model_window(model)
    except StoreError:
        if loaded is None:
            raise  # nothing here to serve it, and no server that might know the name
        # A name the running server knows (its config file, say): its window, if loaded.
        window = next((m.context_length for m in loaded if m.name == model), None)
    folder = profile if profile is not None else profile_dir(spec)
    setup = client_setup(
        spec,
        url=url,
        model=model,
        args=list(args),
        context_length=window,
        max_tokens=max_tokens,
        api_key=api_key,
        profile=folder,
    )
    server = None
    if loaded is None:
        server = LocalServer(
            model,
            host=host,
            port=int(url.rsplit(":", 1)[1]),
            log_path=folder / "server.log",
            max_tokens=max_tokens,
        )
    return LaunchPlan(setup, server, check_context(spec, model, window))


def find_executable(client: str | CodingClient, path: str | None = None) -> str:
    """The client's command on ``path`` (default ``$PATH``).

    Raises:
        ClientNotInstalled: It is not there; the message gives the npm command.
    """
    spec = client if isinstance(client, CodingClient) else get_client(client)
    found = shutil.which(spec.executable, path=path)
    if found is None:
        raise ClientNotInstalled(
            f"{spec.title} is not installed (no {spec.executable!r} on PATH); install it with: "
            f"npm install -g {spec.npm_package}"
        )
    return found


_STOPS = (signal.SIGTERM, signal.SIGHUP)
"""Signals that end this process, forwarded to the client (or ending the wait for the
server) so that the server it started is stopped, not left behind."""


@contextmanager
def _signals(handlers: Mapping[signal.Signals, Any]) -> Iterator[None]:
    """Set signal handlers for the block (only the main thread may; elsewhere none)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _exit_on(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def run_client(setup: ClientSetup, *, env: Mapping[str, str] | None = None) -> int:
    """Write the client's settings and run it in this terminal; return its exit code.

    Ctrl-C goes to the client (which decides what it means) while this process waits;
    SIGTERM and SIGHUP sent to this process are passed on to it.

    Args:
        setup: What to run.
        env: The environment the setup's variables go over (default ``os.environ``).

    Raises:
        ClientNotInstalled: The client is not on PATH.
    """
    base = dict(os.environ if env is None else env)
    full = {**base, **setup.env}
    executable = find_executable(setup.client, full.get("PATH"))
    setup.write()
    process: subprocess.Popen[bytes] | None = None

    def forward(signum: int, frame: Any) -> None:
        if process is not None and process.poll() is None:
            process.send_signal(signum)

    # A handler, not SIG_IGN: an ignored signal stays ignored in the client after exec,
    # a handled one is reset to its default there.
    with _signals({signal.SIGINT: lambda signum, frame: None, **dict.fromkeys(_STOPS, forward)}):
        process = subprocess.Popen([executable, *setup.command[1:]], env=full)
        code = process.wait()
    return 128 - code if code < 0 else code  # killed by a signal: 128 + its number


def launch(
    plan: LaunchPlan,
    *,
    env: Mapping[str, str] | None = None,
    start_timeout: float = 600.0,
    on_status: Callable[[str], None] | None = None,
) -> int:
    """Carry out ``plan``: a server if none runs, the client's settings, the client.

    Args:
        plan: From :func:`plan_launch`.
        env: The client's base environment (default ``os.environ``).
        start_timeout: Seconds the server has to load the model and answer.
        on_status: Called with one line at each step (the CLI prints them on stderr).

    Returns:
        The client's exit code.

    Raises:
        ClientNotInstalled: The client is not on PATH (checked before a server starts).
        ServerFailed: The server did not start; the message quotes its log.
    """
    say = on_status or (lambda line: None)
    find_executable(plan.setup.client, dict(os.environ if env is None else env).get("PATH"))
    server = plan.server
    if server is None:
        say(f"using the mlxi serve at {plan.setup.url}")
        return run_client(plan.setup, env=env)
    say(f"starting mlxi serve {plan.setup.model} at {server.url} (log: {server.log_path})")
    # Ctrl-C, SIGTERM or SIGHUP while the model loads stop the server too.
    with _signals(dict.fromkeys(_STOPS, _exit_on)):
        try:
            server.start(timeout=start_timeout)
            say(f"starting {plan.setup.client.title}")
            return run_client(plan.setup, env=env)
        finally:
            with contextlib.suppress(OSError):  # the terminal may be gone (SIGHUP)
                say("stopping mlxi serve")
            server.stop()
