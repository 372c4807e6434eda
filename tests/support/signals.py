"""Child processes that a test interrupts with SIGINT (Ctrl-C)."""

from __future__ import annotations

import sys

_RESET = (
    "import os, signal, sys; "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def with_default_sigint(argv: list[str]) -> list[str]:
    """``argv`` started with SIGINT at its default disposition.

    A shell runs a background job with SIGINT ignored, and children inherit that: a
    Python program started so never raises KeyboardInterrupt. The test suite may run as
    such a job; a test that presses Ctrl-C gives its child the default back first (the
    same process: the program replaces the small launcher).
    """
    return [sys.executable, "-c", _RESET, *argv]
