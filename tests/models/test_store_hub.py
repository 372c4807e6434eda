"""Pulling from a loopback Hub: pinning, offline reuse, faults and clear errors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from mlx_integrations.models import (
    GatedRepoError,
    IntegrityError,
    ModelStore,
    OfflineError,
    RemoteFileMissingError,
    RepoNotFoundError,
    RevisionNotFoundError,
    pull,
    remove_model,
    resolve_model,
)
from tests.support.fake_hub import FakeHub, folder_files


@pytest.fixture
def hub():
    with FakeHub() as server:
        yield server


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "mlxi")


@pytest.fixture(autouse=True)
def _online(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def _pull(hub: FakeHub, store: ModelStore, tmp_path: Path, repo: str = "org/tiny", **kw):
    return pull(repo, store=store, endpoint=hub.url, cache_dir=tmp_path / "hf", **kw)


def _store_is_empty(store: ModelStore) -> bool:
    return not store.models_dir.exists() or not any(store.models_dir.iterdir())


def test_pull_stores_verified_files_and_pull_again_offline_makes_no_request(
    hub, store, tmp_path, tiny_llama, monkeypatch
):
    hub.add_repo("org/tiny", tiny_llama)
    result = _pull(hub, store, tmp_path)
    assert result.downloaded
    expected = {n: hashlib.sha256(d).hexdigest() for n, d in folder_files(tiny_llama).items()}
    assert {f.path: f.sha256 for f in result.model.manifest.files} == expected
    assert store.verify("org/tiny").ok
    assert resolve_model("org/tiny", store=store) == result.model.path

    before = len(hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    again = _pull(hub, store, tmp_path)
    assert not again.downloaded
    assert hub.requests_since(before) == []
    hub.stop()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert not _pull(hub, store, tmp_path).downloaded


def test_pinned_revision_is_kept_until_update(hub, store, tmp_path, tiny_llama):
    files = folder_files(tiny_llama)
    first = hub.add_repo("org/tiny", files)
    _pull(hub, store, tmp_path)
    second = hub.add_repo("org/tiny", {**files, "extra.json": b'{"x": 1}'})

    before = len(hub.requests)
    assert _pull(hub, store, tmp_path).model.manifest.source.commit == first
    assert hub.requests_since(before) == []

    updated = _pull(hub, store, tmp_path, update=True)
    assert updated.downloaded and updated.model.manifest.source.commit == second
    assert "extra.json" in {f.path for f in updated.model.manifest.files}

    # Back to the first commit by sha: served from the HF cache without a request.
    before = len(hub.requests)
    back = _pull(hub, store, tmp_path, revision=first)
    assert back.model.manifest.source.commit == first
    assert hub.requests_since(before) == []


def test_connection_cut_mid_file_restarts_and_result_is_verified(hub, store, tmp_path, tiny_llama):
    hub.add_repo("org/tiny", tiny_llama)
    hub.cut["model.safetensors"] = 1
    result = _pull(hub, store, tmp_path)
    gets = [r for r in hub.requests if r.method == "GET" and r.path.endswith("model.safetensors")]
    assert len(gets) >= 2
    assert hub.cut["model.safetensors"] == 0
    assert store.verify(result.model.name).ok


def test_unknown_repo_is_a_clear_error_and_leaves_nothing(hub, store, tmp_path):
    with pytest.raises(RepoNotFoundError, match="org/nope") as info:
        _pull(hub, store, tmp_path, repo="org/nope", token="hf_SECRET_TOKEN_123")
    assert info.value.hint and "token" in info.value.hint
    assert "hf_SECRET_TOKEN_123" not in f"{info.value} {info.value.hint} {info.value.__cause__}"
    assert _store_is_empty(store)


def test_gated_repo(hub, store, tmp_path, tiny_llama):
    hub.add_repo("org/gated", tiny_llama, gated=True)
    with pytest.raises(GatedRepoError, match="gated") as info:
        _pull(hub, store, tmp_path, repo="org/gated")
    assert "Accept" in (info.value.hint or "")
    assert _store_is_empty(store)


def test_unknown_revision(hub, store, tmp_path, tiny_llama):
    hub.add_repo("org/tiny", tiny_llama)
    with pytest.raises(RevisionNotFoundError, match="v9"):
        _pull(hub, store, tmp_path, revision="v9")


def test_missing_file_names_the_file_and_no_model_appears(hub, store, tmp_path, tiny_llama):
    hub.add_repo("org/tiny", tiny_llama)
    hub.missing.add("tokenizer.json")
    with pytest.raises(RemoteFileMissingError, match=r"tokenizer\.json"):
        _pull(hub, store, tmp_path)
    assert not store.contains("org/tiny")
    assert not list(store.models_dir.glob(".tmp-*"))


def test_corrupted_download_is_rejected_then_pull_again_repairs(hub, store, tmp_path, tiny_llama):
    hub.add_repo("org/tiny", tiny_llama)
    hub.corrupt.add("model.safetensors")
    with pytest.raises(IntegrityError, match=r"model\.safetensors"):
        _pull(hub, store, tmp_path)
    assert not store.contains("org/tiny")
    hub.corrupt.clear()
    assert store.verify(_pull(hub, store, tmp_path).model.name).ok


def test_offline_without_cache(hub, store, tmp_path, tiny_llama, monkeypatch):
    hub.add_repo("org/tiny", tiny_llama)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OfflineError, match="HF_HUB_OFFLINE"):
        _pull(hub, store, tmp_path)
    assert hub.requests == []


def test_unreachable_hub_without_cache(store, tmp_path):
    hub = FakeHub().start()
    url = hub.url
    hub.stop()
    with pytest.raises(OfflineError, match="Could not reach"):
        pull("org/tiny", store=store, endpoint=url, cache_dir=tmp_path / "hf")


def test_repo_without_model_files(hub, store, tmp_path):
    hub.add_repo("org/ggufonly", {"model.gguf": b"GGUF" + b"\0" * 64, "README.md": b"hi"})
    with pytest.raises(RemoteFileMissingError, match="no MLX/safetensors"):
        _pull(hub, store, tmp_path, repo="org/ggufonly")


def test_rm_purge_during_a_pull_of_the_same_files_keeps_them(hub, store, tmp_path, tiny_llama):
    hub.add_repo("org/tiny", tiny_llama)
    _pull(hub, store, tmp_path)
    removed = []

    def progress(update) -> None:
        # Inside the second pull, once it has linked and hashed the cached files and
        # before it commits: the moment another process's `mlxi rm --purge` would race it.
        if update.task == "hash" and update.done and not removed:
            removed.append(remove_model("org/tiny", purge_hf_cache=True, store=store))

    _pull(hub, store, tmp_path, name="copy", progress=progress)
    [result] = removed
    assert result.hf_cache_freed == 0 and "a model being built" in result.hf_cache_note
    assert not store.contains("org/tiny")
    assert store.verify("copy").ok


def test_a_build_whose_linked_files_were_deleted_is_not_stored(store, tmp_path, tiny_llama):
    import os
    import shutil

    from mlx_integrations.models import Manifest, ModelSource, StoreError
    from mlx_integrations.models.manifest import hash_files, model_files

    cached = tmp_path / "cached"
    shutil.copytree(tiny_llama, cached)
    files = model_files(cached)
    with pytest.raises(StoreError, match="deleted while it was built"):
        with store.building("tiny") as build:
            for rel in files:
                os.symlink(cached / rel, build.path / rel)
            source = ModelSource(kind="local", path=str(cached))
            manifest = Manifest(name="tiny", source=source, files=hash_files(build.path, files))
            shutil.rmtree(cached)  # as a purge of the Hugging Face cache would
            build.commit(manifest)
    assert not store.contains("tiny") and _store_is_empty(store)
