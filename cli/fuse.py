"""``mlxi fuse``: fold a LoRA adapter into its base model, as a new model of the store."""

from __future__ import annotations

from pathlib import Path

import typer
from mlx_integrations.cli.errors import handle_errors
from mlx_integrations.cli.options import JSON_OPTION
from mlx_integrations.cli.output import Result, human_size, prints_result


@handle_errors
@prints_result
def fuse(
    base: str = typer.Argument(
        ..., help="The model the adapter was trained on: store name, repo id or folder."
    ),
    adapter: Path = typer.Argument(
        ..., help="The adapter folder of mlx_lm.lora (adapter_config.json, adapters.safetensors)."
    ),
    name: str = typer.Argument(..., help="Store name of the fused model."),
    dequantize: bool = typer.Option(
        False, "--dequantize", help="Write unquantized weights (for a quantized base)."
    ),
    force: bool = typer.Option(False, "--force", help="Replace a model of that name."),
    json_output: bool = JSON_OPTION,
) -> Result:
    """Fold a LoRA adapter (what mlx_lm.lora trained) into its base model, as a new model.

    The fused model answers as BASE with the adapter does (mlxi run BASE --adapter
    ADAPTER), with no adapter to load; its manifest names BASE and the sha256 of the
    adapter's weights (mlxi show). A quantized BASE stays quantized unless --dequantize.
    """
    from mlx_integrations.cli.progress import progress_bars

    from mlx_integrations.models.lora.fuse import fuse_model

    with progress_bars() as progress:
        model = fuse_model(
            base, adapter, name, dequantize=dequantize, overwrite=force, progress=progress
        )
    src = model.manifest.source
    data = {
        **model.summary(),
        "base": src.base,
        "adapter": src.path,
        "adapter_sha256": src.adapter_sha256,
    }
    size = human_size(model.manifest.size_bytes)
    return Result(data, [f"fused {src.path} into {base} -> {model.name} ({size})"])
