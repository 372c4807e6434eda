"""The launchers (parsing and rendering only): ``mlxi launch`` starts the ranks of a
distributed program, ``mlxi code`` a coding agent on a local model through mlxi serve.

The work is :func:`mlx_integrations.engine.distributed.launch.launch` and
:mod:`mlx_integrations.coding_agents`.
"""

from __future__ import annotations

from pathlib import Path

import typer
from mlx_integrations.cli.errors import handle_errors, print_error, print_warning
from mlx_integrations.cli.options import JSON_OPTION
from mlx_integrations.cli.output import Result, render


@handle_errors
def launch_command(
    command: list[str] = typer.Argument(
        ...,
        help="Rank 0's program: a .py script and its arguments, or a command "
        "(put -- before it when it has options: -- mlxi run MODEL 'Hi').",
    ),
    num_ranks: int | None = typer.Option(None, "-n", "--ranks", help="Local ranks on 127.0.0.1."),
    hostfile: Path | None = typer.Option(
        None, "--hostfile", help='JSON list of hosts, one rank each: [{"ssh": ..., "ips": [...]}].'
    ),
    backend: str = typer.Option("ring", "--backend", help="'ring' (TCP) or 'mpi' (mpirun)."),
    start_timeout: float = typer.Option(
        120.0, "--start-timeout", help="Seconds every rank has to join rank 0."
    ),
    rank_timeout: float = typer.Option(
        30.0, "--rank-timeout", help="Seconds of silence after which a rank counts as lost."
    ),
) -> None:
    """Run a program over several ranks: rank 0 runs it, the others follow its engine.

    The program creates a DistributedEngine (ChatMLX(engine=DistributedEngine(...))
    or MLXLLM(engine=...)); `mlxi launch -n 2 -- mlxi run MODEL PROMPT` shards
    `mlxi run`. The exit status is non-zero when any rank fails; the others are
    stopped then.
    """
    from mlx_integrations.engine.distributed.launch import launch

    result = launch(
        command,
        num_ranks=num_ranks,
        hostfile=hostfile,
        backend=backend,  # type: ignore[arg-type]  # checked by launch()
        start_timeout=start_timeout,
        rank_timeout=rank_timeout,
    )
    if result.failure is not None:
        print_error(result.failure, "the rank's own error is printed above")
    raise typer.Exit(result.exit_code)


@handle_errors
def code_command(
    client: str = typer.Argument(..., help="claude (Claude Code), codex (Codex) or opencode."),
    args: list[str] = typer.Argument(
        None, help="The client's own arguments, after -- (e.g. -- -p 'Fix the test')."
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        "-m",
        help="Store name, alias, repo id or folder (default: the model a running server holds).",
    ),
    port: int | None = typer.Option(
        None,
        "--port",
        envvar="MLXI_PORT",
        help="The server's port (default 8000): a server running there is used, "
        "otherwise one is started there for the client and stopped after it.",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="The server's address."),
    max_tokens: int | None = typer.Option(
        None, "--max-tokens", min=1, help="Cap each reply at N tokens (default: the clients')."
    ),
    config: bool = typer.Option(
        False, "--config", help="Print the settings and the command instead of running them."
    ),
    json_output: bool = JSON_OPTION,
) -> None:
    """Run Claude Code, Codex or OpenCode on a local model through mlxi serve.

    The client's settings go to a profile of its own ($MLXI_HOME/clients/CLIENT) and
    to variables of its process: the user's own settings (~/.claude, ~/.codex,
    ~/.config/opencode) are left alone. A model whose context window is smaller than
    what the client sends before you type is named in a warning. Example:
    mlxi code claude --model qwen3-4b-q4 -- -p 'Explain this repository'.
    """
    from mlx_integrations.coding_agents import ServerFailed, launch, plan_launch

    plan = plan_launch(client, model, host=host, port=port, args=args or [], max_tokens=max_tokens)
    warning = plan.context.message()
    if config or json_output:
        if not config:
            raise typer.BadParameter("--json prints the settings: use it with --config")
        render(
            Result(plan.to_dict(), plan.lines(), warnings=[(warning, None)] if warning else []),
            "json" if json_output else "human",
        )
        return
    if warning:
        print_warning(warning, None)
    try:
        code = launch(plan, on_status=lambda line: typer.echo(f"mlxi code: {line}", err=True))
    except ServerFailed as exc:
        print_error(str(exc), "try the model on its own: mlxi serve " + plan.setup.model)
        raise typer.Exit(1) from None
    raise typer.Exit(code)
