"""LangChain's standard integration suite for ChatMLX on the real SmolLM2-135M-Instruct."""

from __future__ import annotations

import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests

from mlx_integrations.langchain import ChatMLX
from tests.support.smollm import ensure_smollm2

pytestmark = pytest.mark.smollm


class TestChatMLXStandardIntegration(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[ChatMLX]:
        return ChatMLX

    @property
    def chat_model_params(self) -> dict:
        return {
            "model": str(ensure_smollm2()),
            "temperature": 0,
            "max_tokens": 100,
            # A 135M model loops at greedy without it (realistic for models this small).
            "repetition_penalty": 1.3,
        }

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def supported_usage_metadata_details(self) -> dict:
        return {"invoke": ["cache_read_input"], "stream": ["cache_read_input"]}

    def invoke_with_cache_read_input(self, *, stream: bool = False):
        """Ask the same long question twice: the second reads its prompt from the KV cache."""
        llm = ChatMLX(**self.chat_model_params)
        messages = [
            ("system", "You are a geography tutor. " + "Answer briefly and precisely. " * 20),
            ("human", "What is the capital of Italy?"),
        ]
        llm.invoke(messages, max_tokens=4)
        if stream:
            chunks = list(llm.stream(messages, max_tokens=4))
            msg = sum(chunks[1:], chunks[0])
        else:
            msg = llm.invoke(messages, max_tokens=4)
        assert msg.usage_metadata["input_token_details"]["cache_read"] > 100
        return msg
