"""``mlxi launch``: start the ranks of a distributed program (parsing and rendering only).

The work is :func:`mlx_integrations.engine.distributed.launch.launch`.
"""

from __future__ import annotations

from pathlib import Path

import typer
from mlx_integrations.cli.errors import handle_errors, print_error


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
