"""LlamaIndex ImageBlock and VideoBlock, from a path, a URL or bytes, as neutral parts."""

from __future__ import annotations

import base64
import io

import pytest
from llama_index.core.base.llms.types import (
    AudioBlock,
    ChatMessage,
    DocumentBlock,
    ImageBlock,
    TextBlock,
    VideoBlock,
)

from mlx_integrations.llama_index.messages import to_neutral_messages


def one_part(block) -> dict:
    [message] = to_neutral_messages([ChatMessage(role="user", blocks=[block])])
    [part] = message["content"]
    return part


def test_image_from_a_path_a_url_or_bytes(test_images):
    png = test_images[0]
    data = png.read_bytes()
    data_url = "data:image/png;base64," + base64.b64encode(data).decode()
    assert one_part(ImageBlock(path=png)) == {"type": "image", "image": str(png)}
    assert one_part(ImageBlock(url="http://127.0.0.1:9/a.png")) == {
        "type": "image",
        "image": "http://127.0.0.1:9/a.png",
    }
    assert one_part(ImageBlock(url=png.as_uri()))["image"] == png.as_uri()
    assert one_part(ImageBlock(url=data_url))["image"] == data_url
    assert one_part(ImageBlock(image=data))["image"] == data_url  # bytes: type guessed
    assert one_part(ImageBlock(image=base64.b64encode(data)))["image"] == data_url
    assert one_part(ImageBlock(image=io.BytesIO(data), image_mimetype="image/png")) == {
        "type": "image",
        "image": data_url,
    }


def test_video_from_a_path_or_bytes(tmp_path):
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(16))
    assert one_part(VideoBlock(path=clip)) == {"type": "video", "video": str(clip)}
    part = one_part(VideoBlock(video=clip.read_bytes(), video_mimetype="video/mp4"))
    assert part["video"] == "data:video/mp4;base64," + base64.b64encode(clip.read_bytes()).decode()


def test_blocks_keep_the_order_given(test_images):
    stripes, checker = test_images
    message = ChatMessage(
        role="user",
        blocks=[
            TextBlock(text="First"),
            ImageBlock(path=stripes),
            TextBlock(text="then"),
            ImageBlock(path=checker),
        ],
    )
    assert to_neutral_messages([message])[0]["content"] == [
        {"type": "text", "text": "First"},
        {"type": "image", "image": str(stripes)},
        {"type": "text", "text": "then"},
        {"type": "image", "image": str(checker)},
    ]


@pytest.mark.parametrize(
    ("block", "match"),
    [
        (ImageBlock.model_construct(image=None, path=None, url=None), "no data, path or url"),
        (ImageBlock(image=b"%PDF-1.4 fake"), "application/pdf"),
        (AudioBlock(audio=b"RIFF0000WAVE"), "AudioBlock"),
        (DocumentBlock(data=b"%PDF-1.4 fake"), "DocumentBlock"),
    ],
)
def test_bad_blocks_are_refused_with_the_fix(block, match):
    with pytest.raises(ValueError, match=match) as info:
        to_neutral_messages([ChatMessage(role="user", blocks=[TextBlock(text="x"), block])])
    assert "messages[0]" in str(info.value)


class Zeros(io.RawIOBase):
    """An endless stream of zero bytes that counts what was read from it."""

    def __init__(self, fail_after: int = 64 << 20) -> None:
        self.served = 0
        self.fail_after = fail_after

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.served > self.fail_after:
            raise AssertionError(f"read {self.served} bytes of an endless stream")
        buffer[:] = bytes(len(buffer))
        self.served += len(buffer)
        return len(buffer)


def test_a_stream_is_read_to_the_limit_only() -> None:
    stream = Zeros()
    message = ChatMessage(role="user", blocks=[ImageBlock(image=stream)])
    with pytest.raises(ValueError, match=r"stream of more than 0\.000954 MiB.*max_media_mb"):
        to_neutral_messages([message], max_media_bytes=1000)
    assert stream.served <= 1001
    small = ImageBlock(image=io.BytesIO(b"GIF89a" + bytes(10)), image_mimetype="image/gif")
    assert one_part(small)["image"].startswith("data:image/gif;base64,")
