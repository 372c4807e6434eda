"""ChatMLX on a tiny random Qwen2.5-VL: images reach the model as mlx-vlm itself sees them."""

from __future__ import annotations

import base64
from typing import Literal

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel

from mlx_integrations.langchain import ChatMLX
from mlx_integrations.langchain.messages import to_neutral_messages
from tests.langchain.test_chat_mlx import ScriptedEngine
from tests.support.file_server import FileServer
from tests.support.tiny_vlm import make_test_video, noisy_png
from tests.support.vlm_reference import MLXVLMReference, decode

QUESTION = "Describe the image."
MAX_TOKENS = 8
# A 112x112 image is 16 image tokens, between a vision start and a vision end marker.
IMAGE_PROMPT_TOKENS = 16 + 2


@pytest.fixture(scope="module")
def vlm(tiny_vlm) -> ChatMLX:
    # No prefix cache: every reply is computed from scratch, as mlx-vlm computes it.
    return ChatMLX(
        model=str(tiny_vlm),
        temperature=0,
        max_tokens=MAX_TOKENS,
        engine_options={"cache_memory_mb": 0},
    )


@pytest.fixture(scope="module")
def reference(tiny_vlm) -> MLXVLMReference:
    return MLXVLMReference(tiny_vlm)


@pytest.fixture(scope="module")
def served(test_images):
    files = {p.name: p.read_bytes() for p in test_images}
    with FileServer(files) as server:
        yield server


def ask(image_block: dict, text: str = QUESTION) -> list[HumanMessage]:
    return [HumanMessage(content=[image_block, {"type": "text", "text": text}])]


def test_greedy_reply_is_mlx_vlms_own(vlm, reference, test_images):
    for image in test_images:
        msg = vlm.invoke(ask({"type": "image", "url": str(image)}))
        want = reference.reply(
            [{"type": "image"}, {"type": "text", "text": QUESTION}], [str(image)], MAX_TOKENS
        )
        assert msg.content == decode(vlm.engine.tokenizer, want.tokens)
        assert msg.usage_metadata["input_tokens"] == want.prompt_tokens


def test_parts_reach_the_model_in_the_order_given(vlm, reference, test_images):
    image = str(test_images[0])
    msg = vlm.invoke(
        [
            HumanMessage(
                content=[{"type": "text", "text": QUESTION}, {"type": "image", "url": image}]
            )
        ]
    )
    after = reference.reply([{"type": "text", "text": QUESTION}, {"type": "image"}], [image], 8)
    before = reference.reply([{"type": "image"}, {"type": "text", "text": QUESTION}], [image], 8)
    assert after.tokens != before.tokens  # the order matters to the model...
    assert msg.content == decode(vlm.engine.tokenizer, after.tokens)  # ...and is kept


def test_two_images_give_two_replies(vlm, test_images):
    replies = [vlm.invoke(ask({"type": "image", "url": str(p)})).content for p in test_images]
    assert replies[0] != replies[1]


async def test_streaming_equals_invoke(vlm, test_images):
    messages = ask({"type": "image", "url": str(test_images[1])})
    whole = vlm.invoke(messages)
    chunks = list(vlm.stream(messages))
    assert "".join(c.content for c in chunks) == whole.content
    assert [c.usage_metadata for c in chunks if c.usage_metadata] == [whole.usage_metadata]
    parts = [c.content async for c in vlm.astream(messages)]
    assert "".join(parts) == whole.content
    assert (await vlm.ainvoke(messages)).content == whole.content


def test_usage_counts_the_image_tokens(vlm, test_images):
    text_only = vlm.invoke([HumanMessage(QUESTION)]).usage_metadata["input_tokens"]
    one = vlm.invoke(ask({"type": "image", "url": str(test_images[0])}))
    assert one.usage_metadata["input_tokens"] == text_only + IMAGE_PROMPT_TOKENS
    two = vlm.invoke(
        [
            HumanMessage(
                content=[
                    {"type": "image", "url": str(test_images[0])},
                    {"type": "image", "url": str(test_images[1])},
                    {"type": "text", "text": QUESTION},
                ]
            )
        ]
    )
    assert two.usage_metadata["input_tokens"] == text_only + 2 * IMAGE_PROMPT_TOKENS


