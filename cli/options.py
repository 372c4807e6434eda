"""Checks of option combinations that no single option's type can express, and the
confirmation of commands that delete.

Each check raises :class:`typer.BadParameter` naming the option, before any work starts, so
that an option that would have no effect is never silently dropped.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from mlx_integrations.cli.output import stdin_is_tty

JSON_OPTION = typer.Option(False, "--json", help="Print the result as JSON.")
EFFORTS = ("none", "low", "medium", "high")


def _effort(value: str | None) -> str | None:
    if value is not None and value not in EFFORTS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(map(repr, EFFORTS))}.")
    return value


EFFORT_OPTION = typer.Option(
    None,
    "--reasoning-effort",
    callback=_effort,
    help="How much a thinking model thinks (none, low, medium or high), through its "
    "template's own switch; a level it does not take is refused, naming those it takes.",
)
BUDGET_OPTION = typer.Option(
    None,
    "--thinking-budget",
    min=0,
    help="Most tokens a thinking model may think; then its end marker is written and it answers.",
)


def confirm(question: str, yes: bool, dry_run: bool) -> bool:
    """Ask only a person at a terminal; scripts (no TTY) and --yes go ahead."""
    if yes or dry_run or not stdin_is_tty():
        return True
    # Not typer.confirm: it turns Ctrl-C into "Aborted!" and exit code 1, where every
    # other command exits 130 (KeyboardInterrupt reaches handle_errors from here).
    # A Ctrl-C just before input() begins reading would wait for a line: SessionSignals.
    from mlx_integrations.cli.signals import SessionSignals

    with SessionSignals():
        sys.stderr.write(f"{question} [y/N]: ")
        sys.stderr.flush()
        try:
            answer = input()
        except EOFError:
            return False
    return answer.strip().lower() in {"y", "yes"}


def check_import_options(
    source: Path, dtype: str | None, bits: int | None, group_size: int | None, mode: str | None
) -> None:
    """``mlxi import``: the quantization options need ``--q-bits``; ``--dtype`` needs a
    GGUF file (whose weights it sets) or ``--q-bits`` (the weights left unquantized)."""
    if bits is None and (group_size is not None or mode is not None):
        given = "--q-group-size" if group_size is not None else "--q-mode"
        raise typer.BadParameter(
            f"{given} has no effect without --q-bits N (the bits to quantize to)",
            param_hint=given,
        )
    if dtype is not None and bits is None and source.suffix.lower() != ".gguf":
        raise typer.BadParameter(
            f"{source} is copied as it is; --dtype applies to a .gguf file, or with --q-bits "
            "to the weights left unquantized",
            param_hint="--dtype",
        )
