"""The disk tier of the prefix cache (``cache_dir``): prompt KV that outlives the engine.

On a tiny random model with its own output head (greedy replies vary) and attention
heads of 64 values (every ``kv_group_size`` divides them). Prompts are prefilled in
pieces of 32 tokens, so a system prompt of a passage is many pieces long.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mlx_integrations.engine import BatchedEngine, SimpleEngine
from mlx_integrations.engine.cache import disk as disk_module
from mlx_integrations.engine.cache import kv_files
from mlx_integrations.engine.options import EngineOptions
from mlx_integrations.runtime import quantized_attention_error
from tests.support.event_loop import wait_until
from tests.support.prompts import PASSAGE
from tests.support.tiny_models import build_tiny_model

PIECE = 32
SYSTEM = f"You answer from this passage only.\n\n{PASSAGE}"
ASK = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is the reef?"}]
OTHER = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "How old is it?"}]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(
        tmp_path_factory.mktemp("disk-model"),
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )


@pytest.fixture(scope="module")
def cold(model: Path) -> dict[str, list[int]]:
    """Greedy replies of an engine without a disk tier (each prompt prefilled whole)."""
    import asyncio

    async def run() -> dict[str, list[int]]:
        eng = SimpleEngine(model, prefill_step_size=PIECE, cache_memory_mb=0)
        try:
            return {
                name: (await eng.chat(msgs, max_tokens=16, temperature=0)).tokens
                for name, msgs in (("ask", ASK), ("other", OTHER))
            }
        finally:
            await eng.stop()

    return asyncio.run(run())


EXACT = {"prefix_key_step": 1}
"""All that is cached is served, on CUDA too (whole steps of 256 there by default): these
tests check to the token what the disk holds."""


async def reply(cls: type, model: Path, messages: list, **options):
    """One greedy reply of a fresh engine, and its disk stats once stopped (stopping
    writes out what is queued)."""
    eng = cls(model, prefill_step_size=PIECE, **{**EXACT, **options})
    try:
        out = await eng.chat(messages, max_tokens=16, temperature=0)
    finally:
        await eng.stop()
    return out, eng.get_cache_stats()["disk"]


def entries(folder: str | Path) -> list[Path]:
    return sorted(Path(folder).glob("*.safetensors"))


def aligned(n: int) -> int:
    """The longest piece-aligned prefix of a prompt of ``n`` tokens."""
    return n // PIECE * PIECE


@pytest.mark.parametrize("cls", [SimpleEngine, BatchedEngine])
async def test_a_fresh_engine_replies_from_disk_as_a_cold_prefill(model, cold, tmp_path, cls):
    first, disk = await reply(cls, model, ASK, cache_dir=tmp_path)
    assert first.tokens == cold["ask"] and first.cached_tokens == 0
    assert disk is not None and disk["misses"] == 1
    assert [p.name for p in entries(disk["path"])]  # written by the time stop() returned
    again, disk = await reply(cls, model, ASK, cache_dir=tmp_path)
    # The prompt's longest piece-aligned prefix came from disk; the reply is a cold run's.
    assert again.tokens == cold["ask"]
    assert again.prompt_tokens == first.prompt_tokens
    assert again.cached_tokens == aligned(first.prompt_tokens) > first.prompt_tokens - PIECE
    assert disk["hits"] == 1 and disk["tokens_loaded"] == again.cached_tokens
    assert disk["load_seconds"] > 0 and disk["entry_count"] == 1
    # Another question after the same system prompt reuses what they share.
    other, disk = await reply(cls, model, OTHER, cache_dir=tmp_path)
    assert other.tokens == cold["other"] and other.cached_tokens > len(PASSAGE) // 2
    assert disk["hits"] == 1


async def test_a_prefix_from_disk_is_served_in_whole_key_steps(model, cold, tmp_path):
    first, _ = await reply(SimpleEngine, model, ASK, cache_dir=tmp_path)
    # Steps of 48 (not a multiple of the file's 32-token alignment): the file is cut.
    again, disk = await reply(SimpleEngine, model, ASK, cache_dir=tmp_path, prefix_key_step=48)
    assert again.tokens == cold["ask"]
    assert again.cached_tokens == aligned(first.prompt_tokens) // 48 * 48 > 0
    assert disk["hits"] == 1 and disk["tokens_loaded"] == again.cached_tokens
    # A step longer than the file reaches: the file is not read, and it is a miss.
    whole, disk = await reply(SimpleEngine, model, ASK, cache_dir=tmp_path, prefix_key_step=4096)
    assert whole.tokens == cold["ask"] and whole.cached_tokens == 0
    assert disk["hits"] == 0 and disk["misses"] == 1 and disk["tokens_loaded"] == 0


async def test_the_prefix_requests_share_is_kept_for_the_next_process(model, tmp_path):
    # Pieces of 128: the prompts' piece-aligned prefixes stop before their shared part does.
    eng = SimpleEngine(model, prefill_step_size=128, cache_dir=tmp_path, **EXACT)
    try:
        first = await eng.chat(ASK, max_tokens=8, temperature=0)
        second = await eng.chat(OTHER, max_tokens=8, temperature=0)
    finally:
        await eng.stop()
    shared = second.cached_tokens  # the system prompt and the user turn's opening
    assert first.prompt_tokens // 128 * 128 < shared < second.prompt_tokens
    third = [ASK[0], {"role": "user", "content": "Name one island."}]
    out, disk = await reply(SimpleEngine, model, third, cache_dir=tmp_path)
    cold_third, _ = await reply(SimpleEngine, model, third)
    assert out.cached_tokens == shared and disk["hits"] == 1
    assert out.tokens == cold_third.tokens


SCRIPT = """
import asyncio, json, sys
sys.path.insert(0, {root!r})
import mlx_integrations
from mlx_integrations.engine import SimpleEngine

