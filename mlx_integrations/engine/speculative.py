"""Speculative decoding for ``SimpleEngine``: drafts from a small model or from the context.

Two draft sources propose a few tokens; the target model checks them in one forward
pass over ``[last token + drafts]`` and keeps the longest prefix where its own choice
equals the draft, plus the token it chose after that prefix. The KV cache of the
rejected rest is trimmed away (mlx-lm's ``trim_prompt_cache``), so the tokens are the
ones plain decoding gives:

- ``draft_model``: mlx-lm's ``speculative_generate_step`` with a second, smaller model
  that shares the target's vocabulary.
- ``prompt_lookup``: no second model; the tokens that followed the latest earlier
  occurrence of the context's last n-gram (3, 2, then 1 tokens) are proposed. Cheap,
  and it pays off where the reply copies its input (RAG quotes, code edits). A round
  runs where a :class:`~.step_pace.LookupPace` expects it to pay; between rounds the
  loop decodes plain steps, pipelined as mlx-lm's are.

Both yield ``(token, drafted, accepted)``: the token, how many tokens were drafted
for the verification round this token opens (0 on the round's other tokens), and
whether the token was a draft the target accepted.

With ``temperature > 0`` the target samples at every drafted position and a draft is
kept only when it equals the target's sample there, so the reply follows the target's
own distribution (a seeded request draws differently from plain decoding, though).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any

from mlx_integrations.engine.loading import check_model_dir, lease_model, resolve_model_path
from mlx_integrations.engine.prefix_cache import cache_offset, common_prefix_len
from mlx_integrations.engine.step_pace import LookupPace, StepKind

Step = tuple[int, int, bool]
"""``(token, tokens drafted for the round this token opens, accepted draft)``."""

CLEAR_EVERY = 256
"""Decode steps between two returns of MLX's buffer pool (as mlx-lm's ``generate_step``)."""


def return_buffers(produced: int) -> None:
    """Give MLX's buffer pool back after the reply's first token (the prefill's
    temporaries) and every ``CLEAR_EVERY`` tokens after it, as mlx-lm does."""
    import mlx.core as mx

    if produced % CLEAR_EVERY == 1:
        mx.clear_cache()


NGRAM_SIZES = (3, 2, 1)
"""n-gram lengths tried by prompt lookup, longest first."""


def validate_speculative_options(
    draft_model: Any, num_draft_tokens: Any, prompt_lookup: Any
) -> None:
    """Check the speculative decoding options of an engine.

    Raises:
        TypeError: A value of the wrong type. ValueError: out of range, or both sources.
    """
    if draft_model is not None and (
        not isinstance(draft_model, (str, Path)) or not str(draft_model).strip()
    ):
        raise TypeError(
            f"draft_model must be a model folder, store name or pulled Hub id, got "
            f"{draft_model!r}; pass None to decode without a draft model"
        )
    for name, value, low, fix in (
        ("num_draft_tokens", num_draft_tokens, 1, "2 to 5 is usual"),
        ("prompt_lookup", prompt_lookup, 0, "0 turns prompt lookup off, 4 to 10 is usual"),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an integer, got {value!r}; {fix}")
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}; {fix}")
    if draft_model is not None and prompt_lookup:
        raise ValueError(
            f"draft_model={str(draft_model)!r} and prompt_lookup={prompt_lookup} are two "
            "draft sources; pick one (prompt_lookup=0 or draft_model=None)"
        )


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


class NgramIndex:
    """Where each recent n-gram of a token sequence was last followed by a token."""

    def __init__(self, tokens: Sequence[int], sizes: Sequence[int] = NGRAM_SIZES):
        self.tokens: list[int] = []
        self._sizes = sorted(sizes, reverse=True)
        # n-gram -> index of the token that followed its latest occurrence.
        self._follower: dict[tuple[int, ...], int] = {}
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        end = len(self.tokens)
        for n in self._sizes:
            if end >= n:
                self._follower[tuple(self.tokens[end - n : end])] = end
        self.tokens.append(token)

    def propose(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens that followed the longest n-gram ending the sequence."""
        return self.match(limit)[1]

    def match(self, limit: int) -> tuple[int, list[int]]:
        """``(n, tokens)``: the longest n-gram ending the sequence that occurred before,
        and up to ``limit`` tokens that followed it; ``(0, [])`` for none."""
        if limit <= 0:
            return 0, []
        end = len(self.tokens)
        for n in self._sizes:
            if end >= n:
                start = self._follower.get(tuple(self.tokens[end - n :]))
                if start is not None:
                    return n, self.tokens[start : start + limit]
        return 0, []


