"""MLXLLM on a tiny random Qwen2.5-VL: ImageBlocks reach the model as mlx-vlm sees them."""

from __future__ import annotations

import pytest
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, TextBlock, VideoBlock
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import ImageNode, NodeWithScore, TextNode
from llama_index.core.tools import FunctionTool

from mlx_integrations.llama_index import MLXLLM
from tests.llama_index.conformance import LLMConformanceTests
from tests.llama_index.test_mlxllm_conformance import lucky_number
from tests.support.event_loop import loop_ticks_while
from tests.support.file_server import FileServer
from tests.support.tiny_vlm import make_test_video
from tests.support.vlm_reference import MLXVLMReference, decode

QUESTION = "What is in this picture?"
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def llm(tiny_vlm) -> MLXLLM:
    # No prefix cache: every reply is computed from scratch, as mlx-vlm computes it.
    return MLXLLM(
        model=str(tiny_vlm),
        temperature=0,
        max_tokens=MAX_TOKENS,
        engine_options={"cache_memory_mb": 0},
    )


@pytest.fixture(scope="module")
def reference(tiny_vlm) -> MLXVLMReference:
    return MLXVLMReference(tiny_vlm)


@pytest.fixture(scope="module")
def tool() -> FunctionTool:
    tool = FunctionTool.from_defaults(lucky_number)
    # A random model rarely closes a free string: bound the argument.
    tool.metadata.fn_schema.model_fields["color"].json_schema_extra = {
        "enum": ["red", "green", "blue"]
    }
    tool.metadata.fn_schema.model_rebuild(force=True)
    return tool


def ask(image: ImageBlock, text: str = QUESTION) -> list[ChatMessage]:
    return [ChatMessage(role="user", blocks=[image, TextBlock(text=text)])]


def test_metadata_says_multimodal(llm, tiny_llama):
    assert llm.metadata.is_multimodal is True
    assert MLXLLM(model=str(tiny_llama)).metadata.is_multimodal is False


def test_greedy_reply_is_mlx_vlms_own(llm, reference, test_images):
    replies = []
    for image in test_images:
        response = llm.chat(ask(ImageBlock(path=image)))
        want = reference.reply(
            [{"type": "image"}, {"type": "text", "text": QUESTION}], [str(image)], MAX_TOKENS
        )
        assert response.message.content == decode(llm.engine.tokenizer, want.tokens)
        assert response.raw["usage"]["prompt_tokens"] == want.prompt_tokens
        replies.append(response.message.content)
    assert replies[0] != replies[1]  # two images, two replies


async def test_streams_and_async_equal_chat(llm, test_images):
    messages = ask(ImageBlock(path=test_images[0]))
    whole = llm.chat(messages)
    streamed = list(llm.stream_chat(messages))
    assert "".join(r.delta or "" for r in streamed) == whole.message.content
    assert streamed[-1].raw["usage"] == whole.raw["usage"]
    assert (await llm.achat(messages)).message.content == whole.message.content
    gen = await llm.astream_chat(messages)
    assert "".join([r.delta or "" async for r in gen]) == whole.message.content


def test_path_url_and_bytes_are_the_same_image(llm, test_images):
    png = test_images[1]
    with FileServer({png.name: png.read_bytes()}) as server:
        forms = {
            "path": ImageBlock(path=png),
            "file URL": ImageBlock(url=png.as_uri()),
            "http URL": ImageBlock(url=server.url(png.name)),
            "bytes": ImageBlock(image=png.read_bytes()),
            "bytes with mime type": ImageBlock(image=png.read_bytes(), image_mimetype="image/png"),
        }
        got = {name: llm.chat(ask(block)).message.content for name, block in forms.items()}
        assert server.hits[png.name] == 1
    assert got == dict.fromkeys(forms, got["path"])
    assert llm.chat(ask(ImageBlock(path=test_images[0]))).message.content != got["path"]


async def test_image_requests_leave_the_event_loop_free(llm, test_images):
    _, ticks = await loop_ticks_while(llm.achat(ask(ImageBlock(path=test_images[0]))))
    assert ticks >= 3


