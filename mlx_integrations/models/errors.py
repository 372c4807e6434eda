"""Errors of the model store, each with a message and a hint a user can act on."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlx_integrations.models.quality.report import QuantizationQuality


class StoreError(Exception):
    """Base class of model store errors.

    Attributes:
        hint: One sentence that says what to do next, or None.
    """

    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint


class InvalidNameError(StoreError, ValueError):
    """A model name or alias that cannot be a store name (path traversal, bad characters)."""


class ModelNotFoundError(StoreError, LookupError):
    """A name that is neither in the store, the Hugging Face cache nor on disk."""


class ModelExistsError(StoreError):
    """A store name is already taken and overwriting was not asked for."""


class ManifestError(StoreError):
    """A stored model whose manifest cannot be read (damaged, or written by hand)."""


class AlreadyQuantizedError(StoreError, ValueError):
    """A quantized model was given to quantize again (mlx-lm would keep its weights as they
    are and the new name would claim a quantization it does not have)."""


class DamagedQuantizationError(StoreError):
    """``quantize_model(strict=True)`` measured the result as damaged and did not keep it.

    Attributes:
        quality: The figures measured.
    """

    def __init__(
        self, message: str, *, hint: str | None = None, quality: QuantizationQuality | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.quality = quality


class ModelInUseError(StoreError):
    """A model another process (or this one) has loaded would be removed.

    Attributes:
        pids: The processes that hold it.
    """

    def __init__(
        self, message: str, *, hint: str | None = None, pids: tuple[int, ...] = ()
    ) -> None:
        super().__init__(message, hint=hint)
        self.pids = pids


class HubError(StoreError):
    """The Hub refused or failed a download."""


class RepoNotFoundError(HubError):
    """The repository does not exist, or it is private and no valid token was given."""


class GatedRepoError(HubError):
    """The repository is gated: its terms must be accepted on the Hub first."""


class RevisionNotFoundError(HubError):
    """The branch, tag or commit does not exist in the repository."""


class RemoteFileMissingError(HubError):
    """A file listed by the repository could not be found on the Hub."""


class OfflineError(HubError):
    """The model is not cached and the Hub cannot be reached (or offline mode is on)."""


class IntegrityError(StoreError):
    """A file does not match the size or sha256 recorded for it."""


class StoreIOError(StoreError, OSError):
    """A write to the store failed (disk full, permission denied); the store is unchanged."""


class JSONFileError(ValueError):
    """A JSON file (config.json, a manifest, the alias file) that cannot be read or parsed.

    Attributes:
        path: The file.
    """

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path
