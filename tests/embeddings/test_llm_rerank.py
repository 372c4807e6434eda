"""LLM rerankers (the Qwen3-Reranker recipe) through the chat engines, against the recipe
computed by hand on the same model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import mlx_integrations  # noqa: F401  (BLAS preload before mlx.core)
from tests.support.tiny_models import build_tiny_model

# Qwen3's template as far as the recipe uses it: thinking off opens the assistant turn
# with an empty <think> block.
QWEN3_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}"
)
# Qwen3-Reranker's prompt, as its model card builds it.
PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the "
    'Query and the Instruct provided. Note that the answer can only be "yes" or "no".'
    "<|im_end|>\n<|im_start|>user\n"
)
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
QUERY = "What is the capital of France?"
DOCUMENTS = ["The capital of France is Paris.", "Hello! How can I help you today?", "Rome."]


@pytest.fixture(scope="module")
def reranker_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "tiny-qwen3-reranker"
    build_tiny_model(
        folder,
        arch="qwen2",
        chat_template=QWEN3_TEMPLATE,
        special_tokens=("yes", "no"),
        tie_word_embeddings=False,
    )
    # As a converted checkpoint says it (Qwen3-Reranker: Qwen3ForCausalLM).
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["Qwen2ForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def recipe_scores(folder: Path) -> list[float]:
    """The recipe by hand: one forward pass per document, softmax over (no, yes)."""
    import mlx.core as mx
    from mlx_lm import load

    model, tokenizer = load(str(folder))
    yes, no = (tokenizer.encode(w, add_special_tokens=False)[0] for w in ("yes", "no"))
    out = []
    for doc in DOCUMENTS:
        text = f"{PREFIX}<Instruct>: {INSTRUCTION}\n<Query>: {QUERY}\n<Document>: {doc}{SUFFIX}"
        ids = mx.array([tokenizer.encode(text, add_special_tokens=False)])
        logits = model(ids)[0, -1].astype(mx.float32)
        pair = mx.softmax(mx.stack([logits[no], logits[yes]]))
        out.append(float(pair[1].item()))
    return out


@pytest.mark.parametrize("engine_type", ["simple", "batched"])
def test_scores_equal_the_recipe(reranker_model: Path, engine_type: str) -> None:
    from mlx_integrations.embeddings.llm_rerank import LLMReranker
    from mlx_integrations.engine.pool import engine_class

    engine: Any = engine_class(engine_type)(reranker_model)  # type: ignore[call-arg]
    try:
        result = LLMReranker(engine).score(QUERY, DOCUMENTS)
    finally:
        from mlx_integrations.runtime.sync import run_sync

        run_sync(engine.stop())
    assert result.scores == pytest.approx(recipe_scores(reranker_model), abs=1e-5)
    assert all(0 < s < 1 for s in result.scores) and result.tokens > 3 * 40


def test_adapters_find_an_llm_reranker_by_name(reranker_model: Path) -> None:
    from langchain_core.documents import Document

    from mlx_integrations.embeddings.rerank import reranker_kind
    from mlx_integrations.langchain import MLXRerank

    assert reranker_kind(reranker_model) == "llm"
    reranker = MLXRerank(model=str(reranker_model), top_n=2)
    found = reranker.compress_documents([Document(page_content=d) for d in DOCUMENTS], QUERY)
    expected = recipe_scores(reranker_model)
    best = sorted(range(3), key=lambda i: -expected[i])[:2]
    assert [d.page_content for d in found] == [DOCUMENTS[i] for i in best]
    assert found[0].metadata["relevance_score"] == pytest.approx(expected[best[0]], abs=1e-5)


def test_a_chat_model_needs_single_yes_no_tokens(tiny_qwen2: Path) -> None:
    """Any chat model whose tokenizer has "yes" and "no" as single tokens may rerank."""
    from mlx_integrations.llama_index import MLXRerank

    with pytest.raises(ValueError, match="pass kind='llm'"):
        MLXRerank(str(tiny_qwen2))
    with pytest.raises(ValueError, match=r"'yes' is [0-9] tokens"):
        MLXRerank(str(tiny_qwen2), kind="llm")
