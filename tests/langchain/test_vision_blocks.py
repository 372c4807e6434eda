"""LangChain image and video blocks, in every documented form, as neutral parts."""

from __future__ import annotations

import base64

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from mlx_integrations.chat.media_parts import reject_media_for_text_model
from mlx_integrations.langchain.messages import to_neutral_messages

B64 = base64.b64encode(b"\x89PNG\r\n\x1a\nnot really").decode()
DATA_URL = f"data:image/png;base64,{B64}"
HTTP = "http://127.0.0.1:8000/cat.png"

IMAGE_FORMS = [
    ({"type": "image_url", "image_url": {"url": DATA_URL}}, DATA_URL),
    ({"type": "image_url", "image_url": {"url": HTTP, "detail": "low"}}, HTTP),
    ({"type": "image_url", "image_url": {"url": "/tmp/cat.png"}}, "/tmp/cat.png"),
    ({"type": "image_url", "image_url": HTTP}, HTTP),
    ({"type": "image", "base64": B64, "mime_type": "image/png"}, DATA_URL),
    ({"type": "image", "base64": B64}, B64),  # the engine reads the format from the data
    ({"type": "image", "url": HTTP}, HTTP),
    ({"type": "image", "url": "file:///tmp/cat.png"}, "file:///tmp/cat.png"),
    ({"type": "image", "source_type": "base64", "data": B64, "mime_type": "image/png"}, DATA_URL),
    ({"type": "image", "source_type": "url", "url": HTTP}, HTTP),
    ({"type": "input_image", "image_url": DATA_URL}, DATA_URL),
    (  # Anthropic's form
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}},
        DATA_URL,
    ),
    ({"type": "image", "source": {"type": "url", "url": HTTP}}, HTTP),
]


@pytest.mark.parametrize(("block", "source"), IMAGE_FORMS)
def test_each_image_form_becomes_an_image_part(block, source):
    [message] = to_neutral_messages([HumanMessage(content=[{"type": "text", "text": "Hi"}, block])])
    assert message["content"] == [
        {"type": "text", "text": "Hi"},
        {"type": "image", "image": source},
    ]


VIDEO_FORMS = [
    ({"type": "video", "url": "/tmp/clip.mp4"}, "/tmp/clip.mp4"),
    (
        {"type": "video", "base64": B64, "mime_type": "video/mp4"},
        f"data:video/mp4;base64,{B64}",
    ),
    (
        {"type": "video", "source_type": "base64", "data": B64, "mime_type": "video/mp4"},
        f"data:video/mp4;base64,{B64}",
    ),
    ({"type": "video_url", "video_url": {"url": HTTP}}, HTTP),
]


@pytest.mark.parametrize(("block", "source"), VIDEO_FORMS)
def test_each_video_form_becomes_a_video_part(block, source):
    [message] = to_neutral_messages([HumanMessage(content=[block])])
    assert message["content"] == [{"type": "video", "video": source}]


def test_parts_keep_the_order_given():
    content = [
        {"type": "image", "url": "a.png"},
        {"type": "text", "text": "between"},
        {"type": "image", "url": "b.png"},
        "after",
    ]
    [message] = to_neutral_messages([HumanMessage(content=content)])
    assert message["content"] == [
        {"type": "image", "image": "a.png"},
        {"type": "text", "text": "between"},
        {"type": "image", "image": "b.png"},
        {"type": "text", "text": "after"},
    ]


def test_content_blocks_v1_messages_convert_the_same():
    message = HumanMessage(
        content_blocks=[
            {"type": "text", "text": "Look"},
            {"type": "image", "base64": B64, "mime_type": "image/png"},
        ]
    )
    assert to_neutral_messages([message])[0]["content"][1] == {"type": "image", "image": DATA_URL}


def test_tool_results_keep_their_images_and_plain_results_stay_text():
    call = AIMessage("", tool_calls=[{"id": "1", "name": "snap", "args": {}}])
    with_image = ToolMessage(
        content=[{"type": "text", "text": "here"}, {"type": "image", "url": "a.png"}],
        tool_call_id="1",
    )
    plain = ToolMessage(content=[{"type": "text", "text": "done"}], tool_call_id="1")
    failed = ToolMessage(
        content=[{"type": "image", "url": "a.png"}], tool_call_id="1", status="error"
    )
    out = to_neutral_messages([HumanMessage("go"), call, with_image, plain, failed])
    assert out[2]["content"] == [
        {"type": "text", "text": "here"},
        {"type": "image", "image": "a.png"},
    ]
    assert out[3]["content"] == "done"
    assert out[4]["content"][0] == {"type": "text", "text": "Error: "}


BAD = [
    ({"type": "image", "file_id": "file-abc"}, ValueError, "provider file id 'file-abc'"),
    ({"type": "image", "source_type": "id", "id": "file-abc"}, ValueError, "file id"),
    ({"type": "input_image", "file_id": "file-abc"}, ValueError, "file id"),
    ({"type": "image", "source": {"type": "file", "file_id": "f-1"}}, ValueError, "'f-1'"),
    ({"type": "image", "mime_type": "image/png"}, ValueError, "neither 'base64' nor 'url'"),
    ({"type": "image", "base64": B64, "mime_type": "application/pdf"}, ValueError, "image/"),
    ({"type": "image", "source_type": "text", "text": "x"}, ValueError, "source_type 'text'"),
    ({"type": "image", "url": ""}, ValueError, "empty image source"),
    ({"type": "image_url", "image_url": {"url": 42}}, TypeError, "image as int"),
    ({"type": "image_url"}, TypeError, "image as NoneType"),
    ({"type": "image", "base64": ""}, ValueError, "empty image data"),
    ({"type": "audio", "base64": B64, "mime_type": "audio/wav"}, ValueError, "not audio"),
    ({"type": "file", "base64": B64, "mime_type": "application/pdf"}, ValueError, "not files"),
]


@pytest.mark.parametrize(("block", "exc", "match"), BAD)
def test_bad_media_blocks_name_the_block_and_the_fix(block, exc, match):
    with pytest.raises(exc, match=match) as info:
        to_neutral_messages([SystemMessage("s"), HumanMessage(content=[block])])
    assert "messages[1]" in str(info.value) and "content[0]" in str(info.value)


def test_text_model_check_names_the_model_and_the_message():
    messages = to_neutral_messages(
        [HumanMessage("hi"), HumanMessage(content=[{"type": "video", "url": "clip.mp4"}])]
    )
    reject_media_for_text_model(messages, "vlm", is_mllm=True)  # a vision model takes it
    with pytest.raises(ValueError, match=r"'tiny' does not take video.*messages\[1\]"):
        reject_media_for_text_model(messages, "tiny", is_mllm=False)
