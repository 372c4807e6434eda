"""ChatMLX and MLXLLM report speculative decoding's acceptance figures when it ran."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_integrations.engine import pool
from mlx_integrations.langchain import ChatMLX
from mlx_integrations.llama_index import MLXLLM
from tests.support.tiny_models import build_tiny_model

# Which steps draft must not depend on the machine's speed (see conftest).
pytestmark = pytest.mark.usefixtures("lookup_rounds")

FIGURES = {"draft_tokens", "accepted_draft_tokens", "draft_acceptance_rate"}
PROMPT = "The quick brown fox jumps over the lazy dog. Repeat it: The quick"


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory):
    path = build_tiny_model(tmp_path_factory.mktemp("target"), tie_word_embeddings=False)
    yield path
    pool.unload_idle()


def _check(figures: dict, plain: dict) -> None:
    assert FIGURES <= figures.keys() and not FIGURES & plain.keys()
    assert 0 < figures["accepted_draft_tokens"] <= figures["draft_tokens"]
    rate = figures["accepted_draft_tokens"] / figures["draft_tokens"]
    assert figures["draft_acceptance_rate"] == pytest.approx(rate, abs=1e-4)


def test_chat_mlx_response_metadata(target: Path):
    fields = {"model": str(target), "temperature": 0, "max_tokens": 32}
    fast = ChatMLX(**fields, engine_options={"prompt_lookup": 4})
    plain = ChatMLX(**fields)
    reply, reference = fast.invoke(PROMPT), plain.invoke(PROMPT)
    assert reply.content == reference.content
    _check(reply.response_metadata, reference.response_metadata)
    streamed = None
    for chunk in fast.stream(PROMPT):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed is not None
    _check(streamed.response_metadata, reference.response_metadata)
    assert fast.get_stats()["speculative"]["mode"] == "prompt_lookup"


def test_mlxllm_raw(target: Path):
    from llama_index.core.llms import ChatMessage

    fields = {"model": str(target), "temperature": 0, "max_tokens": 32}
    fast = MLXLLM(**fields, engine_options={"draft_model": str(target)})
    plain = MLXLLM(**fields)
    messages = [ChatMessage(role="user", content=PROMPT)]
    reply, reference = fast.chat(messages), plain.chat(messages)
    assert reply.message.content == reference.message.content
    _check(reply.raw, reference.raw)
    assert reply.raw["accepted_draft_tokens"] == reply.raw["draft_tokens"]
    _check(fast.complete(PROMPT).raw, plain.complete(PROMPT).raw)