async def main():
    eng = SimpleEngine({model!r}, cache_dir={cache!r}, prefill_step_size={piece})
    out = await eng.chat({messages!r}, max_tokens=16, temperature=0)
    disk = eng.get_cache_stats()["disk"]
    await eng.stop()
    print(json.dumps({{"tokens": out.tokens, "cached": out.cached_tokens, "hits": disk["hits"]}}))

asyncio.run(main())
"""


def in_new_process(model: Path, cache: Path, messages: list) -> dict:
    script = SCRIPT.format(
        root=str(ROOT), model=str(model), cache=str(cache), piece=PIECE, messages=messages
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_new_process_replies_from_disk_as_a_cold_prefill(model, cold, tmp_path):
    first = in_new_process(model, tmp_path, ASK)
    assert first["cached"] == 0 and first["hits"] == 0 and first["tokens"] == cold["ask"]
    second = in_new_process(model, tmp_path, ASK)
    assert second["hits"] == 1 and second["cached"] > 0
    assert second["tokens"] == cold["ask"]


def damage(path: Path, how: str) -> None:
    import mlx.core as mx

    if how == "cut short":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif how == "bad header":
        with open(path, "r+b") as fh:
            fh.write(b"\xff" * 8)
    elif how == "wrong shapes":  # a whole, readable file whose tensors do not fit its tokens
        arrays, metadata = mx.load(str(path), return_metadata=True)
        arrays["0.k"] = arrays["0.k"][..., :-1, :]
        mx.save_safetensors(str(path), arrays, metadata)
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("when", ["at start", "at lookup"])
@pytest.mark.parametrize("how", ["cut short", "bad header", "wrong shapes"])
async def test_a_damaged_file_is_removed_never_loaded(model, cold, tmp_path, caplog, how, when):
    _, disk = await reply(SimpleEngine, model, ASK, cache_dir=tmp_path)
    (file,) = entries(disk["path"])
    if when == "at start":
        damage(file, how)
    eng = SimpleEngine(model, prefill_step_size=PIECE, cache_dir=tmp_path)
    try:
        if when == "at lookup":  # the engine indexed a good file; it changes under it
            damage(file, how)
        with caplog.at_level(logging.WARNING, logger=disk_module.__name__):
            out = await eng.chat(ASK, max_tokens=16, temperature=0)
        stats = eng.get_cache_stats()["disk"]
    finally:
        await eng.stop()
    assert out.cached_tokens == 0 and out.tokens == cold["ask"]
    assert stats["removed_files"] == 1 and stats["hits"] == 0
    assert "Removing disk cache file" in caplog.text and "damaged" in caplog.text
    # The request wrote a good entry again, under the same name.
    assert entries(disk["path"]) == [file]
    again, _ = await reply(SimpleEngine, model, ASK, cache_dir=tmp_path)
    assert again.cached_tokens > 0 and again.tokens == cold["ask"]


async def test_a_file_of_other_weights_is_removed(model, tiny_own_head, cold, tmp_path, caplog):
    _, ours = await reply(SimpleEngine, model, ASK, cache_dir=tmp_path)
    theirs = SimpleEngine(tiny_own_head, cache_dir=tmp_path).get_cache_stats()["disk"]
    assert theirs is not None and theirs["path"] != ours["path"]
    (file,) = entries(ours["path"])
    shutil.copy(file, Path(theirs["path"]) / file.name)
    with caplog.at_level(logging.WARNING, logger=disk_module.__name__):
        other = SimpleEngine(tiny_own_head, cache_dir=tmp_path)
    assert other.get_cache_stats()["disk"]["removed_files"] == 1
    assert "made for other weights" in caplog.text
    assert entries(theirs["path"]) == [] and entries(ours["path"]) == [file]


async def test_new_weights_start_empty_and_drop_the_old_entries(model, tmp_path):
    import mlx.core as mx

    copy = tmp_path / "model"
    shutil.copytree(model, copy)
    _, old = await reply(SimpleEngine, copy, ASK, cache_dir=tmp_path / "kv")
    assert entries(old["path"])
    weights = mx.load(str(copy / "model.safetensors"))
    assert isinstance(weights, dict)
    weights = {k: v * 1.01 if k == "lm_head.weight" else v for k, v in weights.items()}
    mx.save_safetensors(str(copy / "model.safetensors"), weights, {"format": "mlx"})
    out, new = await reply(SimpleEngine, copy, ASK, cache_dir=tmp_path / "kv")
    assert new["path"] != old["path"] and not Path(old["path"]).exists()
    assert out.cached_tokens == 0 and new["hits"] == 0


def system_prompt(i: int) -> list[dict[str, str]]:
    # As long as one another: their entries are about the same size.
    return [{"role": "system", "content": f"Passage {i}. {PASSAGE}"}, ASK[1]]


async def test_the_budget_holds_by_removing_the_least_recently_used(model, tmp_path):
    _, disk = await reply(SimpleEngine, model, system_prompt(1), cache_dir=tmp_path)
    size = disk and max(p.stat().st_size for p in entries(disk["path"]))
    assert size
    budget = 2.5 * size / 2**20  # two entries fit, three do not
    opts = {"cache_dir": tmp_path, "disk_cache_mb": budget}
    await reply(SimpleEngine, model, system_prompt(2), **opts)
    hit, _ = await reply(SimpleEngine, model, system_prompt(1), **opts)  # 1 is used again
    assert hit.cached_tokens > 0
    _, disk = await reply(SimpleEngine, model, system_prompt(3), **opts)
    assert disk is not None and disk["evictions"] == 1 and disk["entry_count"] == 2
    on_disk = entries(disk["path"])
    assert sum(p.stat().st_size for p in on_disk) <= budget * 2**20
    # 2 went (least recently used); 1 and 3 are served.
    for i, served in ((1, True), (3, True), (2, False)):
        out, _ = await reply(SimpleEngine, model, system_prompt(i), **opts)
        assert (out.cached_tokens > 0) == served, i


@pytest.mark.skipif(
    quantized_attention_error("float32", 64, 8, 64) is not None,
    reason="this MLX backend has no kernel for attention over a quantized KV cache",
)
@pytest.mark.parametrize("cls", [SimpleEngine, BatchedEngine])
async def test_quantized_entries_serve_only_their_kv_format(model, cold, tmp_path, caplog, cls):
    q8 = {"cache_dir": tmp_path, "kv_bits": 8}
    cold_q8, disk_q8 = await reply(cls, model, ASK, **q8)
    plain, disk_plain = await reply(cls, model, ASK, cache_dir=tmp_path)
    assert disk_q8["path"] != disk_plain["path"]
    assert plain.cached_tokens == 0 and disk_plain["hits"] == 0 and plain.tokens == cold["ask"]
    assert len(entries(disk_q8["path"])) == 1  # kept for engines with kv_bits=8
    again, disk = await reply(cls, model, ASK, **q8)
    assert again.cached_tokens > 0 and disk["hits"] == 1 and again.tokens == cold_q8.tokens
    # A quantized file in the plain engines' folder is removed, not served.
    (file,) = entries(disk_q8["path"])
    for stale in entries(disk_plain["path"]):
        stale.unlink()
    shutil.copy(file, Path(disk_plain["path"]) / file.name)
    with caplog.at_level(logging.WARNING, logger=disk_module.__name__):
        out, disk = await reply(cls, model, ASK, cache_dir=tmp_path)
    assert disk["removed_files"] == 1 and out.cached_tokens == 0 and "KV format" in caplog.text


async def test_writes_wait_for_nothing_on_the_owner_thread(model, tmp_path, monkeypatch):
    release = threading.Event()
    writers: list[str] = []
    real = kv_files.write_file

    def held(path: Path, snap: kv_files.Snapshot) -> None:
        writers.append(threading.current_thread().name)
        release.wait(120)
        real(path, snap)

    monkeypatch.setattr(kv_files, "write_file", held)
    eng = SimpleEngine(model, prefill_step_size=PIECE, cache_dir=tmp_path)
    try:
        # Each request returns while the writer is held: decoding never waits for it,
        # and beyond MAX_PENDING queued entries a write is skipped, not waited for.
        count = disk_module.MAX_PENDING + 2
        for i in range(count):
            out = await eng.chat(system_prompt(i), max_tokens=4, temperature=0)
            assert out.finished
            if i == 0:
                await wait_until(lambda: writers, "the writer thread took the first entry")
        disk = eng.get_cache_stats()["disk"]
        assert disk["entry_count"] == 0 and disk["writes"] == 0
        assert disk["pending_writes"] == disk_module.MAX_PENDING + 1
        assert disk["skipped_writes"] == count - disk_module.MAX_PENDING - 1
        assert writers == [f"mlxi-disk-{Path(disk['path']).name}"]
    finally:
        release.set()
        await eng.stop()
    disk = eng.get_cache_stats()["disk"]
    assert disk["writes"] == disk["entry_count"] == disk_module.MAX_PENDING + 1
    assert disk["pending_writes"] == 0 and all(w.startswith("mlxi-disk-") for w in writers)


async def test_clearing_runtime_caches_keeps_the_disk_entries(model, tmp_path):
    eng = SimpleEngine(model, prefill_step_size=PIECE, cache_dir=tmp_path)
    try:
        await eng.chat(ASK, max_tokens=4, temperature=0)
        await wait_until(lambda: eng.get_cache_stats()["disk"]["writes"], "the entry is written")
        eng.clear_runtime_caches()
        # The memory tier is empty: the next request is served from disk.
        out = await eng.chat(ASK, max_tokens=4, temperature=0)
        disk = eng.get_cache_stats()["disk"]
        assert out.cached_tokens > 0 and disk["hits"] == 1 and disk["entry_count"] == 1
        cleared = eng.clear_disk_cache()
        assert cleared["dropped_entries"] == 1 and cleared["freed_cache_mb"] > 0
        assert entries(disk["path"]) == [] and eng.get_cache_stats()["disk"]["entry_count"] == 0
    finally:
        await eng.stop()
    plain = SimpleEngine(model)
    assert plain.get_cache_stats()["disk"] is None
    assert plain.clear_disk_cache()["dropped_entries"] == 0


def test_warm_fills_the_disk_cache_an_engine_reads(model, cold, tmp_path):
    import asyncio

    from mlx_integrations.cli.main import app
    from typer.testing import CliRunner

    args = ["warm", str(model), "--system", SYSTEM, "--cache-dir", str(tmp_path), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.stderr
    warmed = json.loads(result.stdout)["disk_cache"]
    assert warmed["written"] and warmed["source"] == "system" and warmed["tokens"] > 300
    out, disk = asyncio.run(reply(SimpleEngine, model, ASK, cache_dir=tmp_path))
    assert disk["path"] == warmed["folder"] and disk["hits"] == 1
    assert out.cached_tokens == warmed["tokens"] and out.tokens == cold["ask"]
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and not json.loads(again.stdout)["disk_cache"]["written"]
    misuse = CliRunner().invoke(app, ["warm", str(model), "--kv-bits", "8", "--system", "x"])
    assert misuse.exit_code == 2 and "--cache-dir" in misuse.stderr


def test_adapters_pass_cache_dir_through(model, tmp_path):
    from mlx_integrations.langchain import ChatMLX

    llm = ChatMLX(model=str(model), engine_options={"cache_dir": str(tmp_path)})
    disk = llm.engine.get_cache_stats()["disk"]
    assert disk is not None and Path(disk["path"]).parent == tmp_path


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"cache_dir": 5}, TypeError, r"cache_dir must be a folder path.*5"),
        ({"cache_dir": ""}, TypeError, r"cache_dir must be a folder path"),
        ({"cache_dir": "FILE"}, ValueError, r"cache_dir=.*is a file, not a folder"),
        ({"disk_cache_mb": 0}, ValueError, r"disk_cache_mb must be a finite number > 0.*got 0"),
        ({"disk_cache_mb": float("nan")}, ValueError, r"disk_cache_mb must be a finite"),
        ({"disk_cache_mb": "4096"}, TypeError, r"disk_cache_mb must be a number.*'4096'"),
    ],
)
def test_bad_disk_options_are_refused(tmp_path, options, error, match):
    file = tmp_path / "file"
    file.write_text("")
    if options.get("cache_dir") == "FILE":
        options = {"cache_dir": str(file)}
    with pytest.raises(error, match=match):
        EngineOptions(**options)


def test_the_disk_options_default_off():
    opts = EngineOptions()
    assert opts.cache_dir is None and opts.disk_cache_mb == 4096
