"""A request inside a BatchedEngine's generator, prefilling or decoding, or alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from mlx_integrations.engine.batched.sampling import GuardedProcessors, GuardedSampler
from mlx_integrations.engine.generation import OutputBuilder
from mlx_integrations.engine.jobs import Job


class Served(TypedDict):
    """What the prefix cache learns when a request ends (``PrefixCache.put``)."""

    prompt: int
    reused: int


@dataclass
class Active:
    """A request inside the generator (prefilling or decoding)."""

    job: Job
    builder: OutputBuilder
    processors: GuardedProcessors | None
    sampler: GuardedSampler | None

    def __post_init__(self) -> None:
        # Whether any code of the caller's runs for it (processors, a custom sampler):
        # only then can it fail during a step.
        self.guarded = self.processors is not None or self.sampler is not None

    def served(self) -> Served:
        """What the prefix cache learns when the request ends: its prompt's length and
        the prefix it was served (see ``PrefixCache.put``)."""
        return {"prompt": len(self.job.tokens), "reused": self.builder.cached_tokens}

    def error(self) -> Exception | None:
        """What failed in the caller's code during a step, if anything."""
        if self.processors is not None and self.processors.error is not None:
            return self.processors.error
        if self.sampler is not None and self.sampler.error is not None:
            return self.sampler.error
        return None
