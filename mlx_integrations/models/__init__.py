"""The model store: pull, quantize, import, list, show, remove, verify and warm models.

Everything the ``mlxi`` command does is a call to this package. Importing it is cheap:
MLX, mlx-lm and huggingface_hub are imported by the functions that need them.

Examples:
    >>> from mlx_integrations.models import pull, quantize_model, resolve_model  # doctest: +SKIP
    >>> pull("mlx-community/SmolLM2-135M-Instruct")  # doctest: +SKIP
    >>> quantize_model("mlx-community/SmolLM2-135M-Instruct", "smollm2-q4", bits=4)  # doctest: +SKIP
    >>> resolve_model("smollm2-q4")  # doctest: +SKIP
"""

from __future__ import annotations

from mlx_integrations.lazy_imports import lazy_attributes

_EXPORTS = {
    "ModelStore": "store",
    "StoredModel": "store",
    "RemoveResult": "cleanup",
    "PruneReport": "cleanup",
    "PruneItem": "cleanup",
    "default_store": "store",
    "store_home": "store",
    "list_models": "store",
    "get_model": "store",
    "remove_model": "cleanup",
    "tag_model": "store",
    "verify_model": "store",
    "prune": "cleanup",
    "ModelLease": "leases",
    "lease_model_folder": "store",
    "Manifest": "manifest",
    "ModelSource": "manifest",
    "FileEntry": "manifest",
    "QuantizationInfo": "manifest",
    "VerifyReport": "manifest",
    "FileCheck": "manifest",
    "validate_name": "names",
    "resolve_model": "resolve",
    "pull": "hub.pull",
    "PullResult": "hub.pull",
    "MODEL_FILE_PATTERNS": "hub.pull",
    "quantize_model": "quantize",
    "QuantizationQuality": "quality.report",
    "QualityWarning": "quality.report",
    "DamagedModelWarning": "quality.load_warning",
    "measure_quality": "quality.measure",
    "import_model": "importer",
    "fuse_model": "lora.fuse",
    "read_adapter": "lora.adapter",
    "AdapterInfo": "lora.adapter",
    "show_model": "info",
    "ModelInfo": "info",
    "GenerationDefaults": "info",
    "warm_model": "warm",
    "WarmResult": "warm",
    "load_warm_caches": "warm",
    "warm_weights": "warm",
    "remove_warm_cache": "warm",
    "WarmRemoval": "warm",
    "ProgressUpdate": "progress",
    "StoreError": "errors",
    "InvalidNameError": "errors",
    "ModelNotFoundError": "errors",
    "ModelExistsError": "errors",
    "AlreadyQuantizedError": "errors",
    "DamagedQuantizationError": "errors",
    "ManifestError": "errors",
    "ModelInUseError": "errors",
    "HubError": "errors",
    "RepoNotFoundError": "errors",
    "GatedRepoError": "errors",
    "RevisionNotFoundError": "errors",
    "RemoteFileMissingError": "errors",
    "OfflineError": "errors",
    "IntegrityError": "errors",
    "StoreIOError": "errors",
    "JSONFileError": "errors",
    "read_json": "folders",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_attributes(
    __name__, {name: f"{__name__}.{module}" for name, module in _EXPORTS.items()}
)


def __dir__() -> list[str]:
    return __all__
