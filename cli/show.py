"""``mlxi show``: a model's architecture, size, quantization (and what it cost), source,
chat template, generation defaults and files."""

from __future__ import annotations

import typer
from mlx_integrations.cli.errors import handle_errors
from mlx_integrations.cli.options import JSON_OPTION
from mlx_integrations.cli.output import (
    Result,
    generation_text,
    human_count,
    human_size,
    kind_text,
    measurement_text,
    prints_result,
    quality_text,
    quality_warnings,
)


@handle_errors
@prints_result
def show(
    name: str = typer.Argument(..., help="Store name, alias, repo id or folder."),
    template: bool = typer.Option(False, "--template", help="Print only the chat template."),
    path: bool = typer.Option(
        False, "--path", help="Print only the model's folder (for tools that read it)."
    ),
    json_output: bool = JSON_OPTION,
) -> Result:
    """Show a model's architecture, size, quantization, source, chat template,
    generation defaults and files."""
    from mlx_integrations.models.info import show_model

    info = show_model(name)
    if path:
        return Result({"name": info.name, "path": info.path}, [info.path])
    if template:
        data = {k: getattr(info, k) for k in ("name", "chat_template", "chat_template_file")}
        if info.chat_template is None:
            return Result(
                data,
                error=f"{info.name} has no chat template (no chat_template.jinja, and no "
                "chat_template in tokenizer_config.json).",
                hint="Without one, conversations reach the model as 'role: content' lines.",
            )
        return Result(data, [info.chat_template.removesuffix("\n")])
    q = info.quantization
    src = info.source
    lines = [
        ("name", info.name + (f" (aliases: {', '.join(info.aliases)})" if info.aliases else "")),
        ("path", info.path),
        ("type", kind_text(info.kind)),
        ("architecture", info.architecture or "-"),
        ("input", "text and images (vision)" if info.vision else "text"),
        ("parameters", human_count(info.parameters)),
        ("context length", str(info.context_length or "-")),
        ("dtype", info.dtype or "-"),
        (
            "quantization",
            f"{q.bits} bits, group {q.group_size}, {q.mode}" + (f", {q.recipe}" if q.recipe else "")
            if q
            else "none",
        ),
        *([("quality", quality_text(info.quality))] if info.quality else []),
        *(
            [("measured", measured)]
            if info.quality and (measured := measurement_text(info.quality))
            else []
        ),
        ("size", human_size(info.size_bytes)),
        (
            "tools in template",
            {True: "yes", False: "no", None: "no template"}[info.template_takes_tools],
        ),
        (
            "chat template",
            f"{info.chat_template_file} ({human_size(len(info.chat_template.encode()))}; "
            f"mlxi show {name} --template prints it)"
            if info.chat_template is not None
            else "none (conversations reach the model as 'role: content' lines)",
        ),
        ("generation", generation_text(info.generation)),
    ]
    if src is not None:
        origin = src.repo_id or src.base or src.path or "-"
        lines.append(("source", f"{src.kind}: {origin}"))
        if src.commit:
            lines.append(("revision", f"{src.revision} @ {src.commit}"))
        if src.sha256:
            lines.append(("source sha256", src.sha256))
        if src.adapter_sha256:
            lines.append(("adapter", f"{src.path} (sha256 {src.adapter_sha256})"))
    if info.warm_caches:
        lines.append(("warm caches", ", ".join(info.warm_caches)))
    if info.in_use_by:
        lines.append(("in use by", "process " + ", ".join(map(str, info.in_use_by))))
    text = [f"{key:18} {value}" for key, value in lines] + ["files"]
    text += [f"  {f.path:32} {human_size(f.size):>10}  {f.sha256[:16] or '-'}" for f in info.files]
    return Result(info.to_dict(), text, warnings=quality_warnings(info.quality, q))
