"""Both engines on tiny models: bad settings refused at the boundary, failures inside a
decode step that leave the engine serving, and the context window as a hard limit."""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mlx_integrations.engine import BatchedEngine, SimpleEngine
from tests.support.tiny_models import build_tiny_model

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
ROOT = Path(__file__).resolve().parents[2]
ENGINES = {"simple": SimpleEngine, "batched": BatchedEngine}


@pytest.fixture(scope="module", params=sorted(ENGINES))
def engine(request: pytest.FixtureRequest, tiny_llama: Path):
    eng = ENGINES[request.param](tiny_llama)
    yield eng
    asyncio.run(eng.stop())


def vocab(engine) -> int:
    return engine.config["vocab_size"]


def failed(engine) -> int:
    return engine.get_stats()["num_requests_failed"]


def raising_on_call(n: int, exc: Exception):
    """A logits processor that passes logits through, and raises on its n-th call."""
    calls = [0]

    def processor(tokens, logits):
        calls[0] += 1
        if calls[0] == n:
            raise exc
        return logits

    return processor


_COMPILED: list = []


def breaking_random_state_on_call(n: int):
    """A logits processor that, on its n-th call, fails inside an ``mx.compile`` that
    declares ``mx.random.state`` as an output, as mlx-lm's sampling filters do: the
    failure leaves a placeholder in MLX's global random state."""
    from functools import partial

    import mlx.core as mx

    calls = [0]

    @partial(mx.compile, inputs=mx.random.state, outputs=mx.random.state)
    def broken(x):
        raise ValueError("filter failed while traced")

    _COMPILED.append(broken)  # lives as long as the process, like mlx-lm's filters

    def processor(tokens, logits):
        calls[0] += 1
        if calls[0] != n:
            return logits
        return broken(logits)

    return processor


# ------------------------------------------------------------------ logit_bias

CRASH_SCRIPT = """
import ast, asyncio, sys
sys.path.insert(0, {root!r})
import mlx_integrations
from mlx_integrations.engine import BatchedEngine, SimpleEngine

MESSAGES = [{{"role": "user", "content": "Hi"}}]

async def main():
    for path, biases in ast.literal_eval(sys.argv[1]):
        for cls in (SimpleEngine, BatchedEngine):
            engine = cls(path)
            for bias in biases:
                try:
                    await engine.chat(MESSAGES, max_tokens=3, temperature=0, logit_bias=bias)
                except ValueError as exc:
                    print(cls.__name__, "refused:", exc)
                else:
                    print(cls.__name__, "accepted", bias)
            out = await engine.chat(MESSAGES, max_tokens=3, temperature=0)
            print(cls.__name__, "served", out.finished)
            await engine.stop()
    print("done")

asyncio.run(main())
"""


