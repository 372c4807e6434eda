"""Managing models through Ollama's API: ``/api/pull`` from a loopback Hub into the store,
with Ollama's progress lines, ``/api/copy`` as a store alias, ``/api/delete``; the
store's models listed and served under ``name:latest``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest

from mlx_integrations.models import ModelStore
from mlx_integrations.serve.config import ServeConfig
from mlx_integrations.serve.server import BackgroundServer
from tests.support.fake_hub import FakeHub

USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as server:
        yield server


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelStore:
    """A store of its own, and the loopback Hub's cache, read by the server at each call."""
    monkeypatch.setenv("MLXI_HOME", str(tmp_path / "mlxi"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return ModelStore(tmp_path / "mlxi")


@pytest.fixture
def client(
    hub: FakeHub, store: ModelStore, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ollama.Client]:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    with BackgroundServer(ServeConfig()) as url:
        yield ollama.Client(host=url)


def test_pull_streams_ollamas_progress_and_the_model_is_served(
    client: ollama.Client, hub: FakeHub, store: ModelStore, tiny_llama: Path
):
    hub.add_repo("org/tiny", tiny_llama)
    lines = list(client.pull("org/tiny", stream=True))
    statuses = [line.status for line in lines]
    assert statuses[0] == "pulling manifest" and statuses[-2:] == ["writing manifest", "success"]
    assert "verifying sha256 digest" in statuses
    downloads = [line for line in lines if line.status == "pulling org/tiny"]
    assert downloads and downloads[-1].completed == downloads[-1].total
    weights = (tiny_llama / "model.safetensors").stat().st_size
    assert downloads[-1].total and downloads[-1].total >= weights
    assert store.contains("org/tiny")

    assert "org/tiny:latest" in [m.model for m in client.list().models]
    reply = client.chat(model="org/tiny:latest", messages=USER, options={"num_predict": 2})
    assert reply.done and reply.eval_count == 2
    again = client.pull("org/tiny")  # already there: nothing is fetched
    assert again.status == "success"


def test_copy_names_a_stored_model_and_delete_removes_a_name_then_the_model(
    client: ollama.Client, hub: FakeHub, store: ModelStore, tiny_llama: Path
):
    hub.add_repo("org/tiny", tiny_llama)
    client.pull("org/tiny")
    assert client.copy("org/tiny:latest", "my-tiny:latest").status == "success"
    assert store.get("my-tiny").name == "org/tiny"
    listed = [m.model for m in client.list().models]
    assert {"org/tiny:latest", "my-tiny:latest"} <= set(listed)
    client.chat(model="my-tiny", messages=USER, options={"num_predict": 1})  # loaded by alias

    assert client.delete("my-tiny").status == "success"
    assert not store.contains("my-tiny") and store.contains("org/tiny")
    client.chat(model="org/tiny", messages=USER, options={"num_predict": 1})
    assert client.delete("org/tiny:latest").status == "success"  # unloaded first
    assert not store.contains("org/tiny")
    assert "org/tiny:latest" not in [m.model for m in client.list().models]
    with pytest.raises(ollama.ResponseError) as gone:
        client.delete("org/tiny")
    assert gone.value.status_code == 404 and "not in the store" in gone.value.error


def test_what_cannot_be_pulled_or_named_says_why(client: ollama.Client, hub: FakeHub):
    with pytest.raises(ollama.ResponseError) as library:
        client.pull("llama3.2")
    assert library.value.status_code == 400 and "not a Hugging Face repo id" in library.value.error
    with pytest.raises(ollama.ResponseError) as unknown:
        client.pull("org/nothing")
    assert unknown.value.status_code == 404
    streamed = httpx.post(
        f"{client._client.base_url}/api/pull", json={"model": "org/nothing"}, timeout=60
    )
    last = streamed.text.strip().splitlines()[-1]
    assert streamed.status_code == 200 and '"error"' in last  # an error after the first line
    with pytest.raises(ollama.ResponseError) as tagged:
        client.copy("org/tiny", "mine:v2")
    assert tagged.value.status_code == 400 and "'mine-v2'" in tagged.value.error
