"""The options a ``BatchedEngine`` is made with: every ``EngineOptions`` field, and the
size of its running batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mlx_integrations.chat.fields import RequestError, RequestTypeError, checking
from mlx_integrations.engine.cache.kv_quantization import check_batched_kv_options
from mlx_integrations.engine.options import EngineOptions


@dataclass(frozen=True)
class BatchedOptions(EngineOptions):
    """How :class:`~mlx_integrations.engine.batched.engine.BatchedEngine` serves its model.

    Examples:
        >>> from mlx_integrations.engine.batched.options import BatchedOptions
        >>> BatchedOptions(max_num_seqs=16).max_num_seqs
        16

    Raises:
        RequestError: A bad value, naming its field (a ``TypeError`` too for a wrong type).
    """

    engine_name: ClassVar[str] = "BatchedEngine"

    max_num_seqs: int = 8
    """Most requests in the running batch; more wait in line (or, with
    ``admission="fail_fast"``, are refused with ``EngineBusy``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        size = self.max_num_seqs
        if isinstance(size, bool) or not isinstance(size, int):
            raise RequestTypeError(f"max_num_seqs must be an integer, got {size!r}", "max_num_seqs")
        if size < 1:
            raise RequestError(f"max_num_seqs must be at least 1, got {size}", "max_num_seqs")
        with checking("quantized_kv_start"):
            check_batched_kv_options(self.kv_bits, self.quantized_kv_start)
