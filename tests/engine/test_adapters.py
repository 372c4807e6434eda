"""LoRA adapters on the engines (``adapter_path``): mlx-lm's replies, bit for bit.

The adapter is made here, with mlx-lm's own LoRA layers on a tiny model and random
``lora_b`` values (zero in a fresh training run), and saved as ``mlx_lm.lora`` saves
its output; the reference is ``mlx_lm.load(path, adapter_path=...)`` with mlx-lm's
``generate_step``.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlx_integrations.engine import BatchedEngine, ModelTooLarge, SimpleEngine
from mlx_integrations.runtime import residency
from tests.support.tiny_adapter import build_lora_adapter
from tests.support.tiny_models import build_tiny_model

PROMPTS = ["What is the capital of France?", "Hello! How can I help you today?"]
N = 16


@pytest.fixture(scope="module")
def adapter(tiny_own_head: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_lora_adapter(tiny_own_head, tmp_path_factory.mktemp("adapter") / "lora")


def messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def reference(model: Path, adapter_path: Path | None, prompt: str, n: int = N) -> list[int]:
    """mlx-lm's greedy tokens for a chat prompt, with the adapter loaded by mlx-lm."""
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    loaded = mlx_lm.load(
        str(model), adapter_path=None if adapter_path is None else str(adapter_path)
    )
    net, tokenizer = loaded[0], loaded[1]
    ids = tokenizer.apply_chat_template(messages(prompt), add_generation_prompt=True)
    steps = generate_step(mx.array(ids), net, max_tokens=n, sampler=make_sampler(0.0))
    out = []
    for token, _ in steps:
        if int(token) in tokenizer.eos_token_ids:
            break
        out.append(int(token))
    return out


@pytest.fixture(scope="module")
def expected(tiny_own_head: Path, adapter: Path) -> dict[str, list[int]]:
    want = {p: reference(tiny_own_head, adapter, p) for p in PROMPTS}
    base = {p: reference(tiny_own_head, None, p) for p in PROMPTS}
    # The adapter really changes the replies, so equal tokens below mean it was applied.
    assert all(want[p] != base[p] for p in PROMPTS)
    return want


async def greedy(engine, prompt: str, n: int = N) -> list[int]:
    out = await engine.chat(messages(prompt), max_tokens=n, temperature=0.0)
    return out.tokens


@pytest.mark.parametrize("cls", [SimpleEngine, BatchedEngine])
async def test_an_adapter_gives_mlx_lms_greedy_tokens(tiny_own_head, adapter, expected, cls):
    engine = cls(tiny_own_head, adapter_path=adapter)
    try:
        assert engine.options.adapter_path == str(adapter)
        for prompt in PROMPTS:
            assert await greedy(engine, prompt) == expected[prompt]
    finally:
        await engine.stop()


async def test_the_batch_decodes_requests_with_the_adapter(tiny_own_head, adapter, expected):
    engine = BatchedEngine(tiny_own_head, adapter_path=adapter)
    try:
        got = await asyncio.gather(*[greedy(engine, p) for p in PROMPTS])
        assert got == [expected[p] for p in PROMPTS]
    finally:
        await engine.stop()


@pytest.mark.parametrize("cls", [SimpleEngine, BatchedEngine])
async def test_an_unloaded_engine_loads_the_adapter_again(tiny_own_head, adapter, expected, cls):
    engine = cls(tiny_own_head, adapter_path=str(adapter), keep_alive="5m")
    try:
        prompt = PROMPTS[0]
        assert await greedy(engine, prompt) == expected[prompt]
        assert engine.unload_if_idle() and not engine.is_loaded
        assert await greedy(engine, prompt) == expected[prompt]
        assert engine.get_stats()["residency"]["loads"] == 2
    finally:
        await engine.stop()


@pytest.fixture
def no_budget() -> Iterator[None]:
    yield
    residency.set_memory_budget(None, wait_s=30)


