"""LangChain's standard integration suite for ChatMLX on a tiny random vision model.

The image tests fetch a picture from GitHub; here that URL is answered by a loopback
server (with one of the test PNGs), both for the suite's own download and for the
engine's, so the engine really fetches an ``http`` image and the run stays offline.
"""

from __future__ import annotations

import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests

from mlx_integrations.langchain import ChatMLX
from tests.support.file_server import FileServer, route_urls
from tests.support.tiny_vlm import cached_tiny_vlm, make_test_image

# The picture langchain-tests' image tests download (langchain-tests 1.1.x).
SUITE_IMAGE_URL = (
    "https://raw.githubusercontent.com/langchain-ai/docs/"
    "4d11d08b6b0e210bd456943f7a22febbd168b543/src/images/agentic-rag-output.png"
)


@pytest.fixture(scope="module")
def image_server(tmp_path_factory):
    png = make_test_image(tmp_path_factory.mktemp("suite-image") / "picture.png", "checker")
    with FileServer({"picture.png": png.read_bytes()}) as server:
        yield server


# Tests whose checks need a trained model (exact tool arguments such as {"input": 3},
# a joke in a free string, an agent that decides to call); they run on SmolLM2 in
# test_standard_integration.py, and tool calls from a vision model are tested in
# test_chat_mlx_vision.py.
NEEDS_A_TRAINED_MODEL = (
    "test_tool_calling",
    "test_tool_calling_async",
    "test_bind_runnables_as_tools",
    "test_tool_choice",
    "test_tool_calling_with_no_arguments",
    "test_structured_output",
    "test_structured_output_async",
    "test_structured_output_pydantic_2_v1",
    "test_structured_output_optional_param",
    "test_json_mode",
    "test_agent_loop",
    "test_unicode_tool_call_integration",
)
# Downloads of the suite's picture per test: the suite's own, plus the engine's for the
# test that gives the model its URL.
EXPECTED_FETCHES = {
    "test_image_inputs": 2,
    "test_image_tool_message": 1,
    "test_anthropic_inputs": 1,
}


class TestChatMLXVisionStandardIntegration(ChatModelIntegrationTests):
    @pytest.fixture(autouse=True)
    def _suite_image_from_loopback(self, request, image_server, monkeypatch):
        name = request.node.originalname
        if name in NEEDS_A_TRAINED_MODEL:
            pytest.skip("a random-weight model cannot pass it; runs on SmolLM2")
        before = image_server.hits.get("picture.png", 0)
        with route_urls(monkeypatch, {SUITE_IMAGE_URL: image_server.url("picture.png")}):
            yield
        fetched = image_server.hits.get("picture.png", 0) - before
        assert fetched == EXPECTED_FETCHES.get(name, 0)

    @property
    def chat_model_class(self) -> type[ChatMLX]:
        return ChatMLX

    @property
    def chat_model_params(self) -> dict:
        return {"model": str(cached_tiny_vlm()), "temperature": 0, "max_tokens": 24}

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def supports_image_inputs(self) -> bool:
        return True

    @property
    def supports_image_urls(self) -> bool:
        return True

    @property
    def supports_image_tool_message(self) -> bool:
        return True

    @property
    def supports_anthropic_inputs(self) -> bool:
        return True
