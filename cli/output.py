"""One output object for every command: a :class:`Result` printed by :func:`render`.

A command builds a Result (its JSON form, the lines and table a person reads, the bare
names of ``--quiet``) and returns it; :func:`prints_result` renders it in the form the
command line asked for. Results go to stdout; ``Warning:``, ``Error:`` and ``Hint:``
lines to stderr.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import typer
from mlx_integrations.cli.errors import EXIT_FAILURE, print_error, print_warning

OutputFormat = Literal["human", "json", "names"]


@dataclass(frozen=True)
class Table:
    """Columns for a person: a header row and the rows under it."""

    headers: Sequence[str]
    rows: Sequence[Sequence[Any]]


@dataclass(frozen=True)
class Result:
    """What one command found or did, in each form it can be printed in.

    Attributes:
        data: The ``--json`` form (JSON-ready values).
        lines: What a person reads, one string a line (the default form).
        table: Columns for a person, printed after ``lines``.
        names: The bare names of ``--quiet``.
        error: A failure found while making the result: after it is printed, an
            ``Error:`` line goes to stderr and the command exits with code 1.
        hint: What to do about ``error``.
        warnings: ``(message, hint)`` pairs printed as ``Warning:`` and ``Hint:`` lines
            on stderr after the result, in every form; the command still succeeds.
    """

    data: Any
    lines: Sequence[str] = ()
    table: Table | None = None
    names: Sequence[str] = field(default_factory=list)
    error: str | None = None
    hint: str | None = None
    warnings: Sequence[tuple[str, str | None]] = ()


def render(result: Result, form: OutputFormat = "human") -> None:
    """Print ``result`` on stdout as JSON, bare names or text and table; then its
    warnings and error."""
    if form == "json":
        print_json(result.data)
    elif form == "names":
        for name in result.names:
            typer.echo(name)
    else:
        for line in result.lines:
            typer.echo(line)
        if result.table is not None:
            print_table(result.table.headers, result.table.rows)
    for message, hint in result.warnings:
        print_warning(message, hint)
    if result.error is not None:
        print_error(result.error, result.hint)
        raise typer.Exit(EXIT_FAILURE)


def prints_result(func: Callable[..., Result]) -> Callable[..., None]:
    """Render the Result a command returns: ``--json`` as JSON, ``--quiet`` as names."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        result = func(*args, **kwargs)
        form: OutputFormat = (
            "json" if kwargs.get("json_output") else "names" if kwargs.get("quiet") else "human"
        )
        render(result, form)

    return wrapper


def removal_lines(results: Sequence[Any], force: bool) -> list[str]:
    """What ``mlxi rm`` removed (or would remove), from its ``RemoveResult``s."""
    lines = []
    for r in results:
        verb = "would delete" if r.dry_run else "deleted"
        extra = f", aliases {', '.join(r.aliases_removed)}" if r.aliases_removed else ""
        what = "alias " if r.kind == "alias" else ""
        if r.in_use_by:
            state = "loaded" if r.dry_run and not force else "still loaded"
            extra += f"; {state} by process {', '.join(map(str, r.in_use_by))}"
        if r.kind != "hf_cache":  # no stored model, only what the Hugging Face cache held
            lines.append(f"{verb} {what}'{r.name}' ({human_size(r.freed_bytes)}{extra})")
        if r.hf_cache_freed or r.kind == "hf_cache":
            where = f" of {r.name}" if r.kind == "hf_cache" else ""
            lines.append(
                f"{verb} {human_size(r.hf_cache_freed)}{where} from the Hugging Face cache"
            )
        elif r.hf_cache_note:
            lines.append(f"{human_size(r.hf_cache_bytes)} {r.hf_cache_note}")
        elif r.hf_cache_bytes:
            lines.append(
                f"{human_size(r.hf_cache_bytes)} stays in the Hugging Face cache (shared with "
                f"other tools); mlxi rm {r.name} --purge deletes it"
            )
    return lines


def generation_text(defaults: Any) -> str:
    """A model's ``generation_config.json`` defaults on one line (``mlxi show``)."""
    if defaults is None:
        return "none (no generation_config.json)"
    keys = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens")
    parts = [f"{k} {getattr(defaults, k)}" for k in keys if getattr(defaults, k) is not None]
    if defaults.do_sample is False:
        parts.append("greedy (do_sample false)")
    if defaults.eos_token_ids:
        parts.append("eos ids " + ", ".join(map(str, defaults.eos_token_ids)))
    return ", ".join(parts) or "no defaults set in generation_config.json"


