"""Entry point of the ``mlxi`` command."""

from __future__ import annotations

import typer

from mlx_integrations import __version__

app = typer.Typer(
    name="mlxi",
    help="Pull, quantize, warm and run local MLX models.",
    no_args_is_help=True,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mlxi {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", "-V", callback=_version, is_eager=True, help="Show the version."
    ),
) -> None:
    """Pull, quantize, warm and run local MLX models."""


@app.command()
def doctor(json_output: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Report the MLX version, backend, device, mlx-lm version and the model store path."""
    import json
    import os
    from pathlib import Path

    from mlx_integrations.runtime import backend_info

    info = dict(backend_info())
    info["store"] = str(Path(os.environ.get("MLXI_HOME", "~/.cache/mlxi")).expanduser())
    if json_output:
        typer.echo(json.dumps(info, indent=2))
        return
    for key, value in info.items():
        typer.echo(f"{key:16} {value}")


def main() -> None:
    app()
