"""lm-evaluation-harness against ``mlxi serve``: tasks defined here (YAML and JSONL in
``data/lm_eval``, no dataset from the Hub), run through the harness's
``local-completions`` model on ``/v1/completions``: a generate_until task (the text
generated) and a multiple_choice one (each choice scored by its tokens'
log-probabilities: token-id prompts, ``echo`` with ``logprobs``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlx_integrations.serve.config import ModelConfig, ServeConfig
from mlx_integrations.serve.server import BackgroundServer

TASKS = Path(__file__).parent / "data" / "lm_eval"
TASK = "mlxi_capitals"
CHOICE_TASK = "mlxi_capitals_choice"
DOCUMENTS = len((TASKS / "capitals.jsonl").read_text().splitlines())


@pytest.fixture(scope="module")
def lm_eval() -> Any:
    return pytest.importorskip(
        "lm_eval",
        reason="lm-evaluation-harness is not installed (pip install lm-eval; the dev extra has it)",
    )


def evaluate(
    lm_eval: Any,
    url: str,
    model: str,
    monkeypatch: pytest.MonkeyPatch,
    task: str = TASK,
    tokenizer: Path | None = None,
) -> Any:
    """A task's results through ``local-completions`` (one prompt a request): text
    prompts, or with ``tokenizer`` (the model's folder) token-id prompts, which the
    loglikelihood tasks need."""
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import make_table

    monkeypatch.chdir(TASKS)  # the task's data_files are beside it
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if tokenizer is None:
        tokens = "tokenizer_backend=None,tokenized_requests=False"
    else:
        tokens = f"tokenizer_backend=huggingface,tokenizer={tokenizer},tokenized_requests=True"
    args = f"model={model},base_url={url}/v1/completions,{tokens},num_concurrent=1,max_retries=1"
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=args,
        tasks=[task],
        task_manager=TaskManager(include_path=str(TASKS)),
        log_samples=True,
    )
    print(make_table(results))
    return results


@pytest.fixture(scope="module")
def tiny_server(tiny_llama: Path) -> Iterator[BackgroundServer]:
    config = ServeConfig(models=[ModelConfig("tiny", source=str(tiny_llama), preload=True)])
    background = BackgroundServer(config)
    background.start()
    yield background
    background.stop()


def test_a_generate_until_task_runs_against_the_server(
    lm_eval: Any, tiny_server: BackgroundServer, monkeypatch: pytest.MonkeyPatch
):
    results = evaluate(lm_eval, tiny_server.url, "tiny", monkeypatch)
    score = results["results"][TASK]["exact_match,first-word"]
    assert 0.0 <= score <= 1.0  # a random model: the score is whatever it is
    samples = results["samples"][TASK]
    assert len(samples) == DOCUMENTS
    assert all(isinstance(s["resps"][0][0], str) for s in samples)
    # Every request was answered by the server (one completion a document).
    figures = tiny_server.state.metrics.render(tiny_server.state.registry.served())
    assert 'mlxi_requests_total{endpoint="/v1/completions",status="200"}' in figures


@pytest.mark.smollm
def test_smollm2_knows_its_capitals(
    lm_eval: Any, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """SmolLM2-135M answers 7 of the 8 greedily (Canada's it gets wrong): the
    completions it gets through the harness are the model's."""
    config = ServeConfig(models=[ModelConfig("smol", source=str(smollm2_path), preload=True)])
    with BackgroundServer(config) as url:
        results = evaluate(lm_eval, url, "smol", monkeypatch)
    assert results["results"][TASK]["exact_match,first-word"] >= 0.75


def continuation_logprob(path: Path, context: str, continuation: str) -> float:
    """mlx-lm's log-probability of ``continuation`` after ``context`` (one forward
    pass), tokenized as the harness does: the context alone, then the whole."""
    import mlx.core as mx
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(path))
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    start = len(tokenizer.encode(context, add_special_tokens=False))
    logits = model(mx.array(whole)[None])[0].astype(mx.float32)
    rows = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return sum(rows[i - 1, whole[i]].item() for i in range(start, len(whole)))


def test_a_multiple_choice_task_is_scored_by_the_server(
    lm_eval: Any, tiny_server: BackgroundServer, tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
):
    results = evaluate(lm_eval, tiny_server.url, "tiny", monkeypatch, CHOICE_TASK, tiny_llama)
    assert 0.0 <= results["results"][CHOICE_TASK]["acc,none"] <= 1.0
    samples = results["samples"][CHOICE_TASK]
    assert len(samples) == DOCUMENTS
    # Each choice's score is mlx-lm's log-probability of its tokens after the question.
    first = samples[0]
    assert len(first["resps"]) == 4
    for (context, continuation), response in zip(first["arguments"], first["resps"], strict=True):
        score, _greedy = response[0]
        expected = continuation_logprob(tiny_llama, context, continuation)
        assert score == pytest.approx(expected, abs=1e-3)


@pytest.mark.smollm
def test_smollm2_picks_the_capitals(
    lm_eval: Any, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Scored by its log-probabilities, SmolLM2-135M picks the capital among four
    cities in most of the eight questions."""
    config = ServeConfig(models=[ModelConfig("smol", source=str(smollm2_path), preload=True)])
    with BackgroundServer(config) as url:
        results = evaluate(lm_eval, url, "smol", monkeypatch, CHOICE_TASK, smollm2_path)
    assert results["results"][CHOICE_TASK]["acc,none"] >= 0.75