def quality_text(quality: Any) -> str:
    """A ``QuantizationQuality`` in one line: the figures and the verdict."""
    return (
        f"perplexity {quality.ppl_source:.2f} -> {quality.ppl_quantized:.2f} "
        f"(x{quality.ppl_ratio:.3f}), KL {quality.mean_kl:.4f}, same top token "
        f"{quality.top1_agreement:.0%} ({quality.tokens} tokens): {quality.verdict}"
    )


def measurement_text(quality: Any) -> str | None:
    """What a ``QuantizationQuality`` was measured on, in one line (``mlxi show``); None
    for figures recorded before that was kept."""
    if quality.text is None:
        return None
    sha = f", sha256 {quality.text_sha256[:12]}" if quality.text_sha256 else ""
    against = f"against {quality.reference} " if quality.reference else ""
    return f"{against}on the {quality.text} text{sha}, on the {quality.device or '-'}"


def damaged_legend(names: Sequence[str]) -> list[tuple[str, str | None]]:
    """The ``Warning:``/``Hint:`` pair under ``mlxi list`` naming the models that
    quantization damaged (marked ``(damaged)`` in the WEIGHTS column)."""
    if not names:
        return []
    which, one = ", ".join(names), len(names) == 1
    return [
        (
            f"(damaged) under WEIGHTS: quantization damaged {which}; expect garbled "
            f"answers, and a warning when {'it is' if one else 'they are'} loaded.",
            f"mlxi show {names[0]} gives the figures and the settings to quantize with instead.",
        )
    ]


def quality_warnings(quality: Any, settings: Any) -> list[tuple[str, str | None]]:
    """The ``Warning:``/``Hint:`` pair of a quantized model that lost too much, if any."""
    warning = quality.warning(settings) if quality is not None else None
    return [(warning.message, warning.hint)] if warning is not None else []


def kind_text(kind: str) -> str:
    """A model's kind with the adapters that run it: ``reranker (MLXRerank)``."""
    adapters = {
        "chat": "ChatMLX, MLXLLM",
        "embedding": "MLXEmbeddings, MLXEmbedding",
        "reranker": "MLXRerank",
    }
    return f"{kind} ({adapters[kind]})" if kind in adapters else kind


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


def human_span(seconds: float) -> str:
    """A span of time as ``5 seconds``, ``3 minutes``, ``2 hours``, ``1 day``."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        if seconds >= size or unit == "second":
            k = max(0, int(seconds // size))
            return f"{k} {unit}{'' if k == 1 else 's'}"
    return ""  # unreachable


def residency_columns(details: dict[str, Any], now: float) -> list[str]:
    """MEMORY, LAST USED and UNTIL of ``mlxi ps`` from what a process reports of a model
    (a lease's details, the ``ResidencyStats`` keys); ``-`` where it reports nothing."""
    if not details:
        return ["-", "-", "-"]
    last = details.get("last_used")
    used = "-" if last is None else f"{human_span(max(0.0, now - last))} ago"
    if details.get("in_use"):
        used, until = "now", "in use"
    elif details.get("state") == "unloading":
        until = "unloading"
    elif details.get("pinned"):
        until = "forever (pinned)"
    elif details.get("expires_at") is not None:
        until = f"{human_span(max(0.0, details['expires_at'] - now))} from now"
    elif details.get("keep_alive_s") is None:
        until = "forever"
    else:
        until = "-"
    return [human_size(details.get("memory_bytes")), used, until]


def loaded_models_result(loaded: Sequence[tuple[Any, dict[int, dict[str, Any]]]]) -> Result:
    """``mlxi ps``: a row per model and process (``ModelStore.loaded()``), with the
    memory it holds, its last use and until when it stays loaded."""
    import time

    now = time.time()
    rows = [
        [
            m.name,
            m.summary()["id"],
            human_size(m.manifest.size_bytes),
            str(pid),
            *residency_columns(details, now),
        ]
        for m, procs in loaded
        for pid, details in sorted(procs.items())
    ]
    data = [
        {
            **m.summary(),
            "pids": sorted(procs),
            "processes": [{"pid": pid, **details} for pid, details in sorted(procs.items())],
        }
        for m, procs in loaded
    ]
    headers = ["NAME", "ID", "SIZE", "PROCESS", "MEMORY", "LAST USED", "UNTIL"]
    return Result(data, table=Table(headers, rows), names=[m.name for m, _ in loaded])


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
