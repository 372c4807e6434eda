"""``mlxi warm``: store the KV cache of a prompt prefix with a model, or remove such caches."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import typer
from mlx_integrations.cli.errors import handle_errors
from mlx_integrations.cli.options import JSON_OPTION, confirm
from mlx_integrations.cli.output import Result, human_size, prints_result


@handle_errors
@prints_result
def warm(
    model: str = typer.Argument(..., help="Store name, alias, repo id or folder."),
    cache_name: str | None = typer.Option(
        None, "--name", "-n", help="Name of the warm cache (default: default)."
    ),
    system: str | None = typer.Option(None, "--system", "-s", help="System prompt."),
    system_file: Path | None = typer.Option(None, "--system-file", help="System prompt file."),
    tools: Path | None = typer.Option(None, "--tools", help="JSON file of tool definitions."),
    text_file: Path | None = typer.Option(
        None,
        "--file",
        "-f",
        help="Document appended to the system prompt (a raw prefix "
        "when no system prompt or tools are given).",
    ),
    weights: bool = typer.Option(
        True, "--weights/--no-weights", help="Also read the weights into the OS page cache."
    ),
    cache_dir: Path | None = typer.Option(
        None,
        "--cache-dir",
        help="Write the prefix into this disk cache (the engines' cache_dir option) "
        "instead of the model folder.",
    ),
    kv_bits: int | None = typer.Option(
        None, "--kv-bits", help="With --cache-dir: the engines' kv_bits (quantized KV cache)."
    ),
    remove: list[str] = typer.Option(
        [], "--rm", help="Remove the warm cache of this name instead (repeatable)."
    ),
    remove_all: bool = typer.Option(False, "--rm-all", help="Remove all the model's warm caches."),
    yes: bool = typer.Option(False, "--yes", "-y", help="With --rm: do not ask."),
    dry_run: bool = typer.Option(False, "--dry-run", help="With --rm: show what would be removed."),
    json_output: bool = JSON_OPTION,
) -> Result:
    """Precompute the KV cache of a prompt prefix and store it with the model.

    Engines load these caches at start, so the first request that begins with the same
    system prompt and tools skips their prefill. Without a prefix, only the weights
    are read once (page cache). --rm NAME or --rm-all deletes stored caches
    (mlxi show lists them). With --cache-dir DIR the prefix goes into the disk cache of
    engines made with cache_dir=DIR instead, found there by its tokens.
    """
    if remove or remove_all:
        given = {
            "--name": cache_name,
            "--system": system,
            "--system-file": system_file,
            "--tools": tools,
            "--file": text_file,
            "--cache-dir": cache_dir,
        }
        for option, value in given.items():
            if value is not None:
                raise typer.BadParameter(
                    f"{option} makes a cache; --rm and --rm-all only remove caches",
                    param_hint=option,
                )
        if remove and remove_all:
            raise typer.BadParameter(
                "give --rm NAME (repeatable) or --rm-all, not both", param_hint="--rm-all"
            )
        return _remove(model, remove or None, yes, dry_run)
    if yes or dry_run:
        given_flag = "--yes" if yes else "--dry-run"
        raise typer.BadParameter(
            "applies to removal only: add --rm NAME or --rm-all", param_hint=given_flag
        )
    if cache_dir is not None or kv_bits is not None:
        return _warm_disk(
            model, cache_name, system, system_file, tools, text_file, cache_dir, kv_bits
        )
    return _warm(model, cache_name or "default", system, system_file, tools, text_file, weights)


def _warm_disk(
    model: str,
    cache_name: str | None,
    system: str | None,
    system_file: Path | None,
    tools: Path | None,
    text_file: Path | None,
    cache_dir: Path | None,
    kv_bits: int | None,
) -> Result:
    """``--cache-dir``: the prefix goes into the engines' disk cache, found by its tokens."""
    from mlx_integrations.cli.chat import read_tools
    from mlx_integrations.cli.progress import progress_bars

    from mlx_integrations.engine.cache.disk_warm import warm_disk_cache

    if cache_dir is None:
        raise typer.BadParameter("applies to --cache-dir only", param_hint="--kv-bits")
    if cache_name is not None:
        raise typer.BadParameter(
            "names a warm cache in the model folder; --cache-dir entries are found by their "
            "tokens: drop --name",
            param_hint="--name",
        )
    if system is not None and system_file is not None:
        raise typer.BadParameter("give --system or --system-file, not both")
    if system is None and system_file is None and not tools and not text_file:
        raise typer.BadParameter("nothing to warm: give --system, --tools or --file")
    if system_file is not None:
        system = system_file.read_text()
    tool_defs = read_tools(tools) if tools is not None else None
    text = text_file.read_text() if text_file is not None else None
    with progress_bars() as progress:
        result = warm_disk_cache(
            model,
            cache_dir,
            system=system,
            tools=tool_defs,
            text=text,
            kv_bits=kv_bits,
            progress=progress,
        )
    done = "wrote" if result.written else "already held"
    line = (
        f"{done} {result.tokens} tokens ({result.source}) in {result.seconds:.2f} s -> "
        f"{result.folder}"
    )
    return Result({"disk_cache": result.to_dict()}, [line])


