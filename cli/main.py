"""Entry point of the ``mlxi`` command.

Each command parses its arguments, calls :mod:`mlx_integrations.models` (or an engine)
and returns a :class:`~mlx_integrations.cli.output.Result`, which one renderer prints as
text, JSON (``--json``) or bare names: results on stdout, progress and errors on stderr. Heavy modules
are imported inside the commands so that ``mlxi --help`` stays fast.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer
from mlx_integrations.cli.doctor import doctor
from mlx_integrations.cli.errors import handle_errors, show_model_warnings_as_lines
from mlx_integrations.cli.fuse import fuse
from mlx_integrations.cli.options import BUDGET_OPTION, EFFORT_OPTION, JSON_OPTION, confirm
from mlx_integrations.cli.output import (
    Result,
    Table,
    damaged_legend,
    human_age,
    human_size,
    kind_text,
    prints_result,
    quality_text,
    quality_warnings,
    removal_lines,
    stdin_is_tty,
)
from mlx_integrations.cli.serve import ps, serve, stop
from mlx_integrations.cli.show import show
from mlx_integrations.cli.warm import warm

from mlx_integrations import __version__

app = typer.Typer(
    name="mlxi",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
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
    """Pull, quantize, warm and run local MLX models.

    Models live in $MLXI_HOME (default ~/.cache/mlxi); Hub downloads go through the
    Hugging Face cache. Set MLXI_DEBUG=1 to see tracebacks.
    """
    show_model_warnings_as_lines()


# Getting models


@app.command()
@handle_errors
@prints_result
def pull(
    repo_id: str = typer.Argument(..., help="Hub repository, e.g. mlx-community/Qwen3-4B-4bit."),
    name: str | None = typer.Option(None, "--name", "-n", help="Store name (default: repo id)."),
    revision: str | None = typer.Option(
        None, "--revision", "-r", help="Branch, tag or commit sha."
    ),
    update: bool = typer.Option(
        False,
        "--update",
        "-u",
        help="Ask the Hub whether the branch moved (a pinned model "
        "is otherwise reused without any request).",
    ),
    force: bool = typer.Option(False, "--force", help="Replace a model of that name."),
    include: list[str] = typer.Option(
        [], "--include", help="Extra glob of files to fetch (repeatable)."
    ),
    trust_remote_code: bool = typer.Option(
        False, "--trust-remote-code", help="Also fetch the repository's Python files."
    ),
    token: str | None = typer.Option(
        None,
        "--token",
        envvar="HF_TOKEN",
        show_envvar=False,
        help="Hub token (default: HF_TOKEN or the saved login); never printed.",
    ),
    quantize_bits: int | None = typer.Option(
        None, "--quantize", help="Then quantize it to N bits into <name>-qN (vision models too)."
    ),
    json_output: bool = JSON_OPTION,
) -> Result:
    """Download a model from the Hugging Face Hub into the store."""
    from mlx_integrations.cli.progress import progress_bars

    from mlx_integrations.models.hub.pull import pull as pull_model
    from mlx_integrations.models.quantize import check_quantization

    if quantize_bits is not None:  # before the download, not after it
        check_quantization(quantize_bits, None, "affine", None, None)

    with progress_bars() as progress:
        result = pull_model(
            repo_id,
            name=name,
            revision=revision,
            update=update,
            force=force,
            include=include or None,
            trust_remote_code=trust_remote_code,
            token=token,
            progress=progress,
        )
    model = result.model
    src = model.manifest.source
    pin = f"{src.revision} @ {(src.commit or '')[:12]}"
    if result.downloaded:
        line = f"pulled {model.name} ({pin}, {human_size(model.manifest.size_bytes)})"
    else:
        line = f"{model.name} is up to date ({pin})"
    from mlx_integrations.models.resolve import model_kind

    kind = model_kind(model.path)
    if kind != "chat":  # a model for another adapter says which
        line += f"; {kind_text(kind)}"
    if quantize_bits is None:
        return Result({**result.to_dict(), "kind": kind}, [line])
    from mlx_integrations.models.quantize import quantize_model

    with progress_bars() as progress:
        quantized = quantize_model(model.name, bits=quantize_bits, progress=progress)
    size = human_size(quantized.manifest.size_bytes)
    lines = [line, f"quantized {model.name} -> {quantized.name} ({quantize_bits} bits, {size})"]
    q, quality = quantized.manifest.quantization, quantized.manifest.quality
    figures = quality.to_dict() if quality else None
    data = {**result.to_dict(), "quantized": {**quantized.summary(), "quality": figures}}
    return Result(data, lines, warnings=quality_warnings(quality, q))


@app.command("import")
@handle_errors
@prints_result
def import_(
    source: Path = typer.Argument(..., help="A model folder or a .gguf file."),
    name: str = typer.Argument(..., help="Store name."),
    force: bool = typer.Option(False, "--force", help="Replace a model of that name."),
    dtype: str | None = typer.Option(
        None,
        "--dtype",
        help="float32 (default), float16 or bfloat16: weights of a GGUF conversion, "
        "or the unquantized weights with --q-bits.",
    ),
    bits: int | None = typer.Option(None, "--q-bits", help="Quantize while importing."),
    group_size: int | None = typer.Option(
        None, "--q-group-size", help="Quantization group (with --q-bits)."
    ),
    mode: str | None = typer.Option(
        None, "--q-mode", help="affine (default), mxfp4, nvfp4 or mxfp8 (with --q-bits)."
    ),
    json_output: bool = JSON_OPTION,
) -> Result:
    """Import a local model folder or a GGUF file into the store."""
    from mlx_integrations.cli.options import check_import_options
    from mlx_integrations.cli.progress import progress_bars

    check_import_options(source, dtype, bits, group_size, mode)
    with progress_bars() as progress:
        if bits is not None:
            from mlx_integrations.models.quantize import quantize_model

            model = quantize_model(
                source,  # a Path: the folder or file, never a store name
                name,
                bits=bits,
                group_size=group_size,
                mode=mode or "affine",
                dtype=dtype,
                overwrite=force,
                progress=progress,
            )
        else:
            from mlx_integrations.models.importer import import_model

            model = import_model(
                source, name, overwrite=force, dtype=dtype or "float32", progress=progress
            )
    from mlx_integrations.models.resolve import model_kind

    kind = model_kind(model.path)
    return Result(
        {**model.summary(), "kind": kind},
        [
            f"imported {model.name} ({human_size(model.manifest.size_bytes)})"
            + ("" if kind == "chat" else f"; {kind_text(kind)}")
            if model.name == name
            else f"{name} now names {model.name}, which holds the same file (nothing copied)"
        ],
        warnings=quality_warnings(model.manifest.quality, model.manifest.quantization),
    )


@app.command()
@handle_errors
@prints_result
def quantize(
    source: str = typer.Argument(..., help="Store name, repo id, folder or .gguf file."),
    name: str | None = typer.Argument(None, help="Store name (default: SOURCE-q<bits>)."),
    bits: int = typer.Option(4, "--bits", "-b", help="2, 3, 4, 5, 6 or 8."),
    group_size: int | None = typer.Option(
        None, "--group-size", "-g", help="Weights per scale (default 64; fixed for fp modes)."
    ),
    mode: str = typer.Option("affine", "--mode", help="affine, mxfp4, nvfp4 or mxfp8."),
    recipe: str | None = typer.Option(
        None, "--recipe", help="Mixed precision: mixed_2_6, mixed_3_4, mixed_3_6, mixed_4_6."
    ),
    dtype: str | None = typer.Option(
        None, "--dtype", help="float16, bfloat16 or float32 for unquantized weights."
    ),
    force: bool = typer.Option(False, "--force", help="Replace a model of that name."),
    evaluate: bool = typer.Option(
        True,
        "--eval/--no-eval",
        help="Compare the result with its source on a short text (perplexity, KL divergence).",
    ),
    strict: bool = typer.Option(
        False,
        "--strict",
        help="Keep nothing and exit 1 when the result is damaged (default: keep it, flagged).",
    ),
    json_output: bool = JSON_OPTION,
) -> Result:
    """Quantize a model with mlx-lm into a new store model.

    The result is then compared with its source on a short built-in text; a warning
    says when it lost too much. The verdict stays in the manifest: mlxi list and
    mlxi show mark a damaged model, and loading it warns. --strict refuses it instead.
    """
    from mlx_integrations.cli.progress import progress_bars

    from mlx_integrations.models.quantize import quantize_model

    with progress_bars() as progress:
        model = quantize_model(
            source,
            name,
            bits=bits,
            group_size=group_size,
            mode=mode,
            recipe=recipe,
            dtype=dtype,
            overwrite=force,
            evaluate=evaluate,
            strict=strict,
            progress=progress,
        )
    q, quality = model.manifest.quantization, model.manifest.quality
    how = f"{q.bits} bits, group {q.group_size}, {q.mode}" if q else "unquantized"
    size = human_size(model.manifest.size_bytes)
    lines = [f"quantized {source} -> {model.name} ({how}, {size})"]
    if quality is not None:
        lines.append(f"quality: {quality_text(quality)} ({quality.seconds:.1f} s)")
    return Result(model.summary(), lines, warnings=quality_warnings(quality, q))


app.command()(fuse)


# Looking at the store


@app.command("list")
@handle_errors
@prints_result
def list_(
    prefix: str | None = typer.Argument(None, help="Only names that start with this."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print names only."),
    json_output: bool = JSON_OPTION,
) -> Result:
    """List the models of the store."""
    from mlx_integrations.models.store import default_store, list_models

    models = list_models(prefix)
    for bad in default_store().damaged():  # not listed: say so rather than hide them
        typer.echo(
            f"Warning: the manifest of {bad!r} is damaged; mlxi rm {bad} removes it", err=True
        )
    rows = []
    by_id: dict[str, list[str]] = {}
    for m in models:
        s = m.summary()
        q = m.manifest.quantization
        shown = m.name + (f" ({', '.join(m.aliases)})" if m.aliases else "")
        # The ID is the digest of the files: copies of one model (one folder imported
        # under two names) share a row rather than show the same ID twice.
        if s["id"] in by_id:
            by_id[s["id"]][0] += f", {shown}"
            continue
        weights = f"{q.bits}-bit" if q else (m.manifest.dtype or "-")
        verdict = m.manifest.verdict
        rows.append(
            [
                shown,
                s["id"],
                human_size(s["size"]),
                weights if verdict in (None, "close") else f"{weights} ({verdict})",
                m.manifest.source.kind,
                human_age(s["modified"]),
            ]
        )
        by_id[s["id"]] = rows[-1]
    return Result(
        [m.summary() for m in models],
        table=Table(["NAME", "ID", "SIZE", "WEIGHTS", "SOURCE", "MODIFIED"], rows),
        names=[m.name for m in models],
        warnings=damaged_legend([m.name for m in models if m.manifest.verdict == "damaged"]),
    )


app.command("ls", help="List the models of the store (same as list).")(list_)


app.command()(ps)


app.command()(show)


@app.command()
@handle_errors
@prints_result
def verify(
    names: list[str] = typer.Argument(None, help="Models to check (default: all)."),
    json_output: bool = JSON_OPTION,
) -> Result:
    """Check model files against the sha256 in their manifests (exit 1 on a mismatch)."""
    from mlx_integrations.models.store import default_store

    store = default_store()
    targets = names or [m.name for m in store.list()]
    reports = [store.verify(n) for n in targets]
    lines = []
    for r in reports:
        lines.append(f"{r.name}: {'ok' if r.ok else 'FAILED'} ({len(r.files)} files)")
        lines += [f"  {f.path}: {f.status.replace('_', ' ')}" for f in r.files if f.status != "ok"]
    failed = [r.name for r in reports if not r.ok]
    return Result(
        [r.to_dict() for r in reports],
        lines,
        error=f"files of {', '.join(failed)} do not match their manifest." if failed else None,
        hint="pull or import the model again (mlxi pull/import --force), "
        f"or remove it: mlxi rm {' '.join(failed)}",
    )


# Changing the store


@app.command()
@handle_errors
@prints_result
def rm(
    names: list[str] = typer.Argument(..., help="Models or aliases to remove."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be removed."),
    force: bool = typer.Option(
        False, "--force", "-f", help="Remove models that a running process has loaded."
    ),
    purge: bool = typer.Option(
        False,
        "--purge",
        help="Also delete a pulled model's files from the Hugging Face cache "
        "(unless another stored model uses them).",
    ),
    json_output: bool = JSON_OPTION,
) -> Result:
    """Remove models (and their aliases) or aliases from the store.

    A model that a running engine or `mlxi run` has loaded is kept unless --force.
    A pulled model's files stay in the Hugging Face cache, which other tools share,
    unless --purge.
    """
    from mlx_integrations.models.cleanup import remove_model
    from mlx_integrations.models.store import default_store

    store = default_store()
    for n in names:
        # Fails before removing anything when a name is unknown (or, with --purge, has
        # no files left in the Hugging Face cache either).
        preview = remove_model(n, dry_run=True, purge_hf_cache=purge, store=store)
        if not force and not dry_run and preview.in_use_by:
            remove_model(
                n, store=store
            )  # in use: fails with the holders and the hint, before asking
    if not confirm(f"Remove {', '.join(names)}?", yes, dry_run):
        typer.echo("Nothing removed.", err=True)
        raise typer.Exit(1)
    results = [
        remove_model(n, dry_run=dry_run, force=force, purge_hf_cache=purge, store=store)
        for n in names
    ]
    return Result([dataclasses.asdict(r) for r in results], removal_lines(results, force))


@app.command()
@handle_errors
@prints_result
def tag(
    source: str = typer.Argument(..., help="A stored model."),
    alias: str = typer.Argument(..., help="Another name for it."),
    json_output: bool = JSON_OPTION,
) -> Result:
    """Give a stored model another name (an alias)."""
    from mlx_integrations.models.store import tag_model

    model = tag_model(source, alias)
    return Result(model.summary(), [f"tagged {model.name} as {alias}"])


@app.command()
@handle_errors
@prints_result
def prune(
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be removed."),
    json_output: bool = JSON_OPTION,
) -> Result:
    """Remove unfinished builds, orphaned folders, dangling aliases and stale partial
    downloads."""
    from mlx_integrations.models.cleanup import prune as prune_store
    from mlx_integrations.models.store import default_store

    store = default_store()
    preview = prune_store(dry_run=True, store=store)
    if preview.items and not dry_run:
        if not confirm(
            f"Remove {len(preview.items)} items ({human_size(preview.freed_bytes)})?", yes, dry_run
        ):
            typer.echo("Nothing removed.", err=True)
            raise typer.Exit(1)
        report = prune_store(store=store)
    else:
        report = dataclasses.replace(preview, dry_run=dry_run)  # a dry run, or nothing to do
    lines = [f"{item.kind:20} {item.path} {item.detail}".rstrip() for item in report.items]
    verb = "would free" if report.dry_run else "freed"
    lines.append(f"{len(report.items)} items, {verb} {human_size(report.freed_bytes)}")
    data = {
        "dry_run": report.dry_run,
        "freed_bytes": report.freed_bytes,
        "items": [dataclasses.asdict(i) for i in report.items],
    }
    return Result(data, lines)


# Using models


app.command()(warm)


@app.command()
@handle_errors
def run(
    model: str = typer.Argument(..., help="Store name, alias, repo id or folder."),
    prompt: str | None = typer.Argument(
        None, help="One-shot prompt ('-' reads stdin). Without it: interactive chat."
    ),
    system: str | None = typer.Option(None, "--system", "-s", help="System prompt."),
    max_tokens: int = typer.Option(512, "--max-tokens", "-m", help="Tokens per answer."),
    temperature: float = typer.Option(0.7, "--temperature", "-t", help="Sampling temperature."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print timings on stderr."),
    output_format: str | None = typer.Option(
        None,
        "--format",
        help="Constrain answers: 'json' (any JSON object) or a JSON Schema file.",
    ),
    hide_thinking: bool = typer.Option(
        False, "--hide-thinking", help="Do not print a reasoning model's thinking (stderr)."
    ),
    reasoning_effort: str | None = EFFORT_OPTION,
    thinking_budget: int | None = BUDGET_OPTION,
    tools: Path | None = typer.Option(
        None, "--tools", help="JSON file of tool definitions the model may call."
    ),
    tool_choice: str = typer.Option(
        "auto",
        "--tool-choice",
        help="With --tools: 'auto', 'required' (a call is forced), 'none', or a tool name.",
    ),
    draft_model: str | None = typer.Option(
        None, "--draft-model", help="A small model of the same family that drafts tokens."
    ),
    prompt_lookup: int = typer.Option(
        0, "--prompt-lookup", help="Draft up to N tokens from matches in the context (0: off)."
    ),
    kv_bits: int | None = typer.Option(
        None,
        "--kv-bits",
        help="Quantize the KV cache to N bits (8: half the memory, 4: about a quarter).",
    ),
    image: list[str] = typer.Option(
        [], "--image", "-i", help="An image (path or URL) for a vision model; repeatable."
    ),
    adapter: Path | None = typer.Option(
        None, "--adapter", "--adapter-path", help="A LoRA adapter folder of mlx_lm.lora."
    ),
    json_output: bool = typer.Option(
        False, "--json", help="Print the answer, usage and timings as one JSON object."
    ),
) -> None:
    """Chat with a model: one answer to PROMPT, or an interactive session.

    The answer goes to stdout; a reasoning model's thinking goes to stderr, dimmed.
    With --tools, each call the model makes is printed on stdout as one JSON line
    (id, name, arguments); mlxi does not run tools. In the session: /clear forgets the
    conversation, Ctrl-C stops the answer being written, /bye (or Ctrl-D) leaves.
    --draft-model or --prompt-lookup decode speculatively (greedy answers unchanged).
    --kv-bits holds a long conversation in less memory, with answers that may drift.
    --image gives a vision-language model images with the (first) question.
    --adapter applies a LoRA adapter that mlx_lm.lora trained (mlxi fuse folds one in).
    --json (one-shot only) prints one JSON object once the answer is complete.
    """
    import sys

    from mlx_integrations.cli.chat import (
        RunOptions,
        chat_session,
        engine_options,
        image_sources,
        one_shot,
        read_tools,
        response_format_option,
    )

    from mlx_integrations.chat.request import CheckedTools
    from mlx_integrations.chat.tools import read_tool_request

    response_format = response_format_option(output_format)
    tool_defs = read_tools(tools) if tools is not None else None
    if tool_choice != "auto" and tool_defs is None:
        raise typer.BadParameter("needs --tools", param_hint="--tool-choice")
    try:  # checked once, before the model loads
        checked = read_tool_request(tool_defs, tool_choice, True)
    except (TypeError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--tools / --tool-choice") from None
    if tool_defs is not None:
        tool_defs = CheckedTools(tool_defs, checked.tools)
    if prompt == "-" or (prompt is None and not stdin_is_tty()):
        prompt = sys.stdin.read()
    if prompt is not None and not prompt.strip() and not image:
        raise typer.BadParameter("the prompt is empty", param_hint="PROMPT")
    if json_output and prompt is None:
        raise typer.BadParameter(
            "the interactive session prints text; give a prompt for one JSON answer: "
            "mlxi run MODEL 'PROMPT' --json (or pipe it: echo PROMPT | mlxi run MODEL --json)",
            param_hint="--json",
        )
    if max_tokens < 1:
        raise typer.BadParameter("must be >= 1", param_hint="--max-tokens")
    options = RunOptions(
        system=system,
        max_tokens=max_tokens,
        temperature=temperature,
        verbose=verbose,
        response_format=response_format,
        show_thinking=not hide_thinking,
        tools=tool_defs,
        tool_choice=tool_choice,
        engine_options=engine_options(draft_model, prompt_lookup, kv_bits, adapter),
        images=image_sources(image),
        json_output=json_output,
        reasoning_effort=reasoning_effort,
        thinking_budget=thinking_budget,
    )
    one_shot(model, prompt, options) if prompt is not None else chat_session(model, options)


app.command()(doctor)

app.command()(serve)
app.command()(stop)


from mlx_integrations.cli.launch import code_command, launch_command  # noqa: E402

app.command("launch", context_settings={"ignore_unknown_options": True})(launch_command)
app.command("code", context_settings={"ignore_unknown_options": True})(code_command)


def main() -> None:
    """Run the ``mlxi`` command."""
    app()