def test_an_image_to_a_text_model_is_refused_and_it_serves_on(tiny_llama, test_images):
    text_llm = MLXLLM(model=str(tiny_llama), temperature=0, max_tokens=4)
    before = text_llm.get_stats()["num_requests_processed"]
    with pytest.raises(ValueError, match=r"does not take images.*vision-language model"):
        text_llm.chat(ask(ImageBlock(path=test_images[0])))
    assert text_llm.get_stats()["num_requests_processed"] == before
    assert (
        text_llm.chat([ChatMessage(role="user", content="Hi")]).raw["usage"]["completion_tokens"]
        >= 1
    )


def test_tool_call_with_an_image(llm, tool, test_images):
    message = ask(ImageBlock(path=test_images[0]), "What is the lucky number of its color?")[0]
    response = llm.chat_with_tools([tool], user_msg=message, tool_required=True, max_tokens=32)
    [call] = llm.get_tool_calls_from_response(response)
    assert call.tool_name == "lucky_number" and call.tool_kwargs["color"] in (
        "red",
        "green",
        "blue",
    )


class TestMLXLLMConformanceTinyVLM(LLMConformanceTests):
    """The whole LlamaIndex suite (text, tools, structured output) on the vision model."""


def test_video_blocks_from_a_path_or_bytes_are_the_same_video(llm, reference, tmp_path):
    red = make_test_video(tmp_path / "red.mp4", "red")
    green = make_test_video(tmp_path / "green.mp4", "green")

    def reply(block: VideoBlock) -> str:
        blocks = [block, TextBlock(text="What happens?")]
        return llm.chat([ChatMessage(role="user", blocks=blocks)]).message.content

    want = reference.reply_to_video("What happens?", str(red), MAX_TOKENS)
    assert reply(VideoBlock(path=red)) == decode(llm.engine.tokenizer, want.tokens)
    assert reply(VideoBlock(video=red.read_bytes(), video_mimetype="video/mp4")) == reply(
        VideoBlock(path=red)
    )
    assert reply(VideoBlock(path=green)) != reply(VideoBlock(path=red))


class _Fixed(BaseRetriever):
    """Retrieves the same nodes for every query (the step under test is the LLM's)."""

    def __init__(self, nodes: list) -> None:
        self.nodes = nodes
        super().__init__()

    def _retrieve(self, query_bundle):
        return [NodeWithScore(node=node, score=1.0) for node in self.nodes]


def test_a_multimodal_rag_step_sends_retrieved_images(llm, test_images):
    """LlamaIndex's query engines with ``multimodal=True`` pass retrieved ImageNodes on."""
    text = TextNode(text="The flag of Quillby is shown below.")

    def answer(*nodes) -> tuple[str, int]:
        engine = RetrieverQueryEngine.from_args(
            retriever=_Fixed(list(nodes)), llm=llm, multimodal=True
        )
        before = llm.get_stats()["total_prompt_tokens"]
        reply = str(engine.query("What does the flag look like?"))
        return reply, llm.get_stats()["total_prompt_tokens"] - before

    stripes, stripes_tokens = answer(text, ImageNode(image_path=str(test_images[0])))
    checker, _ = answer(text, ImageNode(image_path=str(test_images[1])))
    _, text_tokens = answer(text)
    assert stripes != checker
    assert stripes_tokens >= text_tokens + 16  # the image's 16 tokens came too


def test_an_endless_stream_is_cut_at_the_engines_limit(tiny_vlm, test_images):
    from tests.llama_index.test_vision_blocks import Zeros

    small = MLXLLM(model=str(tiny_vlm), max_tokens=2, engine_options={"max_media_mb": 0.05})
    stream = Zeros()
    with pytest.raises(ValueError, match=r"holds a stream of more than 0\.05 MiB"):
        small.chat(ask(ImageBlock(image=stream)))
    assert stream.served <= 0.05 * 1024 * 1024 + 1
    assert small.chat(ask(ImageBlock(path=test_images[0]))).message.content is not None