def _warm(
    model: str,
    cache_name: str,
    system: str | None,
    system_file: Path | None,
    tools: Path | None,
    text_file: Path | None,
    weights: bool,
) -> Result:
    from mlx_integrations.cli.chat import read_tools
    from mlx_integrations.cli.progress import progress_bars

    from mlx_integrations.models.warm import warm_model, warm_weights

    if system is not None and system_file is not None:
        raise typer.BadParameter("give --system or --system-file, not both")
    if not weights and system is None and system_file is None and not tools and not text_file:
        raise typer.BadParameter("nothing to warm: give --system, --tools or --file")
    if system_file is not None:
        system = system_file.read_text()
    tool_defs = read_tools(tools) if tools is not None else None
    text = text_file.read_text() if text_file is not None else None
    out: dict[str, Any] = {}
    with progress_bars() as progress:
        if weights:
            out["weights_bytes"] = warm_weights(model, progress=progress)
        if system is not None or tool_defs or text:
            result = warm_model(
                model, cache_name, system=system, tools=tool_defs, text=text, progress=progress
            )
            out["cache"] = result.to_dict()
    lines = []
    if "weights_bytes" in out:
        lines.append(f"read {human_size(out['weights_bytes'])} of weights")
    if "cache" in out:
        c = out["cache"]
        lines.append(
            f"warmed '{c['name']}': {c['tokens']} tokens ({c['source']}) "
            f"in {c['seconds']:.2f} s -> {c['path']}"
        )
    return Result(out, lines)


def _remove(model: str, names: list[str] | None, yes: bool, dry_run: bool) -> Result:
    """``--rm``/``--rm-all``: as ``mlxi rm``, every name is checked before anything goes,
    a person at a terminal is asked (unless --yes), and --dry-run deletes nothing."""
    from mlx_integrations.models.warm import remove_warm_cache

    preview = remove_warm_cache(model, names, dry_run=True)
    if preview.removed and not dry_run:
        listed = ", ".join(f"'{c.name}'" for c in preview.removed)
        what = "warm cache" if len(preview.removed) == 1 else "warm caches"
        if not confirm(f"Remove {what} {listed} of {model}?", yes, dry_run):
            typer.echo("Nothing removed.", err=True)
            raise typer.Exit(1)
        report = remove_warm_cache(model, names)
    else:
        report = dataclasses.replace(preview, dry_run=dry_run)  # a dry run, or nothing to do
    verb = "would delete" if report.dry_run else "deleted"
    lines = [
        f"{verb} warm cache '{c.name}' of {model} ({human_size(c.size)})" for c in report.removed
    ]
    if not report.removed:
        lines.append(f"{model} has no warm caches")
    elif report.freed_bytes > sum(c.size for c in report.removed):
        extra = report.freed_bytes - sum(c.size for c in report.removed)
        lines.append(f"{verb} {human_size(extra)} left by interrupted warms")
    return Result(report.to_dict(), lines)