def prefill(
    model: Any,
    cache: list[Any],
    tokens: Sequence[int],
    step_size: int,
    quantize: Callable[[list[Any]], None] | None = None,
) -> None:
    """Feed ``tokens`` into ``cache`` in pieces of ``step_size``.

    ``quantize`` (if given) runs on the cache after each piece, and MLX's buffer pool
    is given back after each, as mlx-lm does.
    """
    import mlx.core as mx
    from mlx_lm.generate import generation_stream

    with mx.stream(generation_stream):
        for start in range(0, len(tokens), step_size):
            piece = list(tokens[start : start + step_size])
            model(mx.array(piece, mx.uint32)[None], cache=cache)
            if quantize is not None:
                quantize(cache)
            mx.eval([c.state for c in cache])
            mx.clear_cache()


def prompt_lookup_steps(
    model: Any,
    context: list[int],
    new_tokens: int,
    cache: list[Any],
    *,
    max_draft: int,
    max_tokens: int,
    sampler: Callable[[Any], Any],
    prefill_step_size: int,
    quantize: Callable[[list[Any]], None] | None = None,
    pace: LookupPace | None = None,
) -> Generator[Step, None, None]:
    """Decode with drafts looked up in the context (prompt and reply so far).

    Where the context has a match, a round verifies ``[last token, drafts...]`` in one
    forward pass. Elsewhere the loop decodes as mlx-lm's does, one token a step, each
    step started before the previous token is read, so the host builds the next step
    while the device computes this one; where a match turns up there, the step already
    running checks its first draft, and a round verifies the rest. ``pace`` tells
    whether a round pays for the match at hand (:class:`~.step_pace.LookupPace`); None
    drafts wherever a match exists, so which steps draft depends on the tokens alone (a
    seeded request's draws are reproducible).

    On close, ``cache`` holds the context but the last token yielded (positions fed
    beyond it, by a step whose pick is unread or by drafts kept but not yet yielded,
    are dropped).

    Args:
        model: The target model.
        context: The whole prompt; its last ``new_tokens`` are not in ``cache`` yet.
        new_tokens: Prompt tokens left to prefill (at least one).
        cache: The target's KV cache holding the rest of the prompt; must be trimmable.
        max_draft: Most tokens proposed per round.
        max_tokens: Tokens to generate.
        sampler: Picks a token per row of log-probabilities (argmax when greedy).
        prefill_step_size: Prompt tokens per forward pass.
        quantize: Run on ``cache`` after each forward pass: it may replace layers in
            place with quantized ones (a quantized KV cache).
        pace: Whether a round pays, by timing and by how well matches were followed.
    """
    import mlx.core as mx
    from mlx_lm.generate import generation_stream
    from mlx_lm.models.cache import trim_prompt_cache

    def forward(tokens: list[int] | Any) -> Any:
        """Log-probabilities at every position of ``tokens``, fed into ``cache``."""
        fed = mx.array(tokens, mx.uint32) if isinstance(tokens, list) else tokens
        logits = model(fed[None], cache=cache)[0]
        if quantize is not None:
            quantize(cache)
        return logits - mx.logsumexp(logits, axis=-1, keepdims=True)

    def plain_step(token: list[int] | Any) -> Any:
        """Feed one token (maybe still being computed) and start sampling the next."""
        sampled = sampler(forward(token))
        mx.async_eval(sampled)
        return sampled

    index = NgramIndex(context)
    last = context[-1]  # the newest token, not fed yet
    produced = 0
    ahead = 0  # positions the cache holds beyond the context before the last token yielded
    # A round not run, followed over the tokens that come: (n, drafts, agreed so far).
    shadow: tuple[int, list[int], int] | None = None
    mark = time.perf_counter()  # when the last step (or the prefill) ended

    def match() -> tuple[int, list[int], bool]:
        """The drafts after the context, their n-gram's length, and whether the
        tokens left did not cut them (only such rounds tell how far a match is
        followed)."""
        room = min(max_draft, max_tokens - produced - 1)  # the model's token comes after
        n, drafts = index.match(room)
        return n, drafts, room == max_draft

    def timed(kind: StepKind) -> None:
        nonlocal mark
        now = time.perf_counter()
        if pace is not None:
            pace.timed(kind, now - mark)
        mark = now

    def observe(n: int, emitted: int, full: bool) -> None:
        if pace is not None and full:
            pace.observe(n, emitted)

    def skipped(n: int, drafts: list[int], full: bool) -> None:
        """A match the pace declined: follow its drafts, unless one is followed already."""
        nonlocal shadow
        if drafts and shadow is None and full:
            shadow = (n, drafts, 0)

    def follow(token: int) -> None:
        """A token the model picked, checked against the drafts of the round not run."""
        nonlocal shadow
        if shadow is None:
            return
        n, drafts, agreed = shadow
        if token == drafts[agreed]:
            agreed += 1
            if agreed < len(drafts):
                shadow = (n, drafts, agreed)
                return
        observe(n, agreed + 1, True)  # a round emits its agreed drafts and one more
        shadow = None

    with mx.stream(generation_stream):
        prefill(model, cache, context[len(context) - new_tokens : -1], prefill_step_size, quantize)
        mark = time.perf_counter()
        try:
            # A round whose first draft the step in flight confirmed: (n, rest, full).
            opened: tuple[int, list[int], bool] | None = None
            while produced < max_tokens:
                kept = 0
                if opened is not None:
                    (n, drafts, full), opened, kept = opened, None, 1
                else:
                    n, drafts, full = match()
                    if drafts and not (pace is None or pace.worth(n)):
                        skipped(n, drafts, full)
                        drafts = []
                if drafts or kept:
                    chosen: list[int] = sampler(forward([last, *drafts])).tolist()
                    accepted = 0
                    while accepted < len(drafts) and chosen[accepted] == drafts[accepted]:
                        accepted += 1
                    # The cache now holds the last token and every draft: drop the rejected.
                    trim_prompt_cache(cache, len(drafts) - accepted)
                    timed("round" if drafts else "step")
                    observe(n, kept + accepted + 1, full)
                    for i, token in enumerate(chosen[: accepted + 1]):
                        follow(token)
                        index.append(token)
                        produced += 1
                        ahead = accepted - i  # the kept drafts from this one on
                        yield token, len(drafts) if i == 0 and not kept else 0, i < accepted
                        return_buffers(produced)
                    last = chosen[accepted]
                    continue
                # Plain steps, each started before the last one's token is read (but
                # the reply's first token, handed out as soon as it is computed).
                pending, pipelined = plain_step([last]), False
                while True:
                    following = None
                    if 0 < produced < max_tokens - 1:
                        following = plain_step(pending)
                    ahead = int(following is not None)  # it fed ``token``
                    token = int(pending.item())
                    timed("pipelined" if pipelined else "step")
                    pipelined = True
                    follow(token)
                    index.append(token)
                    produced += 1
                    yield token, 0, False
                    return_buffers(produced)
                    if following is None:
                        if produced == max_tokens:
                            return
                        last = token  # the first token: not fed yet
                        break
                    n, drafts, full = match()
                    if drafts and (pace is None or pace.worth(n)):
                        # The step in flight picks the token the first draft guesses.
                        last, ahead = int(following.item()), 0
                        timed("pipelined")
                        follow(last)
                        index.append(last)
                        produced += 1
                        if last == drafts[0]:
                            opened = (n, drafts[1:], full)  # a round verifies the rest
                            yield last, len(drafts), True
                        else:
                            observe(n, 1, full)
                            yield last, 1, False
                        return_buffers(produced)
                        break
                    skipped(n, drafts, full)
                    pending = following
        finally:
            if ahead:
                trim_prompt_cache(cache, ahead)


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
