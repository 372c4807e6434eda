"""The coding agents ``mlxi code`` starts, and the settings that point each at ``mlxi serve``.

Each client gets its settings in a profile folder of its own
(``$MLXI_HOME/clients/<client>``) and through environment variables given to its
process only, so the user's own settings (``~/.claude``, ``~/.codex``,
``~/.config/opencode``) are never written by the launch (OpenCode still reads its global
settings, under the profile's; the other two read only the profile):

- Claude Code speaks Anthropic's Messages API: ``ANTHROPIC_BASE_URL`` and a token,
  every model slot (main, Opus, Sonnet, Haiku, subagents) set to the local model,
  ``CLAUDE_CONFIG_DIR`` in the profile, and the non-essential traffic (telemetry, error
  reports, update checks) off, since the machine may be offline.
- Codex speaks OpenAI's Responses API: a custom ``model_provider`` in
  ``$CODEX_HOME/config.toml`` with ``wire_api = "responses"`` (the only one Codex
  takes now).
- OpenCode speaks chat completions: an ``@ai-sdk/openai-compatible`` provider in an
  ``opencode.json`` that ``OPENCODE_CONFIG`` names, with the model's context and reply
  limits so its compaction knows the window.

The token counts are what each client's first request held before the user typed
anything (system prompt, tools, the environment it describes), measured from a capture
of the request with SmolLM2's tokenizer; other tokenizers give within about 15%.
"""

from __future__ import annotations

import json
import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CLIENTS",
    "REPLY_HEADROOM",
    "ClientSetup",
    "CodingClient",
    "client_setup",
    "get_client",
    "profile_dir",
]

REPLY_HEADROOM = 4096
"""Tokens a window needs beyond a client's first request: the reply and a tool result."""

PROVIDER_ID = "mlxi"
"""The provider's name in Codex's and OpenCode's settings (``mlxi/MODEL`` in OpenCode)."""

DEFAULT_TOKEN = "mlxi"
"""What a client sends as its key when the server needs none (some refuse an empty one)."""

CODEX_BLOCK_START = "# >>> mlxi code: written at each launch; edits inside are replaced"
CODEX_BLOCK_END = "# <<< mlxi code"


@dataclass(frozen=True)
class CodingClient:
    """A coding agent that ``mlxi code`` knows how to start.

    Attributes:
        name: The name on the command line (``claude``, ``codex``, ``opencode``).
        title: The product's name, for messages.
        executable: The command it installs.
        npm_package: Where npm installs it from.
        api: The API it speaks to the server: ``anthropic``, ``responses`` or ``chat``.
        prompt_tokens: About how many tokens its first request holds before the user
            types (measured; see the module's docstring).
        one_turn: Arguments that make it answer one prompt and exit (``{prompt}`` is
            replaced), for scripts and tests.
    """

    name: str
    title: str
    executable: str
    npm_package: str
    api: str
    prompt_tokens: int
    one_turn: tuple[str, ...]

    @property
    def context_needed(self) -> int:
        """The smallest context window that holds the first request and its reply."""
        return self.prompt_tokens + REPLY_HEADROOM

    def one_turn_args(self, prompt: str) -> list[str]:
        """The arguments that answer ``prompt`` once and exit."""
        return [arg.replace("{prompt}", prompt) for arg in self.one_turn]


CLIENTS: dict[str, CodingClient] = {
    "claude": CodingClient(
        name="claude",
        title="Claude Code",
        executable="claude",
        npm_package="@anthropic-ai/claude-code",
        api="anthropic",
        # 2.1.197: 24 tools (64 KB of schemas, about 16,000 tokens) and the system prompt.
        prompt_tokens=21_000,
        one_turn=("-p", "{prompt}"),
    ),
    "codex": CodingClient(
        name="codex",
        title="Codex",
        executable="codex",
        npm_package="@openai/codex",
        api="responses",
        # 0.171.0: 17,000 characters of instructions, 9 tools.
        prompt_tokens=9_100,
        one_turn=("exec", "--skip-git-repo-check", "{prompt}"),
    ),
    "opencode": CodingClient(
        name="opencode",
        title="OpenCode",
        executable="opencode",
        npm_package="opencode-ai",
        api="chat",
        # 1.18.33: 10 tools and the system prompt (its title request holds about 600).
        prompt_tokens=7_600,
        one_turn=("run", "{prompt}"),
    ),
}


def get_client(name: str) -> CodingClient:
    """The client called ``name``.

    Raises:
        ValueError: No such client; the message lists those there are.
    """
    client = CLIENTS.get(name.strip().lower())
    if client is None:
        raise ValueError(
            f"unknown coding agent {name!r}; choose one of: {', '.join(CLIENTS)} "
            "(other clients: see the manual setups in docs/coding-agents.md)"
        )
    return client


