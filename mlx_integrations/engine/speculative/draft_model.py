"""A draft model: a second, smaller model of the same vocabulary proposes tokens.

mlx-lm's ``speculative_generate_step`` runs the rounds for a request alone; the draft
model's weights load with the target's, on the owner thread, and its KV cache of the
last request is reused when the next prompt extends it. ``BatchedEngine``'s shared
batch drafts through :mod:`mlx_integrations.engine.batched.draft_model`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

from mlx_integrations.engine.cache.prefix_cache import cache_offset, common_prefix_len
from mlx_integrations.engine.decoding import Step, prefill
from mlx_integrations.models.resolve import check_model_dir, lease_model, resolve_model_path


def check_draft_vocabulary(target_tokenizer: Any, draft_tokenizer: Any, draft: str) -> None:
    """Refuse a draft model whose tokenizer does not share the target's vocabulary.

    Raises:
        ValueError: Naming both vocabulary sizes.
    """
    target_size, draft_size = len(target_tokenizer.vocab), len(draft_tokenizer.vocab)
    if target_size != draft_size:
        raise ValueError(
            f"The draft model {draft!r} has a vocabulary of {draft_size} tokens but the "
            f"target model has {target_size}; use a draft model of the same family "
            "(same tokenizer), or prompt_lookup instead of a draft model"
        )


def draft_model_steps(
    model: Any,
    draft_model: Any,
    prompt: list[int],
    cache: list[Any],
    draft_cache: list[Any],
    *,
    num_draft_tokens: int,
    max_tokens: int,
    sampler: Callable[[Any], Any],
    prefill_step_size: int,
) -> Generator[Step, None, None]:
    """Decode with mlx-lm's ``speculative_generate_step`` and a draft model.

    ``cache`` and ``draft_cache`` must hold the same tokens; ``prompt`` is what
    follows them. On close, both caches are left holding only tokens yielded so far
    (mlx-lm rewinds them), so they can be stored for the next request.
    """
    import mlx.core as mx
    from mlx_lm.generate import speculative_generate_step

    steps = speculative_generate_step(
        mx.array(prompt, mx.uint32),
        model,
        draft_model,
        num_draft_tokens=num_draft_tokens,
        max_tokens=max_tokens,
        sampler=sampler,
        prompt_cache=[*cache, *draft_cache],
        prefill_step_size=prefill_step_size,
    )
    produced = 0
    opens_round = True
    try:
        for token, _, from_draft in steps:
            # mlx-lm drafts min(num_draft_tokens, tokens left) per round; a round ends
            # with the target's own token.
            drafted = min(num_draft_tokens, max_tokens - produced) if opens_round else 0
            produced += 1
            opens_round = not from_draft
            yield int(token), drafted, bool(from_draft)
    finally:
        steps.close()


class DraftCache:
    """The draft model's KV cache of the last request, reused when a prompt extends it.

    The target's prefix cache hands a request the KV of ``reused`` prompt tokens; the
    draft model must hold the same tokens, so its cache is trimmed to the common
    prefix and the rest prefilled. Owner thread only.
    """

    def __init__(self) -> None:
        self._tokens: list[int] = []
        self._cache: list[Any] | None = None

    def take(self, model: Any, prefix: list[int], step_size: int) -> list[Any]:
        """A draft cache holding exactly ``prefix``."""
        cache, keep = self.take_shared(model, prefix)
        prefill(model, cache, prefix[keep:], step_size)
        return cache

    def take_shared(self, model: Any, tokens: list[int]) -> tuple[list[Any], int]:
        """A draft cache cut to what it shares with ``tokens``, and how many it holds;
        the caller prefills the rest (a piece at a time)."""
        from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

        cache, held = self._cache, self._tokens
        self.clear()
        keep = common_prefix_len(held, tokens) if cache is not None else 0
        if cache is None or keep == 0:
            return make_prompt_cache(model), 0
        trim_prompt_cache(cache, cache_offset(cache) - keep)
        return cache, keep

    def put(self, tokens: list[int], cache: list[Any]) -> None:
        """Keep the draft cache of ``tokens`` (it may hold fewer, never other ones)."""
        from mlx_lm.models.cache import trim_prompt_cache

        offset = cache_offset(cache)
        if offset > len(tokens):
            trim_prompt_cache(cache, offset - len(tokens))
            offset = len(tokens)
        self._tokens, self._cache = tokens[:offset], cache

    def clear(self) -> None:
        self._tokens, self._cache = [], None


class DraftModel:
    """An engine's draft model: its folder (checked at construction), its weights
    (loaded with the target, on the owner thread), and the KV cache of the last request
    that drafted with it.

    Raises:
        FileNotFoundError: The folder, its config or its weights are missing.
    """

    def __init__(self, name: str | Path | None):
        self.name = name
        self.path = None if name is None else resolve_model_path(name)
        if self.path is not None:
            check_model_dir(self.path)
        # Owner thread only.
        self.model: Any = None
        self.cache = DraftCache()
        self._lease: Any = None

    def load(self, target_tokenizer: Any) -> None:
        """Load the weights, if there is a draft model.

        Raises:
            ValueError: Its vocabulary differs from the target's (the lease is released).
        """
        if self.path is None:
            return
        import mlx_lm

        lease = lease_model(self.path)
        try:
            loaded = mlx_lm.load(str(self.path))
            check_draft_vocabulary(target_tokenizer, loaded[1], str(self.name))
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        self.model, self._lease = loaded[0], lease

    def unload(self) -> None:
        self.cache.clear()
        self.model = None
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()
