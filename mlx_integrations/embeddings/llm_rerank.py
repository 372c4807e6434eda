"""LLM rerankers: a chat model scores a document by the odds of answering "yes".

This is the Qwen3-Reranker recipe. The model is asked, in its chat template with
thinking off, whether the document meets the query (under an instruction), and the
score is the probability of "yes" against "no" at the first answer token:
``exp(yes) / (exp(yes) + exp(no))`` over those two logits. With Qwen3's template the
prompt is token for token the recipe's own (system turn, user turn, then the assistant
turn opened with an empty ``<think>`` block).

It runs through any chat engine of the contract (:class:`~mlx_integrations.engine.base.BaseEngine`):
one request of one token per document, whose logits a logits processor reads. On
``BatchedEngine`` the documents of a call share its decode steps and the prefix cache
holds what their prompts share (the instruction and the query).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlx_integrations.embeddings.rerank_engine import RerankScores
from mlx_integrations.engine.base import BaseEngine
from mlx_integrations.models.resolve import model_kind

__all__ = ["DEFAULT_INSTRUCTION", "JUDGE_PROMPT", "LLMReranker", "is_llm_reranker_folder"]

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
"""Qwen3-Reranker's default instruction."""

JUDGE_PROMPT = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".'
)
"""The system turn of the recipe."""


def is_llm_reranker_folder(path: Path, config: dict[str, Any]) -> bool:
    """A causal LM named as a reranker (Qwen3-Reranker and its conversions).

    Its config is that of the base chat model, so the name of its folder (or of the
    repository it came from, in the Hugging Face cache) is what tells them apart; see
    :func:`mlx_integrations.models.resolve.model_kind`.
    """
    architectures = config.get("architectures") or []
    causal = any(str(a).endswith("ForCausalLM") for a in architectures)
    return causal and model_kind(path) == "reranker"


class LLMReranker:
    """Scores documents with a chat model's "yes"/"no" logits (Qwen3-Reranker).

    Args:
        engine: The chat engine of the reranker model (any ``BaseEngine``).
        instruction: What relevance means for this task (the recipe's ``<Instruct>``).
        concurrency: Documents in flight at once (each is one request of one token).

    Raises:
        ValueError: When "yes" or "no" is not one token of the engine's tokenizer.

    Examples:
        >>> from mlx_integrations.engine import pool
        >>> engine = pool.acquire("qwen3-reranker-0.6b")  # doctest: +SKIP
        >>> LLMReranker(engine).score("What runs on Macs?", ["MLX runs on Apple silicon."])
        ... # doctest: +SKIP
        RerankScores(scores=[0.98], tokens=61)
    """

    def __init__(
        self,
        engine: BaseEngine,
        *,
        instruction: str = DEFAULT_INSTRUCTION,
        concurrency: int = 8,
    ):
        if not isinstance(engine, BaseEngine):
            raise TypeError(f"engine must be a BaseEngine, not {type(engine).__name__}.")
        if not isinstance(instruction, str) or not instruction:
            raise ValueError(f"instruction must be a non-empty string, not {instruction!r}.")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive integer, not {concurrency!r}.")
        self.engine = engine
        self.instruction = instruction
        self.concurrency = concurrency
        self._yes, self._no = (_one_token(engine.tokenizer, word) for word in ("yes", "no"))

    def messages(self, query: str, document: str) -> list[dict[str, str]]:
        """The conversation that asks about one document."""
        user = f"<Instruct>: {self.instruction}\n<Query>: {query}\n<Document>: {document}"
        return [{"role": "system", "content": JUDGE_PROMPT}, {"role": "user", "content": user}]

    def score(self, query: str, documents: Sequence[str]) -> RerankScores:
        """Score each document against the query, blocking the calling thread only."""
        from mlx_integrations.runtime.sync import run_sync

        return run_sync(self.ascore(query, documents))

    async def ascore(self, query: str, documents: Sequence[str]) -> RerankScores:
        """Score each document against the query without blocking the event loop.

        Returns:
            One probability of "yes" per document, in order, and the prompt tokens read.

        Raises:
            TypeError: A query or document that is not a string.
        """
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, not {type(query).__name__}.")
        if isinstance(documents, str) or not isinstance(documents, Sequence):
            raise TypeError(
                f"documents must be a list of strings, not {type(documents).__name__}; "
                "wrap a single document in a list."
            )
        for i, doc in enumerate(documents):
            if not isinstance(doc, str):
                raise TypeError(f"documents[{i}] is a {type(doc).__name__}, not a str.")
        gate = asyncio.Semaphore(self.concurrency)

        async def one(document: str) -> tuple[float, int]:
            async with gate:
                return await self._judge(query, document)

        results = await asyncio.gather(*(one(d) for d in documents))
        return RerankScores([s for s, _ in results], sum(n for _, n in results))

    async def _judge(self, query: str, document: str) -> tuple[float, int]:
        seen: list[tuple[float, float]] = []

        def read_logits(tokens: Any, logits: Any) -> Any:
            # Runs on the engine's owner thread, where the logits live.
            if not seen:
                row = logits.reshape(-1, logits.shape[-1])[0]
                seen.append((float(row[self._yes].item()), float(row[self._no].item())))
            return logits

        output = await self.engine.chat(
            self.messages(query, document),
            max_tokens=1,
            temperature=0.0,
            logits_processors=[read_logits],
            chat_template_kwargs={"enable_thinking": False},
        )
        if not seen:
            raise RuntimeError(
                f"{type(self.engine).__name__} did not run the logits processor; an LLM "
                "reranker needs an engine that honours logits_processors."
            )
        yes, no = seen[0]
        # exp(yes) / (exp(yes) + exp(no)), written to stay finite.
        return 1.0 / (1.0 + math.exp(no - yes)), output.prompt_tokens


def _one_token(tokenizer: Any, word: str) -> int:
    ids = tokenizer.encode(word, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(
            f"{word!r} is {len(ids)} tokens for this tokenizer ({ids}); an LLM reranker "
            "reads the logits of 'yes' and 'no' as single tokens (Qwen3-Reranker's do)."
        )
    return int(ids[0])
