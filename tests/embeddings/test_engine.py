"""The MLX embedding engine against sentence-transformers' own output for MiniLM."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlx_integrations.embeddings.engine import (
    EmbeddingEngine,
    EmbeddingTruncationWarning,
    SentenceEmbeddingConfig,
    clear_embedding_engines,
    get_embedding_engine,
    plan_batches,
)
from tests.embeddings.conftest import ModelVariant

# The faithfulness bar: cosine distance to the sentence-transformers vectors.
MAX_COSINE_DISTANCE = 1e-4


def cosine_distances(ours: Any, reference: Any) -> np.ndarray:
    a = np.asarray(ours, dtype=np.float64)
    b = np.asarray(reference, dtype=np.float64)
    cos = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return 1.0 - cos


@pytest.fixture(scope="module")
def engine(minilm_path: Path) -> EmbeddingEngine:
    return get_embedding_engine(minilm_path)


@pytest.fixture
def own_engine() -> Iterator[list[EmbeddingEngine]]:
    """Engines a test builds outside the pool; closed when the test ends."""
    engines: list[EmbeddingEngine] = []
    yield engines
    for e in engines:
        e.close()


def embed_quietly(engine: EmbeddingEngine, texts: list[str], **kwargs: Any) -> list[list[float]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EmbeddingTruncationWarning)
        return engine.embed(texts, **kwargs)


def test_model_info_read_from_sentence_transformers_config(engine: EmbeddingEngine) -> None:
    info = engine.info
    assert info.dimension == 384
    assert info.max_length == 256  # sentence_bert_config.json, not the 512 positions
    assert info.pooling == "mean"
    assert info.normalize is True


@pytest.mark.parametrize("batch_size", [1, 7, 32])
def test_matches_sentence_transformers(
    engine: EmbeddingEngine, minilm_reference: dict[str, Any], batch_size: int
) -> None:
    sentences = minilm_reference["sentences"]
    ours = embed_quietly(engine, sentences, batch_size=batch_size)
    assert len(ours) == len(sentences)
    dist = cosine_distances(ours, minilm_reference["mean_normalized"])
    assert dist.max() < MAX_COSINE_DISTANCE, dict(zip(sentences, dist.round(8), strict=True))
    norms = np.linalg.norm(np.asarray(ours), axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=1e-5)


def test_cls_and_max_pooling_overrides_match_sentence_transformers(
    engine: EmbeddingEngine, minilm_reference: dict[str, Any]
) -> None:
    sentences = minilm_reference["sentences"]
    cls = embed_quietly(engine, sentences, pooling="cls", normalize=True, batch_size=8)
    assert cosine_distances(cls, minilm_reference["cls_normalized"]).max() < MAX_COSINE_DISTANCE

    subset = [sentences[i] for i in minilm_reference["max_pool_subset"]]
    maxed = embed_quietly(engine, subset, pooling="max", normalize=False, batch_size=8)
    # Unnormalised vectors: compare values too, not only directions.
    np.testing.assert_allclose(maxed, minilm_reference["max_unnormalized"], atol=1e-4)


def test_padding_does_not_change_a_vector(engine: EmbeddingEngine) -> None:
    short = "A short sentence."
    alone = engine.embed([short], batch_size=1)[0]
    padded = engine.embed([short, "a much longer sentence " * 12], batch_size=2)[0]
    np.testing.assert_allclose(alone, padded, atol=1e-5)


def test_order_of_results_follows_order_of_inputs(engine: EmbeddingEngine) -> None:
    texts = ["one", "a slightly longer second text", "3", "the fourth and by far longest text"]
    forward = engine.embed(texts, batch_size=2)
    backward = engine.embed(texts[::-1], batch_size=3)
    np.testing.assert_allclose(forward, backward[::-1], atol=1e-5)


@pytest.mark.parametrize("batch_size", [1, 3, 32])
def test_batch_plan_covers_every_input_once(batch_size: int) -> None:
    lengths = [12, 256, 9, 30, 30, 31, 8, 200, 14, 15, 2, 64]
    batches = plan_batches(lengths, batch_size)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(1 <= len(b) <= batch_size for b in batches)


def test_batch_plan_keeps_an_outlier_from_padding_a_whole_batch() -> None:
    # One 256-token text among short ones gets its own batch ...
    assert plan_batches([10, 256, 12, 11], 32) == [[1], [2, 3, 0]]
    # ... while texts of similar length stay together, longest first.
    assert plan_batches([20, 24, 30, 17], 32) == [[2, 1, 0, 3]]


def test_empty_input_list_gives_empty_output(engine: EmbeddingEngine) -> None:
    assert engine.embed([]) == []


def test_long_input_is_truncated_with_a_warning(
    engine: EmbeddingEngine, minilm_reference: dict[str, Any]
) -> None:
    long_index = max(
        range(len(minilm_reference["sentences"])),
        key=lambda i: minilm_reference["token_counts"][i],
    )
    assert minilm_reference["token_counts"][long_index] > 256
    long_text = minilm_reference["sentences"][long_index]
    with pytest.warns(EmbeddingTruncationWarning, match=r"1 of 2 texts .* 256 tokens"):
        vectors = engine.embed([long_text, "short"])
    # sentence-transformers truncates the same way, so the reference still matches.
    ref = minilm_reference["mean_normalized"][long_index]
    assert cosine_distances([vectors[0]], [ref])[0] < MAX_COSINE_DISTANCE


def test_short_inputs_raise_no_warning(engine: EmbeddingEngine) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine.embed(["short", "also short"])


def test_lower_max_length_truncates(engine: EmbeddingEngine) -> None:
    text = "one two three four five six seven eight nine ten"
    with pytest.warns(EmbeddingTruncationWarning, match="longer than 6 tokens"):
        cut = engine.embed([text], max_length=6)[0]
    # [CLS] + 4 word pieces + [SEP]: the same as embedding the first four words.
    np.testing.assert_allclose(cut, engine.embed(["one two three four"])[0], atol=1e-5)


@pytest.mark.parametrize(
    ("texts", "kwargs", "error", "match"),
    [
        ("just a string", {}, TypeError, "wrap a single text in a list"),
        (["ok", 3], {}, TypeError, r"texts\[1\] is a int"),
        (["ok"], {"batch_size": 0}, ValueError, "batch_size"),
        (["ok"], {"pooling": "sum"}, ValueError, "pooling must be one of"),
        (["ok"], {"max_length": 1024}, ValueError, "exceeds the limit .* 256"),
        (["ok"], {"prompt": None}, TypeError, "prompt must be a str"),
    ],
)
def test_bad_input_is_rejected_before_mlx(
    engine: EmbeddingEngine, texts: Any, kwargs: dict[str, Any], error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        engine.embed(texts, **kwargs)


def test_prompt_is_prepended(engine: EmbeddingEngine) -> None:
    with_prompt = engine.embed(["the weather today"], prompt="query: ")[0]
    spelled_out = engine.embed(["query: the weather today"])[0]
    plain = engine.embed(["the weather today"])[0]
    np.testing.assert_allclose(with_prompt, spelled_out, atol=1e-6)
    assert cosine_distances([with_prompt], [plain])[0] > 1e-3


def test_cls_pooling_config_is_followed(
    model_variant: ModelVariant,
    own_engine: list[EmbeddingEngine],
    minilm_reference: dict[str, Any],
) -> None:
    # A bge-style head: CLS pooling then normalisation, read from 1_Pooling/config.json.
    folder = model_variant(
        {"1_Pooling/config.json": {"word_embedding_dimension": 384, "pooling_mode": "cls"}}
    )
    engine = EmbeddingEngine(folder)
    own_engine.append(engine)
    assert engine.info.pooling == "cls"
    ours = embed_quietly(engine, minilm_reference["sentences"])
    assert cosine_distances(ours, minilm_reference["cls_normalized"]).max() < MAX_COSINE_DISTANCE


def test_plain_encoder_folder_gets_mean_pooling_without_normalisation(
    model_variant: ModelVariant,
    own_engine: list[EmbeddingEngine],
    minilm_reference: dict[str, Any],
) -> None:
    folder = model_variant({"modules.json": None, "sentence_bert_config.json": None})
    engine = EmbeddingEngine(folder)
    own_engine.append(engine)
    assert (engine.info.pooling, engine.info.normalize) == ("mean", False)
    assert engine.info.max_length == 512  # tokenizer and position limit
    sentences = minilm_reference["sentences"][:5]
    ours = engine.embed(sentences)
    assert not np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-3)
    # The direction is still that of the reference's mean-pooled vectors.
    ref = minilm_reference["mean_normalized"][:5]
    assert cosine_distances(ours, ref).max() < MAX_COSINE_DISTANCE


def test_prompts_from_config_are_exposed(
    model_variant: ModelVariant, own_engine: list[EmbeddingEngine]
) -> None:
    folder = model_variant(
        {
            "config_sentence_transformers.json": {
                "prompts": {"query": "query: ", "passage": "passage: "},
                "default_prompt_name": None,
            }
        }
    )
    engine = EmbeddingEngine(folder)
    own_engine.append(engine)
    assert engine.info.prompt_for("query") == "query: "
    assert engine.info.prompt_for("document") == "passage: "


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"1_Pooling/config.json": None}, "1_Pooling.config.json is missing"),
        (
            {"1_Pooling/config.json": {"pooling_mode_weightedmean_tokens": True}},
            "weightedmean.* not supported",
        ),
        (
            {
                "1_Pooling/config.json": {
                    "pooling_mode_cls_token": True,
                    "pooling_mode_mean_tokens": True,
                }
            },
            "not supported",
        ),
        (
            {
                "modules.json": [
                    {"idx": 0, "name": "0", "path": "", "type": "x.Transformer"},
                    {"idx": 1, "name": "1", "path": "2_Dense", "type": "x.models.Dense"},
                ]
            },
            "Dense.* does not implement",
        ),
        ({"config.json": {"model_type": "t5", "hidden_size": 8}}, "'t5' is not supported"),
    ],
)
def test_unsupported_models_fail_at_load_with_a_clear_message(
    model_variant: ModelVariant, changes: dict[str, Any], match: str
) -> None:
    folder = model_variant(changes)
    with pytest.raises(ValueError, match=match):
        EmbeddingEngine(folder)


def test_folder_without_weights_is_rejected(
    model_variant: ModelVariant,
) -> None:
    folder = model_variant({})
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"No \*\.safetensors weights"):
        EmbeddingEngine(folder)


def test_config_reader_handles_old_subfolder_layout(tmp_path: Path) -> None:
    # sentence-transformers 0.x kept the transformer in 0_BERT/ with its own limit.
    (tmp_path / "0_BERT").mkdir()
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "modules.json").write_text(
        json.dumps(
            [
                {"path": "0_BERT", "type": "sentence_transformers.models.BERT"},
                {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            ]
        )
    )
    (tmp_path / "0_BERT" / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 128, "do_lower_case": True})
    )
    (tmp_path / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    )
    config = SentenceEmbeddingConfig.from_folder(tmp_path)
    assert config.transformer_dir == tmp_path / "0_BERT"
    assert (config.pooling, config.normalize) == ("cls", False)
    assert (config.max_seq_length, config.do_lower_case) == (128, True)


def test_pool_shares_one_engine_per_folder(minilm_path: Path, tmp_path: Path) -> None:
    first = get_embedding_engine(minilm_path)
    link = tmp_path / "minilm-link"
    link.symlink_to(minilm_path, target_is_directory=True)
    assert get_embedding_engine(str(minilm_path) + "/") is first
    assert get_embedding_engine(link) is first


def test_unknown_model_name_says_how_to_get_it(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("MLXI_HOME", str(tmp_path / "store"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="mlxi pull sentence-transformers/x-y"):
        get_embedding_engine("sentence-transformers/x-y")
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        get_embedding_engine(tmp_path / "missing")


def test_concurrent_callers_from_threads_get_correct_results(engine: EmbeddingEngine) -> None:
    texts = [f"text number {i} about topic {i % 3}" for i in range(12)]
    expected = engine.embed(texts)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda t: engine.embed([t])[0], texts))
    np.testing.assert_allclose(results, expected, atol=1e-5)
    # However many callers, the engine runs everything on its one owner thread.
    owners = engine._executor._threads
    assert len(owners) == 1
    assert threading.current_thread() not in owners


async def test_async_embedding_does_not_block_the_event_loop(engine: EmbeddingEngine) -> None:
    texts = ["a sentence to embed, of moderate length"] * 64
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    task = asyncio.create_task(ticker())
    start = time.perf_counter()
    vectors = await engine.aembed(texts, batch_size=8)
    elapsed = time.perf_counter() - start
    done.set()
    await task
    assert len(vectors) == 64
    # The loop kept running while the owner thread worked.
    assert ticks >= max(2, int(elapsed / 0.005 * 0.2))


async def test_async_results_equal_sync_results(engine: EmbeddingEngine) -> None:
    texts = ["first", "second text", "third text is longest"]
    a, b = await asyncio.gather(engine.aembed(texts), engine.aembed(texts[::-1]))
    np.testing.assert_allclose(a, b[::-1], atol=1e-5)
    np.testing.assert_allclose(a, engine.embed(texts), atol=1e-5)


def test_closed_engine_refuses_work_and_pool_reloads(minilm_path: Path) -> None:
    engine = get_embedding_engine(minilm_path)
    assert clear_embedding_engines() >= 1
    assert engine.closed
    with pytest.raises(RuntimeError, match="closed"):
        engine.embed(["x"])
    fresh = get_embedding_engine(minilm_path)
    assert fresh is not engine and not fresh.closed
    assert len(fresh.embed(["x"])[0]) == 384


EXIT_SCRIPT = """
import mlx_integrations
from mlx_integrations.embeddings.engine import get_embedding_engine
engine = get_embedding_engine({path!r})
for _ in range(3):
    engine.embed(["some text to embed so that MLX does real work"] * 32, batch_size=16)
print("done")
"""


def test_process_exits_cleanly_after_embedding(minilm_path: Path) -> None:
    # MLX aborts at exit when a thread that used it ends with its streams alive; the
    # failure was intermittent, so run a few processes.
    script = EXIT_SCRIPT.format(path=str(minilm_path))
    for _ in range(3):
        proc = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip() == "done"


def test_imported_into_the_store_keeps_its_pooling_config(minilm_path, tmp_path):
    """`mlxi import` of a sentence-transformers folder keeps 1_Pooling/ and still embeds."""
    from mlx_integrations.embeddings.engine import EmbeddingEngine
    from mlx_integrations.models import ModelStore, import_model

    store = ModelStore(tmp_path / "store")
    stored = import_model(minilm_path, "minilm", store=store)
    assert (stored.path / "1_Pooling" / "config.json").is_file()
    engine = EmbeddingEngine(stored.path)
    try:
        assert len(engine.embed(["hello"])[0]) == 384
    finally:
        engine.close()
