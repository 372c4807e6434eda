"""Engines that run their requests one after the other on the owner thread.

``SimpleEngine`` and ``DistributedEngine`` take one request at a time: the owner
thread's executor queue is their wait line, and each request runs to its end there
before the next one starts. ``BatchedEngine`` runs its requests together instead.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from concurrent.futures import ThreadPoolExecutor

from mlx_integrations.engine.decoding import repair_random_state
from mlx_integrations.engine.generation import MLXGenerationOutput
from mlx_integrations.engine.jobs import Job, aborted_output
from mlx_integrations.engine.mlx_engine import MLXEngine

logger = logging.getLogger(__name__)


class SerialEngine(MLXEngine):
    """An :class:`MLXEngine` that runs one request at a time, in arrival order.

    Subclasses implement :meth:`_generate` (one request, start to end, on the owner
    thread); a failure there ends that request only, and the engine serves the next.
    """

    def _is_full(self) -> bool:
        return bool(self._jobs)

    def _kv_total(self, reserved: list[int]) -> int:
        # One request runs at a time; the one before gave its KV to the prefix cache.
        return max(reserved, default=0)

    def _dispatch(self, executor: ThreadPoolExecutor, job: Job) -> None:
        # The executor's single worker is the owner thread; its queue is the wait line.
        executor.submit(self._execute, job)

    def _execute(self, job: Job) -> None:
        """Run one request to its end on the owner thread."""
        refusal = self._refusal(job)
        if refusal is not None:
            self._finish(job, refusal)
            return
        self._mark_running(job)
        result: MLXGenerationOutput | BaseException
        try:
            result = self._generate(job)
        except Exception as exc:
            if self._ends_engine(exc):
                return
            # The request's KV cache is dropped (never stored half-updated, see
            # _generate); MLX's random state may need a reseed before the next one.
            logger.debug("Request %s failed", job.params.request_id, exc_info=True)
            repair_random_state()
            result = exc
        self._finish(job, result)

    def _refusal(self, job: Job) -> MLXGenerationOutput | BaseException | None:
        """What ends ``job`` before it starts: its own abort, by default."""
        return aborted_output(job) if job.abort.is_set() else None

    def _ends_engine(self, exc: Exception) -> bool:
        """Whether ``exc`` ended the engine itself, which then ends every request."""
        return False

    @abstractmethod
    def _generate(self, job: Job) -> MLXGenerationOutput:
        """Run ``job`` from its prompt to its last token; its last chunk is returned."""
