"""Fuse an adapter into its base model, as a new model of the store.

The fused model answers as the base model with the adapter does, without the adapter
at run time: LoRA's two small matrices are folded into each covered weight by mlx-lm's
own layers (``LoRALinear.fuse``, the step ``mlx_lm.fuse`` runs), and mlx-lm writes the
folder. It is built in a temporary folder of the store and renamed into place, with a
manifest that names the base model and the adapter's sha256.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

from mlx_integrations.models.folders import read_json_object
from mlx_integrations.models.lora.adapter import check_text_model, read_adapter
from mlx_integrations.models.manifest import Manifest, ModelSource, hash_files, model_files
from mlx_integrations.models.manifest import sha256_file as file_sha256
from mlx_integrations.models.names import validate_name
from mlx_integrations.models.progress import ProgressCallback, report
from mlx_integrations.models.quantize import _base
from mlx_integrations.models.resolve import resolve_model
from mlx_integrations.models.store import ModelStore, StoredModel, default_store


def fuse_model(
    base: str | Path,
    adapter_path: str | Path,
    name: str,
    *,
    dequantize: bool = False,
    store: ModelStore | None = None,
    overwrite: bool = False,
    progress: ProgressCallback | None = None,
) -> StoredModel:
    """Fold an adapter (``mlx_lm.lora``'s output folder) into its base model, into the store.

    The result loads like any model (no ``adapter_path`` needed) and gives the replies of
    the base model with the adapter, up to the rounding of the folded weights. A
    quantized base stays quantized (the folded weights are quantized again) unless
    ``dequantize`` is set.

    Args:
        base: The model the adapter was trained on (store name, pulled repo id or folder).
        adapter_path: The adapter folder (``adapter_config.json``, ``adapters.safetensors``).
        name: Store name of the fused model.
        dequantize: Write unquantized weights (for a quantized base).
        store: The store (default: ``$MLXI_HOME``).
        overwrite: Replace a model of that name.
        progress: Receives ``"fuse"`` updates.

    Returns:
        The fused model in the store; its manifest's source is ``kind="fuse"``, ``base``
        the base model, ``path`` the adapter folder and ``adapter_sha256`` the sha256 of
        its ``adapters.safetensors``.

    Raises:
        ValueError: A bad adapter folder, an adapter that does not fit the base model,
            or a vision-language base model.

    Examples:
        >>> fuse_model("smollm2-135m-instruct", "adapters", "smollm2-support")  # doctest: +SKIP
        >>> # then: ChatMLX(model="smollm2-support")
    """
    adapter = read_adapter(adapter_path)
    store = store or default_store()
    name = validate_name(name)
    base_path = resolve_model(base, store=store)
    check_text_model(read_json_object(base_path / "config.json"), str(base), adapter.path)
    adapter_sha256 = file_sha256(adapter.weights)
    with store.building(name, overwrite=overwrite) as build:
        report(progress, "fuse", "Fusing the adapter", 0, 1, "step")
        # mlx-lm prints as it loads and saves; keep stdout for results.
        with contextlib.redirect_stdout(sys.stderr):
            _fuse(base_path, adapter.path, build.path, dequantize, str(base))
        report(progress, "fuse", "Fusing the adapter", 1, 1, "step", done=True)
        from mlx_integrations.models.hub.pull import dtype_of, quantization_of

        fused_config = read_json_object(build.path / "config.json")
        manifest = Manifest(
            name=name,
            source=ModelSource(
                kind="fuse",
                base=_base(base),
                path=str(adapter.path),
                adapter_sha256=adapter_sha256,
            ),
            files=hash_files(build.path, model_files(build.path)),
            quantization=quantization_of(fused_config),
            dtype=dtype_of(fused_config),
        )
        return build.commit(manifest)


def _fuse(base: Path, adapter: Path, out: Path, dequantize: bool, shown: str) -> None:
    """Load ``base`` with ``adapter``, fold every layer that can fuse, write ``out``."""
    from mlx.utils import tree_unflatten
    from mlx_lm.utils import dequantize_model, load, save

    from mlx_integrations.models.lora.adapter import apply_adapter

    loaded: Any = load(str(base), return_config=True)
    model, tokenizer, config = loaded
    model = apply_adapter(model, adapter, shown)
    # Each LoRA/DoRA layer of mlx-lm knows how to fold itself into a plain layer.
    fused = [
        (n, m.fuse(dequantize=dequantize)) for n, m in model.named_modules() if hasattr(m, "fuse")
    ]
    if fused:
        model.update_modules(tree_unflatten(fused))
    if dequantize:
        model = dequantize_model(model)
        config.pop("quantization", None)
        config.pop("quantization_config", None)
    save(out, base, model, tokenizer, config, donate_model=False)