def test_every_block_form_is_the_same_image(vlm, test_images, served):
    png = test_images[0]
    b64 = base64.b64encode(png.read_bytes()).decode()
    data_url = f"data:image/png;base64,{b64}"
    forms = {
        "path": {"type": "image", "url": str(png)},
        "file URL": {"type": "image", "url": png.as_uri()},
        "http URL": {"type": "image", "url": served.url(png.name)},
        "base64": {"type": "image", "base64": b64, "mime_type": "image/png"},
        "bytes": {"type": "image", "base64": png.read_bytes(), "mime_type": "image/png"},
        "source_type base64": {
            "type": "image",
            "source_type": "base64",
            "data": b64,
            "mime_type": "image/png",
        },
        "source_type url": {"type": "image", "source_type": "url", "url": served.url(png.name)},
        "image_url data URL": {"type": "image_url", "image_url": {"url": data_url}},
        "image_url http URL": {"type": "image_url", "image_url": {"url": served.url(png.name)}},
        "image_url path": {"type": "image_url", "image_url": {"url": str(png)}},
        "image_url string": {"type": "image_url", "image_url": data_url},
        "input_image": {"type": "input_image", "image_url": data_url},
    }
    want = vlm.invoke(ask(forms["path"])).content
    got = {name: vlm.invoke(ask(block)).content for name, block in forms.items()}
    assert got == dict.fromkeys(forms, want)
    assert served.hits[png.name] == 3  # fetched over HTTP each time it was given by URL
    other = vlm.invoke(ask({"type": "image", "url": served.url(test_images[1].name)})).content
    assert other != want


async def test_raw_base64_of_a_real_size_image(vlm, tmp_path):
    png = tmp_path / "noise.png"
    png.write_bytes(noisy_png(300))
    b64 = base64.b64encode(png.read_bytes()).decode()
    want = (await vlm.ainvoke(ask({"type": "image", "url": str(png)}))).content
    got = await vlm.ainvoke(ask({"type": "image_url", "image_url": {"url": b64}}))
    assert got.content == want
    # A base64 block without mime_type (which LangChain's own invoke refuses to trace)
    # reaches the engine as raw base64.
    by_path, raw = (
        to_neutral_messages(ask(block))
        for block in ({"type": "image", "url": str(png)}, {"type": "image", "base64": b64})
    )
    assert raw[0]["content"][0] == {"type": "image", "image": b64}
    outs = [await vlm.engine.chat(m, max_tokens=MAX_TOKENS, temperature=0) for m in (by_path, raw)]
    assert outs[0].tokens == outs[1].tokens


def test_an_image_in_a_tool_result_reaches_the_model(vlm, test_images):
    def history(result: ToolMessage) -> list:
        return [
            HumanMessage("Take a picture."),
            AIMessage("", tool_calls=[snap_call]),
            result,
        ]

    snap_call = {"id": "1", "name": "snap", "args": {}, "type": "tool_call"}
    replies = [
        vlm.invoke(
            history(ToolMessage(content=[{"type": "image", "url": str(p)}], tool_call_id="1"))
        )
        for p in test_images
    ]
    assert replies[0].content != replies[1].content
    text = vlm.invoke(history(ToolMessage(content="no picture", tool_call_id="1")))
    assert replies[0].usage_metadata["input_tokens"] > text.usage_metadata["input_tokens"]


def test_an_image_to_a_text_model_is_refused_and_it_serves_on(tiny_llama, test_images):
    llm = ChatMLX(model=str(tiny_llama), temperature=0, max_tokens=4)
    before = llm.engine.get_stats()["num_requests_processed"]
    for block in (
        {"type": "image", "url": str(test_images[0])},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    ):
        with pytest.raises(ValueError, match=r"does not take images.*vision-language model"):
            llm.invoke(ask(block))
    assert llm.engine.get_stats()["num_requests_processed"] == before
    assert llm.invoke("Hello").usage_metadata["output_tokens"] >= 1


def test_bad_images_are_refused_and_the_vlm_serves_on(vlm, tmp_path, served, test_images):
    text_file = tmp_path / "notes.txt"
    text_file.write_text("not an image")
    bad = [
        ({"type": "image", "url": str(tmp_path / "missing.png")}, "missing.png"),
        ({"type": "image", "url": str(text_file)}, "not an image"),
        ({"type": "image", "url": served.url("absent.png")}, "404"),
        ({"type": "image", "url": "ftp://127.0.0.1/cat.png"}, "ftp"),
        ({"type": "image", "file_id": "file-123"}, "file id"),
    ]
    for block, match in bad:
        with pytest.raises(ValueError, match=match):
            vlm.invoke(ask(block))
    assert vlm.invoke(ask({"type": "image", "url": str(test_images[0])})).content


