"""Coding agents (Claude Code, Codex, OpenCode) on local models through ``mlxi serve``.

``mlxi code CLIENT --model M`` is a call to this package: :func:`plan_launch` decides
which server to use (one running at the URL, or one to start) and the client's settings,
:func:`launch` carries it out. :func:`client_setup` alone gives the variables and
settings files that point a client at any server, for a manual setup.

- :mod:`.clients`: the clients, what each sends, and their settings;
- :mod:`.local_server`: the server found at a URL or started for the client;
- :mod:`.launcher`: the context check, the plan, and running it.

Examples:
    >>> from mlx_integrations.coding_agents import client_setup
    >>> setup = client_setup("claude", url="http://127.0.0.1:8000", model="qwen3-4b-q4")
    >>> setup.env["ANTHROPIC_BASE_URL"]
    'http://127.0.0.1:8000'
"""

from __future__ import annotations

from mlx_integrations.lazy_imports import lazy_attributes

__all__ = [
    "CLIENTS",
    "ClientNotInstalled",
    "ClientSetup",
    "CodingClient",
    "ContextCheck",
    "LaunchPlan",
    "LocalServer",
    "RunningModel",
    "ServerFailed",
    "check_context",
    "client_setup",
    "find_executable",
    "get_client",
    "launch",
    "plan_launch",
    "profile_dir",
    "run_client",
    "running_models",
]

_MODULES = {
    "CLIENTS": "clients",
    "ClientSetup": "clients",
    "CodingClient": "clients",
    "client_setup": "clients",
    "get_client": "clients",
    "profile_dir": "clients",
    "LocalServer": "local_server",
    "RunningModel": "local_server",
    "ServerFailed": "local_server",
    "running_models": "local_server",
    "ClientNotInstalled": "launcher",
    "ContextCheck": "launcher",
    "LaunchPlan": "launcher",
    "check_context": "launcher",
    "find_executable": "launcher",
    "launch": "launcher",
    "plan_launch": "launcher",
    "run_client": "launcher",
}

__getattr__ = lazy_attributes(
    __name__, {name: f"{__name__}.{module}" for name, module in _MODULES.items()}
)
