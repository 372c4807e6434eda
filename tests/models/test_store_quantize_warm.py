"""Quantize into the store and generate; warm caches that engines pick up at start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlx_integrations.models import (
    ModelStore,
    import_model,
    load_warm_caches,
    quantize_model,
    show_model,
    warm_model,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "mlxi")


@pytest.mark.parametrize(
    ("bits", "group_size", "mode", "recipe"),
    [
        (4, 32, "affine", None),
        (8, 64, "affine", None),
        (4, None, "mxfp4", None),
        (3, 32, "affine", "mixed_3_6"),
    ],
)
def test_quantize_then_load_and_generate(store, tiny_llama, bits, group_size, mode, recipe):
    from mlx_lm import generate, load

    import_model(tiny_llama, "tiny", store=store)
    model = quantize_model(
        "tiny", bits=bits, group_size=group_size, mode=mode, recipe=recipe, store=store
    )
    config = json.loads((model.path / "config.json").read_text())
    assert config["quantization"]["mode"] == mode
    assert model.manifest.quantization is not None
    assert model.manifest.quantization.bits == bits
    assert model.manifest.source.kind == "quantize" and model.manifest.source.base == "tiny"
    assert store.verify(model.name).ok
    assert (
        show_model(model.name, store=store).parameters == show_model("tiny", store=store).parameters
    )
    loaded, tokenizer = load(str(model.path))
    text = generate(loaded, tokenizer, "The capital of France", max_tokens=6)
    assert isinstance(text, str) and len(text) > 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bits": 7}, "bits=7"),
        ({"bits": 4, "mode": "nvfp4", "group_size": 64}, "group_size=64"),
        ({"bits": 4, "mode": "mxfp4", "recipe": "mixed_3_6"}, "affine"),
        ({"bits": 4, "recipe": "mixed_9_9"}, "recipe"),
        ({"bits": 4, "dtype": "int8"}, "dtype"),
    ],
)
def test_bad_quantization_settings_fail_before_any_work(store, tiny_llama, kwargs, message):
    with pytest.raises(ValueError, match=message):
        quantize_model(tiny_llama, "q", store=store, **kwargs)
    assert not store.models_dir.exists() or not any(store.models_dir.iterdir())


async def test_warm_cache_is_a_prefix_of_real_requests_and_skips_prefill(store, tiny_llama):
    from mlx_integrations.engine.simple import SimpleEngine

    model = import_model(tiny_llama, "tiny", store=store)
    system = "You are a weather assistant. Answer in one short sentence."
    result = warm_model("tiny", "agent", system=system, tools=TOOLS, store=store)
    assert Path(result.path) == model.path / "warm" / "agent.safetensors"
    assert result.source == "system+tools"
    [(tokens, cache)] = load_warm_caches(model.path)
    assert len(tokens) == result.tokens > 20
    assert cache[0].offset == len(tokens)
    assert show_model("tiny", store=store).warm_caches == ("agent",)

    engine = SimpleEngine(model.path)
    await engine.start()
    try:
        for question in ("What is the weather in Paris?", "Und in Berlin?"):
            messages = [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ]
            prompt = engine.render_prompt(messages, tools=TOOLS)
            ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
            assert ids[: len(tokens)] == tokens and len(ids) > len(tokens)
        async for _ in engine.stream_chat(messages, tools=TOOLS, max_tokens=3, temperature=0.0):
            pass
        stats = engine.get_cache_stats()
        assert stats["hits"] == 1 and stats["tokens_saved"] == len(tokens)
    finally:
        await engine.stop()


def test_warm_caches_of_other_weights_are_ignored(store, tiny_llama, tiny_qwen2):
    model = import_model(tiny_llama, "tiny", store=store)
    warm_model("tiny", system="Be brief.", store=store)
    assert len(load_warm_caches(model.path)) == 1
    # Same name, other weights: the stored cache no longer matches the manifest.
    saved = (model.path / "warm" / "default.safetensors").read_bytes()
    import_model(tiny_qwen2, "tiny", store=store, overwrite=True)
    (model.path / "warm").mkdir()
    (model.path / "warm" / "default.safetensors").write_bytes(saved)
    assert load_warm_caches(model.path) == []


def test_raw_text_prefix(store, tiny_llama):
    import_model(tiny_llama, "tiny", store=store)
    result = warm_model(
        "tiny", "doc", text="The quick brown fox jumps over the lazy dog.", store=store
    )
    assert result.source == "text" and result.tokens > 3