@tool
def describe_color(color: Literal["red", "green", "blue", "white"]) -> str:
    """Name the main color of the picture."""
    return color


class Seen(BaseModel):
    """What the picture shows."""

    color: Literal["red", "green", "blue", "white"]
    striped: bool


def test_tool_calling_and_structured_output_with_an_image(vlm, test_images):
    messages = ask({"type": "image", "url": str(test_images[0])}, "Which color is it?")
    call = vlm.bind_tools([describe_color], tool_choice="any").invoke(messages, max_tokens=40)
    assert [c["name"] for c in call.tool_calls] == ["describe_color"]
    assert call.tool_calls[0]["args"]["color"] in ("red", "green", "blue", "white")
    assert call.usage_metadata["input_tokens"] > IMAGE_PROMPT_TOKENS
    seen = vlm.with_structured_output(Seen).invoke(messages, max_tokens=40)
    assert isinstance(seen, Seen)


def test_video_reply_is_mlx_vlms_own(vlm, reference, tmp_path):
    red = make_test_video(tmp_path / "red.mp4", "red")
    green = make_test_video(tmp_path / "green.mp4", "green")
    b64 = base64.b64encode(red.read_bytes()).decode()
    forms = [
        {"type": "video", "url": str(red)},
        {"type": "video", "base64": b64, "mime_type": "video/mp4"},
        {"type": "video_url", "video_url": {"url": red.as_uri()}},
    ]
    replies = [vlm.invoke(ask(block, "What happens?")) for block in forms]
    want = reference.reply_to_video("What happens?", str(red), MAX_TOKENS)
    assert [r.content for r in replies] == [decode(vlm.engine.tokenizer, want.tokens)] * 3
    assert replies[0].usage_metadata["input_tokens"] == want.prompt_tokens
    other = vlm.invoke(ask({"type": "video", "url": str(green)}, "What happens?"))
    assert other.content != replies[0].content


def test_any_text_engine_gets_the_adapters_refusal(test_images):
    """An engine of another project with ``is_mllm`` False never sees the image."""
    from llama_index.core.base.llms.types import ChatMessage, ImageBlock, TextBlock

    from mlx_integrations.llama_index import MLXLLM

    class Counting(ScriptedEngine):
        calls = 0

        async def stream_chat(self, messages, **kw):
            Counting.calls += 1
            async for out in super().stream_chat(messages, **kw):
                yield out

    engine = Counting("It is a cat")
    lc = ChatMLX(engine=engine)
    with pytest.raises(ValueError, match=r"'scripted' does not take images"):
        lc.invoke(ask({"type": "image", "url": str(test_images[0])}))
    li = MLXLLM(engine=engine)
    image = ChatMessage(role="user", blocks=[ImageBlock(path=test_images[0]), TextBlock(text="?")])
    with pytest.raises(ValueError, match=r"'scripted' does not take images"):
        li.chat([image])
    assert Counting.calls == 0 and li.metadata.is_multimodal is False
    assert lc.invoke("hi").content == "It is a cat"


def test_a_follow_up_about_the_image_reads_the_first_turn_from_cache(tiny_vlm, test_images):
    llm = ChatMLX(model=str(tiny_vlm), temperature=0, max_tokens=MAX_TOKENS)  # caching engine
    first = ask({"type": "image", "url": str(test_images[0])})
    answer = llm.invoke(first)
    follow_up = [*first, answer, HumanMessage("And the colors?")]
    again = llm.invoke(follow_up)
    cold = ChatMLX(
        model=str(tiny_vlm),
        temperature=0,
        max_tokens=MAX_TOKENS,
        engine_options={"cache_memory_mb": 0},
    ).invoke(follow_up)
    assert again.usage_metadata["input_token_details"]["cache_read"] > IMAGE_PROMPT_TOKENS
    assert again.content == cold.content
    assert again.usage_metadata["input_tokens"] == cold.usage_metadata["input_tokens"]
