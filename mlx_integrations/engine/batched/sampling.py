"""Samplers and logits processors of requests that share one batch.

A failure inside mlx-lm's ``BatchGenerator.next()`` would leave the whole batch
half-stepped, so each request's processors and sampler catch their own errors and
remember them; the engine then ends only that request. A seeded request samples with
its own random key, so what runs beside it does not change its draws.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlx_integrations.chat.fields import Sampling
from mlx_integrations.engine.decoding import repair_random_state
from mlx_integrations.engine.params import SamplingParams


class GuardedProcessors:
    """A request's logits processors run as one; a failure ends only that request.

    An exception raised inside ``BatchGenerator.next()`` would leave the shared batch
    half-stepped, so errors are caught here, remembered, and the logits pass through
    unchanged until the request is taken out of the batch.
    """

    def __init__(self, processors: list[Callable[..., Any]]):
        self.processors = processors
        self.error: Exception | None = None

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx

        if self.error is not None:
            return logits
        try:
            out = logits
            for processor in self.processors:
                out = processor(tokens, out)
            if not isinstance(out, mx.array) or out.shape != logits.shape:
                shape = getattr(out, "shape", type(out).__name__)
                raise TypeError(
                    f"a logits processor returned {shape}, expected an mx.array of shape "
                    f"{logits.shape}"
                )
            return out
        except Exception as exc:
            self.error = exc
            repair_random_state()  # before the samplers of this same step draw from it
            return logits


class GuardedSampler:
    """A sampler whose failure ends the requests using it, not the batch."""

    def __init__(self, sampler: Callable[[Any], Any]):
        self.sampler = sampler
        self.error: Exception | None = None

    def __call__(self, logprobs: Any) -> Any:
        import mlx.core as mx

        if self.error is None:
            try:
                return self.sampler(logprobs)
            except Exception as exc:
                self.error = exc
                repair_random_state()  # the other samplers of this step draw next
        return mx.argmax(logprobs, axis=-1)


class SeededSampler:
    """Samples with a request's own random key.

    mlx-lm's samplers draw from MLX's global random state, which every request in
    the batch advances; a private key keeps a seeded request reproducible whatever
    else runs beside it. The filters are mlx-lm's, in ``make_sampler``'s order.
    """

    def __init__(self, p: Sampling, seed: int):
        import mlx.core as mx
        from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

        self._key = mx.random.key(seed)
        self._scale = 1.0 / p.temperature
        self._filters: list[Callable[[Any], Any]] = []
        top_p, min_p, top_k = p.top_p, p.min_p, p.top_k
        if 0 < top_p < 1.0:
            self._filters.append(lambda x: apply_top_p(x, top_p))
        if min_p != 0.0:
            self._filters.append(lambda x: apply_min_p(x, min_p))
        if top_k > 0:
            self._filters.append(lambda x: apply_top_k(x, top_k))

    def __call__(self, logprobs: Any) -> Any:
        import mlx.core as mx

        for method in self._filters:
            logprobs = method(logprobs)
        self._key, key = mx.random.split(self._key)
        return mx.random.categorical(logprobs * self._scale, key=key)


class SharedSamplers:
    """Each request's sampler: None (the generator's shared greedy one) at temperature 0.

    Requests with the same settings share one sampler object, so the generator samples
    them in one call; a seeded request gets its own. Owner thread only.
    """

    MAX_SHARED = 32
    """Distinct settings kept before the table starts over."""

    def __init__(self) -> None:
        self._shared: dict[tuple[float, float, float, int], GuardedSampler] = {}

    def for_request(self, params: SamplingParams) -> GuardedSampler | None:
        from mlx_lm.sample_utils import make_sampler

        p = params.sampling
        if p.temperature == 0:
            return None
        if p.seed is not None:
            return GuardedSampler(SeededSampler(p, p.seed))
        key = (p.temperature, p.top_p, p.min_p, p.top_k)
        sampler = self._shared.get(key)
        if sampler is None or sampler.error is not None:
            if len(self._shared) >= self.MAX_SHARED:
                self._shared.clear()
            sampler = GuardedSampler(
                make_sampler(p.temperature, top_p=p.top_p, min_p=p.min_p, top_k=p.top_k)
            )
            self._shared[key] = sampler
        return sampler

    def clear(self) -> None:
        self._shared.clear()