async def test_the_memory_estimate_counts_the_adapter(tiny_own_head, tmp_path, no_budget):
    """An adapter too large for the budget is refused before it is read: its size
    is part of what the load needs."""
    big = tmp_path / "big-adapter"
    big.mkdir()
    (big / "adapter_config.json").write_text(
        json.dumps({"num_layers": 2, "lora_parameters": {"rank": 8, "scale": 20.0}})
    )
    header = json.dumps({"w": {"dtype": "F32", "shape": [2**28], "data_offsets": [0, 2**30]}})
    with open(big / "adapters.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header.encode())
        f.truncate(8 + len(header) + 2**30)  # sparse: 1 GiB that takes no disk
    residency.set_memory_budget("512MiB")
    with pytest.raises(ModelTooLarge, match=r"needs about 102\d\.\d MiB"):
        await SimpleEngine(tiny_own_head, adapter_path=big).start()
    plain = SimpleEngine(tiny_own_head)
    try:
        await plain.start()  # the same model without it fits
    finally:
        await plain.stop()


# ----------------------------------------------------------------- bad adapters


def adapter_copy(adapter: Path, folder: Path) -> Path:
    folder.mkdir()
    for name in ("adapter_config.json", "adapters.safetensors"):
        (folder / name).write_bytes((adapter / name).read_bytes())
    return folder


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        ("no_folder", r"adapter_path='.*nowhere' does not exist; pass the folder that mlx_lm"),
        ("a_file", r"is a file; pass the folder that mlx_lm.lora wrote"),
        ("no_weights", r"has no adapters.safetensors; an adapter folder holds"),
        ("no_config", r"has no adapter_config.json; an adapter folder holds"),
        ("bad_json", r"adapter_config.json is not valid JSON"),
        ("bad_type", r"fine_tune_type 'qlora' is none that mlx-lm applies \(lora, dora, full\)"),
        ("alpha", r"lora_parameters.scale must be a number \(mlx-lm takes 'scale', not 'alpha'\)"),
        ("no_layers", r"num_layers must be an integer"),
    ],
)
@pytest.mark.parametrize("cls", [SimpleEngine, BatchedEngine])
def test_a_bad_adapter_folder_is_refused_before_the_model_loads(
    tiny_own_head, adapter, tmp_path, damage, match, cls
):
    folder = adapter_copy(adapter, tmp_path / "a")
    config = json.loads((folder / "adapter_config.json").read_text())
    if damage == "no_folder":
        folder = tmp_path / "nowhere"
    elif damage == "a_file":
        folder = folder / "adapters.safetensors"
    elif damage == "no_weights":
        (folder / "adapters.safetensors").unlink()
    elif damage == "no_config":
        (folder / "adapter_config.json").unlink()
    elif damage == "bad_json":
        (folder / "adapter_config.json").write_text("{not json")
    else:
        if damage == "bad_type":
            config["fine_tune_type"] = "qlora"
        elif damage == "alpha":
            config["lora_parameters"] = {"rank": 8, "alpha": 16}
        else:
            del config["num_layers"]
        (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=match):
        cls(tiny_own_head, adapter_path=folder)


def test_an_adapter_path_of_the_wrong_type_is_refused(tiny_own_head):
    with pytest.raises(TypeError, match=r"adapter_path must be a folder path \(str or Path\)"):
        SimpleEngine(tiny_own_head, adapter_path=3)


async def test_an_adapter_of_another_model_fails_its_load_and_says_so(
    tiny_own_head, tmp_path_factory
):
    other = build_tiny_model(tmp_path_factory.mktemp("wide"), hidden_size=128)
    wrong = build_lora_adapter(other, tmp_path_factory.mktemp("wide-adapter") / "lora")
    engine = SimpleEngine(tiny_own_head, adapter_path=wrong)
    match = rf"The adapter at .*lora does not fit .* \(it was trained on '{other}'\)"
    for _ in range(2):  # a failed load keeps nothing: the next request tries again
        with pytest.raises(ValueError, match=match):
            await greedy(engine, PROMPTS[0])
        assert not engine.is_loaded and engine._executor is None


def test_a_vision_model_refuses_an_adapter(tiny_vlm, adapter):
    with pytest.raises(ValueError, match=r"is a vision-language model; adapter_path=.* for text"):
        SimpleEngine(tiny_vlm, adapter_path=adapter)


def test_a_distributed_engine_refuses_an_adapter(tiny_own_head, adapter):
    from mlx_integrations.engine.distributed.engine import DistributedEngine

    with pytest.raises(ValueError, match=r"does not apply adapter_path; fuse the adapter"):
        DistributedEngine(tiny_own_head, adapter_path=adapter)


# ------------------------------------------------------------------ prompt caches


def test_the_disk_tier_keeps_the_adapters_entries_apart(tiny_own_head, adapter, tmp_path):
    """The model with and without the adapter has two folders in one cache_dir, and
    neither removes the other's as stale."""
    cache_dir = tmp_path / "kv"
    plain = SimpleEngine(tiny_own_head, cache_dir=cache_dir)
    tuned = SimpleEngine(tiny_own_head, cache_dir=cache_dir, adapter_path=adapter)
    again = SimpleEngine(tiny_own_head, cache_dir=cache_dir)
    folders = sorted(p for p in cache_dir.iterdir() if (p / "model.json").is_file())
    assert len(folders) == 2
    records = {json.loads((p / "model.json").read_text())["adapter"] for p in folders}
    assert records == {None, str(adapter)}
    for engine in (plain, tuned, again):
        assert engine.get_cache_stats()["disk"] is not None


async def test_warm_caches_of_the_base_model_are_not_used_with_an_adapter(
    tiny_own_head, adapter, tmp_path, expected
):
    from mlx_integrations.models import import_model, warm_model
    from mlx_integrations.models.store import ModelStore

    store = ModelStore(tmp_path / "store")
    model = import_model(tiny_own_head, "tiny", store=store)
    warm_model("tiny", system="You are terse.", store=store)
    plain = SimpleEngine(model.path)
    tuned = SimpleEngine(model.path, adapter_path=adapter)
    try:
        await plain.start()
        await tuned.start()
        assert plain.get_cache_stats()["entry_count"] == 1  # the warm prefix, pinned
        assert tuned.get_cache_stats()["entry_count"] == 0  # base KV: not the adapter's
        assert await greedy(tuned, PROMPTS[0]) == expected[PROMPTS[0]]
    finally:
        await plain.stop()
        await tuned.stop()
