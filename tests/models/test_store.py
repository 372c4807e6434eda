"""The store without a Hub: names, import, show, verify, tag, rm, prune, atomic writes."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from mlx_integrations.models import (
    InvalidNameError,
    ModelExistsError,
    ModelNotFoundError,
    ModelStore,
    StoreIOError,
    import_model,
    prune,
    remove_model,
    resolve_model,
    show_model,
    validate_name,
)


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "mlxi")


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "../evil",
        "/etc/passwd",
        "a/../b",
        "a/b/c",
        "~root",
        "a\\b",
        "a--b",
        ".",
        "..",
        "org/",
        "/org",
        "C:evil",
        "name with space",
        "x/.",
    ],
)
def test_names_with_path_syntax_are_rejected(bad):
    with pytest.raises(InvalidNameError):
        validate_name(bad)


@pytest.mark.parametrize("good", ["qwen3-4b-q4", "org/Model_1.5B", "smollm2"])
def test_valid_names(good):
    assert validate_name(good) == good


def test_traversal_name_cannot_write_outside_the_store(store, tiny_llama, tmp_path):
    with pytest.raises(InvalidNameError):
        import_model(tiny_llama, "../outside", store=store)
    with pytest.raises(InvalidNameError):
        store.tag("whatever", "../../x")
    assert not (tmp_path / "outside").exists()


def test_import_list_show(store, tiny_llama, tiny_plain):
    model = import_model(tiny_llama, "tiny", store=store)
    import_model(tiny_plain, "plain", store=store)
    assert [m.name for m in store.list()] == ["plain", "tiny"]
    assert resolve_model("tiny", store=store) == model.path

    info = show_model("tiny", store=store)
    config = json.loads((tiny_llama / "config.json").read_text())
    assert info.architecture == "llama"
    assert info.context_length == config["max_position_embeddings"]
    assert info.dtype == "float32"
    assert info.quantization is None
    assert info.template_takes_tools is True
    assert show_model("plain", store=store).template_takes_tools is False
    assert info.size_bytes == sum(f.stat().st_size for f in tiny_llama.iterdir())

    import mlx.core as mx  # noqa: F401
    from mlx.utils import tree_flatten
    from mlx_lm import load

    loaded, _ = load(str(model.path))
    assert info.parameters == sum(v.size for _, v in tree_flatten(loaded.parameters()))


def test_import_refuses_to_overwrite_without_force(store, tiny_llama):
    import_model(tiny_llama, "tiny", store=store)
    with pytest.raises(ModelExistsError):
        import_model(tiny_llama, "tiny", store=store)
    import_model(tiny_llama, "tiny", store=store, overwrite=True)


def test_verify_catches_corrupted_truncated_and_missing_files(store, tiny_llama):
    model = import_model(tiny_llama, "tiny", store=store)
    assert store.verify("tiny").ok
    weights = model.path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    (model.path / "tokenizer_config.json").write_text("{}")
    (model.path / "special_tokens_map.json").unlink()
    report = store.verify("tiny")
    status = {f.path: f.status for f in report.files}
    assert not report.ok
    assert status["model.safetensors"] == "sha256_mismatch"
    assert status["tokenizer_config.json"] == "size_mismatch"
    assert status["special_tokens_map.json"] == "missing"
    assert status["config.json"] == "ok"


def test_tag_and_remove(store, tiny_llama):
    import_model(tiny_llama, "tiny", store=store)
    store.tag("tiny", "fast")
    assert store.get("fast").name == "tiny"
    assert store.get("tiny").aliases == ("fast",)
    with pytest.raises(ModelExistsError):
        store.tag("tiny", "tiny")

    result = remove_model("fast", store=store)
    assert result.kind == "alias" and store.contains("tiny") and not store.contains("fast")

    store.tag("tiny", "fast")
    dry = remove_model("tiny", dry_run=True, store=store)
    assert dry.freed_bytes > 0 and store.contains("tiny")
    removed = remove_model("tiny", store=store)
    assert removed.aliases_removed == ("fast",)
    assert not store.contains("tiny") and not store.contains("fast")
    with pytest.raises(ModelNotFoundError, match="'tiny' is not in the store") as info:
        store.get("tiny")
    assert info.value.hint == "See what is there: mlxi list"


def test_remove_a_model_in_use_keeps_the_loaded_copy_working(store, tiny_llama):
    from mlx_lm import generate, load

    model = import_model(tiny_llama, "tiny", store=store)
    loaded, tokenizer = load(str(model.path))
    remove_model("tiny", store=store)
    assert not model.path.exists()
    text = generate(loaded, tokenizer, "Hello", max_tokens=4)
    assert isinstance(text, str) and text
    with pytest.raises(ModelNotFoundError):
        resolve_model("tiny", store=store)


def test_failed_build_leaves_the_store_as_it_was(store, tiny_llama):
    import_model(tiny_llama, "tiny", store=store)
    before = sorted(p.name for p in store.models_dir.iterdir())
    with pytest.raises(RuntimeError), store.building("tiny", overwrite=True) as build:
        (build.path / "config.json").write_text("{}")
        raise RuntimeError("interrupted")
    assert sorted(p.name for p in store.models_dir.iterdir()) == before
    assert store.verify("tiny").ok


def test_full_disk_gives_a_clear_error_and_no_partial_model(store, tiny_llama, monkeypatch):
    calls = {"n": 0}
    real_copy = shutil.copyfile

    def copy_until_full(src, dst, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real_copy(src, dst, *a, **kw)

    monkeypatch.setattr(shutil, "copyfile", copy_until_full)
    with pytest.raises(StoreIOError, match="No space left") as info:
        import_model(tiny_llama, "tiny", store=store)
    assert "disk space" in (info.value.hint or "")
    assert list(store.models_dir.iterdir()) == []


def test_prune_removes_leftovers_and_keeps_models(store, tiny_llama, tmp_path):
    import_model(tiny_llama, "tiny", store=store)
    store.tag("tiny", "fast")
    dead_pid = 2**22 + 4321
    with pytest.raises(ProcessLookupError):
        os.kill(dead_pid, 0)
    stale = store.models_dir / f".tmp-tiny-{dead_pid}-abcd1234"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"x" * 100)
    live = store.models_dir / f".tmp-other-{os.getpid()}-abcd1234"
    live.mkdir()
    orphan = store.models_dir / "orphan"
    orphan.mkdir()
    (orphan / "config.json").write_text("{}")
    aliases = json.loads(store.aliases_file.read_text())
    store.aliases_file.write_text(json.dumps({**aliases, "ghost": "gone"}))
    hf = tmp_path / "hf"
    partial = hf / "models--org--x" / "blobs" / "abc.incomplete"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"y" * 10)
    os.utime(partial, (1, 1))

    dry = prune(dry_run=True, hf_cache_dir=hf, store=store)
    kinds = sorted(i.kind for i in dry.items)
    assert kinds == ["dangling_alias", "incomplete_build", "incomplete_download", "orphan_folder"]
    assert stale.exists() and partial.exists()

    report = prune(hf_cache_dir=hf, store=store)
    assert report.freed_bytes >= 110
    assert not stale.exists() and not orphan.exists() and not partial.exists()
    assert live.exists()
    assert store.aliases() == {"fast": "tiny"}
    assert store.verify("tiny").ok


def test_resolve_paths_and_unknown_names(store, tiny_llama):
    assert resolve_model(str(tiny_llama), store=store) == tiny_llama.resolve()
    assert resolve_model(tiny_llama / "config.json", store=store) == tiny_llama.resolve()
    with pytest.raises(ModelNotFoundError, match="org/unknown") as info:
        resolve_model("org/unknown", store=store)
    assert info.value.hint == "Run: mlxi pull org/unknown"
    with pytest.raises(ModelNotFoundError):
        resolve_model("/no/such/folder", store=store)