def test_logit_bias_outside_the_vocabulary_is_refused_not_a_crash(tiny_llama, padded_vocab_model):
    # Before the check, MLX indexed past the logits and the process died (SIGABRT):
    # run it in a child so a crash fails this test instead of killing pytest.
    n = json.loads((tiny_llama / "config.json").read_text())["vocab_size"]
    cases = [
        (str(tiny_llama), [{n: 5.0}, {n + 1000: 5.0}, {-1: 5.0}, {str(n): 1.0}, {0: 1.0, n: 1.0}]),
        # Logits wider than the tokenizer (520 here): the bound is the logits width.
        (str(padded_vocab_model), [{520: 1.0}]),
    ]
    script = CRASH_SCRIPT.format(root=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", script, repr(cases)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"child died ({proc.returncode}): {proc.stderr[-2000:]}"
    lines = proc.stdout.splitlines()
    refused = [line for line in lines if " refused: " in line]
    assert not [line for line in lines if " accepted " in line], proc.stdout
    assert len(refused) == 2 * 6, proc.stdout
    assert all("outside the model's vocabulary" in line for line in refused)
    assert sum(f"valid ids: 0 to {n - 1}" in line for line in refused) == 2 * 5
    assert sum("token id 520 " in line and "valid ids: 0 to 519" in line for line in refused) == 2
    assert lines.count("SimpleEngine served True") == lines.count("BatchedEngine served True") == 2
    assert lines[-1] == "done"


@pytest.mark.parametrize(
    ("bias", "exc", "match"),
    [
        ({"a": 1}, TypeError, r"logit_bias keys must be token ids .*got 'a'"),
        ({1.5: 1}, TypeError, r"logit_bias keys must be token ids .*got 1\.5"),
        ({None: 1}, TypeError, r"logit_bias keys must be token ids .*got None"),
        ({5: "x"}, TypeError, r"logit_bias\[5\] must be a number, got 'x'"),
        ({5: math.inf}, ValueError, r"logit_bias\[5\] must be a finite number, got inf"),
        ({5: -math.inf}, ValueError, r"logit_bias\[5\] must be a finite number, got -inf"),
        ({5: math.nan}, ValueError, r"logit_bias\[5\] must be a finite number, got nan"),
        ([5], TypeError, r"logit_bias must be a dict of token id to bias, got \[5\]"),
    ],
)
async def test_bad_logit_bias_says_what_is_wrong(engine, bias, exc, match):
    before = failed(engine)
    with pytest.raises(exc, match=match):
        await engine.chat(MESSAGES, max_tokens=2, logit_bias=bias)
    assert failed(engine) == before  # refused before any MLX work
    assert (await engine.chat(MESSAGES, max_tokens=2, temperature=0)).finished


async def test_logit_bias_takes_ids_as_integers_or_decimal_strings(engine):
    for token in (42, "42"):
        out = await engine.chat(MESSAGES, max_tokens=4, temperature=0, logit_bias={token: 100.0})
        assert out.tokens == [42] * 4


@pytest.fixture(scope="module")
def padded_vocab_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model whose logits (config vocab_size 520) are wider than its tokenizer."""
    import mlx.core as mx

    path = build_tiny_model(tmp_path_factory.mktemp("tiny-padded"))
    weights = mx.load(str(path / "model.safetensors"))
    embed = weights["model.embed_tokens.weight"]
    extra = mx.zeros((520 - embed.shape[0], embed.shape[1]), dtype=embed.dtype)
    weights["model.embed_tokens.weight"] = mx.concatenate([embed, extra])
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    config = json.loads((path / "config.json").read_text())
    config["vocab_size"] = 520
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("kind", sorted(ENGINES))
async def test_logit_bias_reaches_ids_past_the_tokenizer(padded_vocab_model, kind):
    engine = ENGINES[kind](padded_vocab_model)
    try:
        assert len(engine.tokenizer.get_vocab()) < 520
        # An id past the tokenizer but inside the logits is a real, biasable output.
        out = await engine.chat(MESSAGES, max_tokens=3, temperature=0, logit_bias={515: 100.0})
        assert out.tokens == [515] * 3
        # (ids past the logits are refused: see the crash test, run in a child process)
    finally:
        await engine.stop()


# ------------------------------------------------------- non-finite and ranges

FLOAT_OPTIONS = [
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
]


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("name", FLOAT_OPTIONS)
async def test_non_finite_numbers_are_refused(engine, name, value):
    before = failed(engine)
    with pytest.raises(ValueError, match=rf"{name} must be a finite number, got {value}"):
        await engine.chat(MESSAGES, max_tokens=2, **{name: value})
    with pytest.raises(ValueError, match=rf"{name} must be a finite number"):
        await engine.generate("Hello", max_tokens=2, **{name: value})
    assert failed(engine) == before


async def test_top_k_at_or_beyond_the_vocabulary_keeps_every_token(engine):
    # mlx-lm refuses such a top_k in the middle of generation; it means "no top-k".
    baseline = await engine.chat(MESSAGES, max_tokens=6, temperature=1.0, seed=7)
    for top_k in (vocab(engine), vocab(engine) + 100):
        out = await engine.chat(MESSAGES, max_tokens=6, temperature=1.0, seed=7, top_k=top_k)
        assert out.tokens == baseline.tokens
    assert (await engine.chat(MESSAGES, max_tokens=6, temperature=1.0)).finished
    with pytest.raises(ValueError, match="top_k must be >= 0"):
        await engine.chat(MESSAGES, max_tokens=2, top_k=-1)


# ------------------------------------------------ failures inside a decode step


async def test_failing_logits_processor_leaves_the_engine_serving(engine):
    greedy = await engine.chat(MESSAGES, max_tokens=8, temperature=0)
    before = failed(engine)
    with pytest.raises(RuntimeError, match="processor failed"):
        await engine.chat(
            MESSAGES,
            max_tokens=8,
            temperature=0,
            logits_processors=[raising_on_call(3, RuntimeError("processor failed"))],
        )
    assert failed(engine) == before + 1
    # The failed request's KV cache was dropped, not stored half-written: the same
    # prompt decodes the same tokens as before.
    again = await engine.chat(MESSAGES, max_tokens=8, temperature=0)
    assert again.tokens == greedy.tokens
    assert (await engine.chat(MESSAGES, max_tokens=8, temperature=1.0)).finished
    stats = engine.get_stats()
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0


async def test_failure_that_breaks_mlx_random_state_leaves_sampling_working(engine):
    # Without a reseed every later sampled request fails with "Attempting to eval an
    # array without a primitive".
    with pytest.raises(ValueError, match="filter failed while traced"):
        await engine.chat(
            MESSAGES,
            max_tokens=8,
            temperature=0,
            logits_processors=[breaking_random_state_on_call(3)],
        )
    for _ in range(2):
        out = await engine.chat(MESSAGES, max_tokens=6, temperature=1.0)
        assert out.finished and out.completion_tokens >= 1
    seeded = [
        (await engine.chat(MESSAGES, max_tokens=6, temperature=1.0, seed=3)).tokens
        for _ in range(2)
    ]
    assert seeded[0] == seeded[1]


async def test_a_failure_in_the_batch_spares_the_other_requests(tiny_llama):
    engine = BatchedEngine(tiny_llama)
    try:
        await engine.start()
        # Hold the owner thread so that both requests join the batch in the same step.
        gate = threading.Event()
        assert engine._executor is not None
        engine._executor.submit(gate.wait)
        neighbour = asyncio.ensure_future(
            engine.chat(MESSAGES, max_tokens=16, temperature=1.0, logit_bias={42: 30.0})
        )
        broken = asyncio.ensure_future(
            engine.chat(
                MESSAGES,
                max_tokens=16,
                temperature=0,
                logits_processors=[breaking_random_state_on_call(3)],
            )
        )
        while engine.get_stats()["num_waiting"] < 2:
            await asyncio.sleep(0.01)  # both requests queued behind the gate
        gate.set()
        results = await asyncio.gather(neighbour, broken, return_exceptions=True)
        assert isinstance(results[1], ValueError), results[1]
        assert not isinstance(results[0], BaseException), results[0]
        assert results[0].finish_reason == "length" and results[0].completion_tokens == 16
        assert engine.get_stats()["generator_resets"] == 0  # the batch was never dropped
        assert (await engine.chat(MESSAGES, max_tokens=4, temperature=1.0)).finished
    finally:
        await engine.stop()


# ------------------------------------------------------------ context window


@pytest.fixture(scope="module")
def short_window_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model with a 64-token context window."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-64"), max_position_embeddings=64)


@pytest.mark.parametrize("kind", sorted(ENGINES))
async def test_generation_stops_at_the_context_window(short_window_model, kind):
    engine = ENGINES[kind](short_window_model)
    try:
        # The bias keeps the model off EOS, so only a limit can end the reply.
        never_eos = {"logit_bias": {42: 100.0}, "temperature": 0}
        out = await engine.chat(MESSAGES, max_tokens=200, **never_eos)
        assert out.finish_reason == "length"
        assert out.prompt_tokens + out.completion_tokens == 64
        out = await engine.chat(MESSAGES, max_tokens=10**9, **never_eos)
        assert out.finish_reason == "length"
        assert out.prompt_tokens + out.completion_tokens == 64
        out = await engine.generate("Hello there", max_tokens=200, **never_eos)
        assert out.finish_reason == "length"
        assert out.prompt_tokens + out.completion_tokens == 64
        # A max_tokens inside the window is left alone.
        out = await engine.chat(MESSAGES, max_tokens=5, **never_eos)
        assert out.completion_tokens == 5
    finally:
        await engine.stop()


# ------------------------------------------------------- chat_template_kwargs


@pytest.mark.parametrize("value", ["x", ["enable_thinking"], {1: True}], ids=["str", "list", "key"])
async def test_chat_template_kwargs_must_be_a_dict(engine, tiny_llama, value):
    with pytest.raises(
        TypeError, match=rf"chat_template_kwargs must be a dict .*got {re.escape(repr(value))}"
    ):
        await engine.generate("Hello", max_tokens=2, chat_template_kwargs=value)
    with pytest.raises(TypeError, match=r"chat_template_kwargs must be a dict .*got"):
        type(engine)(tiny_llama, chat_template_kwargs=value)


async def test_chat_template_kwargs_must_be_a_dict_in_stream_chat(engine):
    before = failed(engine)
    with pytest.raises(TypeError, match=r"chat_template_kwargs must be a dict .*got 'x'"):
        await engine.chat(MESSAGES, max_tokens=2, chat_template_kwargs="x")
    assert failed(engine) == before


@pytest.mark.parametrize("kind", sorted(ENGINES))
@pytest.mark.parametrize(
    ("value", "exc"),
    [(math.inf, ValueError), (math.nan, ValueError), (-1, ValueError), ("big", TypeError)],
    ids=["inf", "nan", "negative", "str"],
)
def test_cache_memory_mb_must_be_a_finite_number(tiny_llama, kind, value, exc):
    with pytest.raises(exc, match=r"cache_memory_mb must be a .*number"):
        ENGINES[kind](tiny_llama, cache_memory_mb=value)
