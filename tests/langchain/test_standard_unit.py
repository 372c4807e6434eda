"""LangChain's standard unit suite for ChatMLX (on a tiny model; nothing is generated)."""

from __future__ import annotations

from langchain_tests.unit_tests import ChatModelUnitTests

from mlx_integrations.langchain import ChatMLX
from tests.support.tiny_models import cached_tiny_model


class TestChatMLXStandardUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatMLX]:
        return ChatMLX

    @property
    def chat_model_params(self) -> dict:
        return {"model": str(cached_tiny_model())}
