"""One-line errors with a hint on stderr; a traceback only with ``MLXI_DEBUG=1``.

Exit codes: 0 ok, 1 failure, 2 usage (bad names or values), 130 interrupted, 141 the
reader of stdout went away (a closed pipe).
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, TextIO, TypeVar

import typer

F = TypeVar("F", bound=Callable[..., Any])

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


def debug_enabled() -> bool:
    """True when ``MLXI_DEBUG`` asks for tracebacks."""
    return os.environ.get("MLXI_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


def explain(exc: BaseException) -> tuple[str, str | None, int]:
    """The message, hint and exit code for an exception a command raised."""
    from mlx_integrations.models.errors import InvalidNameError, ModelExistsError, StoreError

    if isinstance(exc, InvalidNameError):
        return str(exc), exc.hint, EXIT_USAGE
    if isinstance(exc, StoreError):
        hint = exc.hint
        if isinstance(exc, ModelExistsError):
            # The library's hint names its keyword; here the flag is what one types.
            hint = "Pass --force to replace it, or choose another name."
        return str(exc), hint, EXIT_FAILURE
    if isinstance(exc, ValueError | TypeError):
        # The library's messages name the bad value and the fix; a generic hint would
        # point away from it (to --help for a character in the prompt, say).
        return str(exc), None, EXIT_USAGE
    if isinstance(exc, FileNotFoundError):
        # The engines raise it with a message of their own (a folder that is no model, a
        # draft model that is nowhere) and no filename: that message is the error.
        if exc.filename is None and str(exc):
            return str(exc), None, EXIT_FAILURE
        return f"No such file or folder: {exc.filename or exc}", None, EXIT_FAILURE
    if isinstance(exc, PermissionError):
        return f"Permission denied: {exc.filename or exc}", "Check the file's permissions.", 1
    if isinstance(exc, ImportError):
        return (
            f"A component is missing: {exc}",
            "Reinstall with: pip install 'mlx-integrations[cpu]' (or [cuda] / macOS wheels).",
            EXIT_FAILURE,
        )
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {exc}", None, EXIT_FAILURE
    return f"{type(exc).__name__}: {exc}", "Set MLXI_DEBUG=1 to see the traceback.", 1


def print_error(message: str, hint: str | None) -> None:
    """Write ``Error:`` and ``Hint:`` lines to stderr."""
    typer.echo(f"Error: {message}", err=True)
    if hint:
        typer.echo(f"Hint: {hint}", err=True)


def print_warning(message: str, hint: str | None) -> None:
    """Write ``Warning:`` and ``Hint:`` lines to stderr (the command still succeeds)."""
    typer.echo(f"Warning: {message}", err=True)
    if hint:
        typer.echo(f"Hint: {hint}", err=True)


def show_model_warnings_as_lines() -> None:
    """Print the library's warning about a damaged model (``DamagedModelWarning``, from
    any engine the command loads) as ``Warning:`` and ``Hint:`` lines, rather than in
    Python's ``file:line: Category: message`` form; other warnings are shown as before.

    Filters still apply first (``-W error`` makes it an error, ``ignore`` silences it).
    """
    import warnings

    previous = warnings.showwarning
    if getattr(previous, "mlxi_lines", False):
        return

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        from mlx_integrations.models.quality.load_warning import DamagedModelWarning

        if isinstance(message, DamagedModelWarning):
            print_warning(message.summary, message.hint)
        else:
            previous(message, category, filename, lineno, file, line)

    show.mlxi_lines = True  # type: ignore[attr-defined]
    warnings.showwarning = show


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that Python's flush at exit finds no closed pipe."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return  # not a real file (a test runner's capture)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def handle_errors(func: F) -> F:
    """Turn the exceptions of a command into an error line and an exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit, typer.BadParameter):
            raise  # Typer reports a bad value itself, as a usage error (exit code 2)
        except BrokenPipeError:
            # The reader went away (`mlxi list | head -1`): stop writing, quietly, with
            # the status of a command that SIGPIPE ended, as other command-line tools do.
            _silence_stdout()
            raise typer.Exit(EXIT_BROKEN_PIPE) from None
        except KeyboardInterrupt:
            typer.echo("\nInterrupted.", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except Exception as exc:
            if debug_enabled():
                traceback.print_exc(file=sys.stderr)
            message, hint, code = explain(exc)
            print_error(message, hint)
            raise typer.Exit(code) from None

    return wrapper  # type: ignore[return-value]
