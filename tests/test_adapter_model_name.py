"""The adapters report a model by the name it was given (a store alias here), as LangSmith
sees it, and the folder it was loaded from beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_integrations.models import ModelStore, import_model


@pytest.fixture
def stored(tmp_path: Path, tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny Llama in a fresh store as ``tiny``, also called ``my-tiny``; its folder."""
    store = ModelStore(tmp_path / "mlxi")
    model = import_model(tiny_llama, "tiny", store=store)
    store.tag("tiny", "my-tiny")
    monkeypatch.setenv("MLXI_HOME", str(store.home))
    return model.path


def test_chatmlx_reports_the_alias_and_the_folder(stored: Path):
    from mlx_integrations.langchain import ChatMLX

    llm = ChatMLX(model="my-tiny", temperature=0, max_tokens=2)
    for msg in (llm.invoke("Hi"), _streamed(llm)):
        meta = msg.response_metadata
        assert meta["model_name"] == "my-tiny" == llm._get_ls_params()["ls_model_name"]
        assert Path(meta["model_path"]) == stored
    # A per-call model is reported as that call named it.
    meta = llm.invoke("Hi", model="tiny").response_metadata
    assert meta["model_name"] == "tiny" == llm._get_ls_params(model="tiny")["ls_model_name"]
    assert Path(meta["model_path"]) == stored


def _streamed(llm):
    from langchain_core.messages import AIMessageChunk

    chunks = list(llm.stream("Hi"))
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole = whole + chunk
    assert isinstance(whole, AIMessageChunk)
    return whole


async def test_mlxllm_reports_the_alias_and_the_folder(stored: Path):
    from llama_index.core.base.llms.types import ChatMessage

    from mlx_integrations.llama_index import MLXLLM

    llm = MLXLLM(model="my-tiny", temperature=0, max_tokens=2)
    assert llm.metadata.model_name == "my-tiny"
    messages = [ChatMessage(role="user", content="Hi")]
    raws = [
        llm.chat(messages).raw,
        (await llm.achat(messages)).raw,
        [r for r in llm.stream_chat(messages)][-1].raw,
        llm.complete("Hi", formatted=True).raw,
    ]
    for raw in raws:
        assert raw is not None
        assert raw["model"] == "my-tiny" and Path(raw["model_path"]) == stored
