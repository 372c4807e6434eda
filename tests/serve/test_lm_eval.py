"""lm-evaluation-harness against ``mlxi serve``: a generate_until task defined here
(``data/lm_eval/capitals.yaml`` and its JSONL beside it, no dataset from the Hub), run
through the harness's ``local-completions`` model on ``/v1/completions``.

Its loglikelihood tasks need the prompt's log-probabilities (``echo`` with
``logprobs``), which the engines do not compute: the server refuses them with a 400,
tested in test_openai_logprobs.py.
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
DOCUMENTS = len((TASKS / "capitals.jsonl").read_text().splitlines())


@pytest.fixture(scope="module")
def lm_eval() -> Any:
    return pytest.importorskip(
        "lm_eval",
        reason="lm-evaluation-harness is not installed (pip install lm-eval; the dev extra has it)",
    )


def evaluate(lm_eval: Any, url: str, model: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The task's results through ``local-completions`` (one prompt a request)."""
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import make_table

    monkeypatch.chdir(TASKS)  # the task's data_files are beside it
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    args = (
        f"model={model},base_url={url}/v1/completions,tokenizer_backend=None,"
        "tokenized_requests=False,num_concurrent=1,max_retries=1"
    )
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=args,
        tasks=[TASK],
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