def profile_dir(client: str | CodingClient, home: Path | None = None) -> Path:
    """The folder that holds one client's settings and state under ``mlxi code``:
    ``$MLXI_HOME/clients/<name>`` (``home`` replaces ``$MLXI_HOME``)."""
    from mlx_integrations.models.store import store_home

    name = client.name if isinstance(client, CodingClient) else get_client(client).name
    return (home or store_home()) / "clients" / name


@dataclass(frozen=True)
class ClientSetup:
    """How one client is started against one server: its command, the variables its
    process gets, and the files its settings live in.

    Attributes:
        client: The client.
        url: The server's base URL (no ``/v1``).
        model: The model's name as the server serves it.
        command: The executable and its arguments.
        env: Variables set for the client's process (over the caller's environment).
        files: Settings files to write, path to content. Files that the client also
            writes to itself (Claude Code's ``.claude.json``, Codex's ``config.toml``)
            are merged on :meth:`write`, not replaced.
        context_length: The model's context window, when known.
    """

    client: CodingClient
    url: str
    model: str
    command: list[str]
    env: dict[str, str]
    files: dict[Path, str] = field(default_factory=dict)
    context_length: int | None = None

    def write(self) -> list[Path]:
        """Write the settings files (merging where the client keeps its own state
        there); return their paths."""
        for path, content in self.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            old = path.read_text() if path.exists() else None
            new = _merged(path, old, content)
            if new != old:
                tmp = path.with_name(f".{path.name}.mlxi-tmp")
                tmp.write_text(new)
                tmp.replace(path)
        return list(self.files)

    def shell_lines(self) -> list[str]:
        """The setup as shell lines: each file, the variables, then the command."""
        lines = [f"# {self.client.title} on mlxi serve at {self.url} (model {self.model})"]
        for path, content in self.files.items():
            how = "merged into" if path.name in _MERGED else "written to"
            lines.append(f"# {how} {path}:")
            lines += [f"#   {line}" for line in content.rstrip("\n").splitlines()]
        lines += [f"export {key}={shlex.quote(value)}" for key, value in self.env.items()]
        lines.append(shlex.join(self.command))
        return lines

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (``mlxi code --config --json``)."""
        return {
            "client": self.client.name,
            "url": self.url,
            "model": self.model,
            "context_length": self.context_length,
            "command": list(self.command),
            "env": dict(self.env),
            "files": {str(path): content for path, content in self.files.items()},
        }


def client_setup(
    client: str | CodingClient,
    *,
    url: str,
    model: str,
    args: list[str] | tuple[str, ...] = (),
    context_length: int | None = None,
    max_tokens: int | None = None,
    api_key: str | None = None,
    profile: Path | None = None,
) -> ClientSetup:
    """The command, variables and settings files that point ``client`` at a server.

    Nothing is written or started: :meth:`ClientSetup.write` writes the files, and
    :func:`~mlx_integrations.coding_agents.launcher.run_client` runs the command.

    Args:
        client: ``claude``, ``codex`` or ``opencode`` (or a :class:`CodingClient`).
        url: The server's base URL, e.g. ``http://127.0.0.1:8000``.
        model: The model's name as the server serves it.
        args: Arguments for the client (its own options, a prompt...).
        context_length: The model's context window: the clients compact the
            conversation against it instead of their default (200k or more).
        max_tokens: A cap on each reply, where the client sets one itself (Claude Code
            and OpenCode ask for 32,000 tokens by default).
        api_key: The server's API key (``mlxi serve --api-key``); None when it needs
            none.
        profile: The client's settings folder (default :func:`profile_dir`).

    Raises:
        ValueError: An unknown client, an empty model name or URL, or a bad number.

    Examples:
        >>> setup = client_setup("codex", url="http://127.0.0.1:8000", model="qwen3-4b-q4")
        >>> setup.command
        ['codex']
    """
    spec = client if isinstance(client, CodingClient) else get_client(client)
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"url must start with http:// or https://, got {url!r}")
    if not model or not model.strip():
        raise ValueError("model is empty; give the model's name as the server serves it")
    for name, value in (("context_length", context_length), ("max_tokens", max_tokens)):
        if value is not None and (isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} must be a positive number of tokens, got {value!r}")
    folder = Path(profile) if profile is not None else profile_dir(spec)
    build = _BUILDERS[spec.name]
    env, files = build(url, model, context_length, max_tokens, api_key, folder)
    return ClientSetup(
        client=spec,
        url=url,
        model=model,
        command=[spec.executable, *args],
        env=env,
        files=files,
        context_length=context_length,
    )


# ----------------------------------------------------------------- per client


def _claude(
    url: str,
    model: str,
    context: int | None,
    max_tokens: int | None,
    api_key: str | None,
    folder: Path,
) -> tuple[dict[str, str], dict[Path, str]]:
    env = {
        "ANTHROPIC_BASE_URL": url,
        # A bearer token: an ANTHROPIC_API_KEY would make Claude Code ask, in its
        # terminal UI, whether to trust the key. An empty one keeps a user's own key out.
        "ANTHROPIC_AUTH_TOKEN": api_key or DEFAULT_TOKEN,
        "ANTHROPIC_API_KEY": "",
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,  # the Haiku slot's name in releases before 2.0
        "CLAUDE_CODE_SUBAGENT_MODEL": model,
        "CLAUDE_CONFIG_DIR": str(folder),
        # Telemetry, error reports, update checks and the like: nothing leaves the machine.
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    if context is not None:  # read for model names that do not start with "claude-"
        env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] = str(context)
    if max_tokens is not None:
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(max_tokens)
    # The first start of the terminal UI asks for a theme and a login otherwise.
    state = {"hasCompletedOnboarding": True}
    return env, {folder / ".claude.json": json.dumps(state, indent=2) + "\n"}


def _toml(value: Any) -> str:
    # Strings, integers and booleans are all the block holds; JSON's string escapes
    # are TOML's.
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else str(value)


def _codex(
    url: str,
    model: str,
    context: int | None,
    max_tokens: int | None,
    api_key: str | None,
    folder: Path,
) -> tuple[dict[str, str], dict[Path, str]]:
    env = {"CODEX_HOME": str(folder)}
    top: dict[str, Any] = {"model": model, "model_provider": PROVIDER_ID}
    if context is not None:
        top["model_context_window"] = context
    top["check_for_update_on_startup"] = False
    provider: dict[str, Any] = {
        "name": "mlxi serve",
        "base_url": f"{url}/v1",
        "wire_api": "responses",
    }
    if api_key:
        provider["env_key"] = "MLXI_API_KEY"  # sent as the bearer token
        env["MLXI_API_KEY"] = api_key
    lines = [CODEX_BLOCK_START]
    lines += [f"{key} = {_toml(value)}" for key, value in top.items()]
    lines.append(f"\n[model_providers.{PROVIDER_ID}]")
    lines += [f"{key} = {_toml(value)}" for key, value in provider.items()]
    # Its terminal UI otherwise starts a shared background server that outlives it,
    # holding the settings (the server's URL) of the launch that started it.
    lines += ["\n[features]", "daemon_auto_start = false"]
    lines += ["\n[analytics]", "enabled = false", CODEX_BLOCK_END]
    text = "\n".join(lines) + "\n"
    tomllib.loads(text)  # a model name that breaks the file fails here, not in Codex
    return env, {folder / "config.toml": text}


def _opencode(
    url: str,
    model: str,
    context: int | None,
    max_tokens: int | None,
    api_key: str | None,
    folder: Path,
) -> tuple[dict[str, str], dict[Path, str]]:
    path = folder / "opencode.json"
    env = {
        "OPENCODE_CONFIG": str(path),
        # models.dev's catalogue and update checks need the internet; neither helps here.
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
    }
    entry: dict[str, Any] = {"name": model, "tool_call": True}
    if context is not None:
        # Without a limit OpenCode takes the window as 0 and never compacts.
        output = max_tokens or max(1024, min(32_000, context // 4))
        entry["limit"] = {"context": context, "output": min(output, context)}
    elif max_tokens is not None:  # a window of 0 is OpenCode's "unknown" (no compaction)
        entry["limit"] = {"context": 0, "output": max_tokens}
    options: dict[str, Any] = {"baseURL": f"{url}/v1", "apiKey": DEFAULT_TOKEN}
    if api_key:
        options["apiKey"] = "{env:MLXI_API_KEY}"
        env["MLXI_API_KEY"] = api_key
    config = {
        "$schema": "https://opencode.ai/config.json",
        "model": f"{PROVIDER_ID}/{model}",
        # Session titles and summaries go to the small model: the same one, not a
        # hosted default.
        "small_model": f"{PROVIDER_ID}/{model}",
        "autoupdate": False,
        "share": "disabled",
        "provider": {
            PROVIDER_ID: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "mlxi serve",
                "options": options,
                "models": {model: entry},
            }
        },
    }
    return env, {path: json.dumps(config, indent=2) + "\n"}


_BUILDERS = {"claude": _claude, "codex": _codex, "opencode": _opencode}

# Files the clients also write to: our keys are merged into what is there.
_MERGED = {".claude.json", "config.toml"}


def _merged(path: Path, old: str | None, new: str) -> str:
    """``new`` merged into the file's current text ``old`` (None: no file yet)."""
    if old is None or path.name not in _MERGED:
        return new
    if path.name == ".claude.json":
        try:
            data = json.loads(old)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            return new
        ours: Mapping[str, Any] = json.loads(new)
        return json.dumps({**data, **ours}, indent=2) + "\n"
    # config.toml: our block replaces the last one; what Codex added (trusted folders,
    # notices) stays after it.
    start, end = old.find(CODEX_BLOCK_START), old.find(CODEX_BLOCK_END)
    if start < 0 or end < start:
        return new
    rest = old[:start] + old[end + len(CODEX_BLOCK_END) :].lstrip("\n")
    return new + ("\n" + rest.strip("\n") + "\n" if rest.strip() else "")
