"""A warning when a model whose quantization was found damaged is loaded.

``quantize_model`` keeps its verdict in the manifest; every engine checks the folder it
is about to load with :func:`~mlx_integrations.models.resolve.check_model_dir`, which
calls :func:`warn_if_damaged`. So ``ChatMLX(model=...)``, ``MLXLLM``, ``mlxi run`` and
``mlxi serve`` say it alike, once per model in a process.

Silence it as any Python warning::

    import warnings
    from mlx_integrations.models import DamagedModelWarning

    warnings.filterwarnings("ignore", category=DamagedModelWarning)
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

from mlx_integrations.models.manifest import MANIFEST_FILE, Manifest
from mlx_integrations.models.quality.report import QuantizationQuality


class DamagedModelWarning(UserWarning):
    """A model is loaded whose quantization was measured as damaged ("expect garbled
    answers"): its figures are in the manifest (``mlxi show NAME``).

    Attributes:
        name: The model's store name.
        path: Its folder.
        quality: The figures measured when it was quantized.
        summary: The warning without its advice (the ``Warning:`` line of ``mlxi``).
        hint: What to do about it (the ``Hint:`` line).
    """

    def __init__(
        self, name: str, path: Path, quality: QuantizationQuality, summary: str, hint: str
    ) -> None:
        super().__init__(f"{summary} {hint}")
        self.name = name
        self.path = path
        self.quality = quality
        self.summary = summary
        self.hint = hint


_warned: set[tuple[str, str]] = set()
_lock = threading.Lock()


def damaged_quality(model_dir: Path) -> tuple[Manifest, QuantizationQuality] | None:
    """The manifest and figures of a model folder judged damaged, else None (a folder
    outside the store, an unreadable manifest, a model not measured or not damaged)."""
    if not (Path(model_dir) / MANIFEST_FILE).is_file():
        return None
    try:
        manifest = Manifest.read(Path(model_dir))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # the store's own commands report a damaged manifest
    quality = manifest.quality
    if quality is None or quality.verdict != "damaged":
        return None
    return manifest, quality


def warn_if_damaged(model_dir: Path, *, stacklevel: int = 2) -> DamagedModelWarning | None:
    """Warn (:class:`DamagedModelWarning`) when ``model_dir`` holds a model whose
    quantization was measured as damaged, once per model (folder and files) in a process.

    Args:
        model_dir: The folder about to be loaded.
        stacklevel: As for :func:`warnings.warn`, counted from the caller.

    Returns:
        The warning given now, or None (nothing to say, or said already).

    Examples:
        >>> warn_if_damaged(Path("/no/such/model")) is None
        True
    """
    found = damaged_quality(model_dir)
    if found is None:
        return None
    manifest, quality = found
    path = Path(model_dir).resolve()
    key = (str(path), manifest.digest)
    with _lock:
        if key in _warned:
            return None
    advice = quality.warning(manifest.quantization)
    assert advice is not None  # a damaged model always has one
    summary = f"Model {manifest.name!r} was found damaged when it was quantized: {advice.message}"
    warning = DamagedModelWarning(manifest.name, path, quality, summary, advice.hint)
    # Raises where warnings are errors: then it is not marked as given, and the next
    # load raises again.
    warnings.warn(warning, stacklevel=stacklevel + 1)
    with _lock:
        _warned.add(key)
    return warning
