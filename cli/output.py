"""Rendering of results on stdout: JSON, aligned tables, sizes."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import typer


def human_size(n: float | None) -> str:
    """Bytes as ``12.3 MB`` (decimal units, as Ollama and hf print them)."""
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def human_count(n: int | None) -> str:
    """Parameter counts as ``135M``, ``1.5B``."""
    if n is None:
        return "-"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(n)


def human_age(iso: str | None) -> str:
    """An ISO time as ``3 minutes ago``."""
    if not iso:
        return "-"
    try:
        then = datetime.fromisoformat(iso)
    except ValueError:
        return iso
    seconds = (datetime.now(then.tzinfo) - then).total_seconds()
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            k = int(seconds // size)
            return f"{k} {unit}{'s' if k > 1 else ''} ago"
    return "just now"


def print_json(data: Any) -> None:
    """Indented JSON on stdout."""
    typer.echo(json.dumps(data, indent=2, default=str))


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Columns padded to their widest cell, on stdout (no box: easy to pipe)."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for row in cells:
        line = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
        typer.echo(line.rstrip())


def stdin_is_tty() -> bool:
    """True when a person may answer a prompt."""
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False
