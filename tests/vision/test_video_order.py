"""A video keeps its place in a message, as an image does: the prompt and the greedy reply
equal mlx-vlm's for the message as given, video after the text or before it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from mlx_integrations.engine import SimpleEngine
from tests.support.tiny_vlm import make_test_video

QUESTION = "Describe the video."
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def video(tmp_path_factory) -> Path:
    return make_test_video(tmp_path_factory.mktemp("video") / "red.mp4", "red")


@pytest.fixture(scope="module")
def engine(tiny_vlm: Path):
    eng = SimpleEngine(tiny_vlm)
    yield eng
    asyncio.run(eng.stop())


@pytest.fixture(scope="module")
def reference(tiny_vlm: Path) -> Any:
    from mlx_vlm import load

    return load(str(tiny_vlm))


def mlx_vlm_prompt(reference: Any, video: Path, video_first: bool) -> str:
    """mlx-vlm's own prompt for one user message, its parts built by mlx-vlm's
    ``MessageBuilder`` and rendered by ``get_chat_template`` in the order given."""
    from mlx_vlm.prompt_utils import MessageBuilder, get_chat_template

    _model, processor = reference
    parts = [MessageBuilder.text_message(QUESTION), MessageBuilder.video_message(str(video))]
    message = {"role": "user", "content": parts[::-1] if video_first else parts}
    return str(get_chat_template(processor, [message], True))


def mlx_vlm_tokens(reference: Any, prompt: str, video: Path) -> list[int]:
    from mlx_vlm import stream_generate

    model, processor = reference
    results = stream_generate(
        model, processor, prompt, video=[str(video)], max_tokens=MAX_TOKENS, temperature=0.0
    )
    return [r.token for r in results if r.finish_reason is None]


@pytest.mark.parametrize("video_first", [False, True], ids=["text-video", "video-text"])
async def test_video_order_and_tokens_equal_mlx_vlm(engine, reference, video, video_first):
    from mlx_vlm import apply_chat_template

    parts = [{"type": "text", "text": QUESTION}, {"type": "video", "video": str(video)}]
    messages = [{"role": "user", "content": parts[::-1] if video_first else parts}]
    want = mlx_vlm_prompt(reference, video, video_first)
    ours = engine.render_prompt(messages)
    assert ours == want
    question, vision = ours.index(QUESTION), ours.index("<|vision_start|><|video_pad|>")
    assert (vision < question) is video_first
    if video_first:  # mlx-vlm's own chat formatting puts the video first, as given here
        model, processor = reference
        shortcut = apply_chat_template(processor, model.config, QUESTION, video=[str(video)])
        assert ours == shortcut
    out = await engine.chat(messages, max_tokens=MAX_TOKENS, temperature=0)
    expected = mlx_vlm_tokens(reference, want, video)
    assert out.tokens[: len(expected)] == expected and expected


async def test_videos_and_images_keep_their_places_together(engine, video, test_images):
    image = str(test_images[0])
    parts = [
        {"type": "image", "image": image},
        {"type": "text", "text": "First this."},
        {"type": "video", "video": str(video)},
        {"type": "text", "text": "Then that."},
    ]
    prompt = engine.render_prompt([{"role": "user", "content": parts}])
    marks = [
        prompt.index("<|image_pad|>"),
        prompt.index("First this."),
        prompt.index("<|video_pad|>"),
        prompt.index("Then that."),
    ]
    assert marks == sorted(marks)
