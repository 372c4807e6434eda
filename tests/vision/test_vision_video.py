"""Videos through mlx-vlm (read with OpenCV, sampled by the Qwen video processor)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mlx_integrations.engine import SimpleEngine
from tests.support.tiny_vlm import make_test_video

QUESTION = "Describe the video."


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("videos")
    return make_test_video(folder / "red.mp4", "red"), make_test_video(
        folder / "green.mp4", "green"
    )


@pytest.fixture(scope="module")
def engine(tiny_vlm: Path):
    eng = SimpleEngine(tiny_vlm)
    yield eng
    asyncio.run(eng.stop())


def _user(video: Path | str) -> list[dict]:
    parts = [{"type": "video", "video": str(video)}, {"type": "text", "text": QUESTION}]
    return [{"role": "user", "content": parts}]


async def test_video_tokens_equal_mlx_vlm_and_two_videos_differ(tiny_vlm, engine, videos):
    from mlx_vlm import apply_chat_template, load, stream_generate

    model, processor = load(str(tiny_vlm))
    prompt = apply_chat_template(processor, model.config, QUESTION, video=[str(videos[0])])
    ours = []
    for video in videos:
        results = list(
            stream_generate(
                model, processor, prompt, video=[str(video)], max_tokens=6, temperature=0.0
            )
        )
        want = [r.token for r in results if r.finish_reason is None]
        out = await engine.chat(_user(video), max_tokens=6, temperature=0)
        assert out.tokens[: len(want)] == want
        assert out.prompt_tokens == results[-1].prompt_tokens
        ours.append(out.tokens)
    assert ours[0] != ours[1]


async def test_videos_argument(engine, videos):
    inline = await engine.chat(_user(videos[1]), max_tokens=4, temperature=0)
    given = await engine.chat(
        [{"role": "user", "content": QUESTION}],
        videos=[str(videos[1])],
        max_tokens=4,
        temperature=0,
    )
    assert given.tokens == inline.tokens


async def test_a_file_that_is_not_a_video(engine, videos, tmp_path):
    bad = tmp_path / "clip.mp4"
    bad.write_text("no frames here\n" * 20)
    failed = engine.get_stats()["num_requests_failed"]
    with pytest.raises(ValueError, match="is not a video OpenCV can read"):
        await engine.chat(_user(bad), max_tokens=2)
    with pytest.raises(ValueError, match="there is no file"):
        await engine.chat(_user(tmp_path / "none.mp4"), max_tokens=2)
    assert engine.get_stats()["num_requests_failed"] == failed
    assert (await engine.chat(_user(videos[0]), max_tokens=2)).finished


async def test_a_downloaded_video_leaves_no_temp_file(engine, videos, tmp_path, monkeypatch):
    import base64
    import gc
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    data = base64.b64encode(videos[0].read_bytes()).decode()
    out = await engine.chat(_user(f"data:video/mp4;base64,{data}"), max_tokens=2, temperature=0)
    inline = await engine.chat(_user(videos[0]), max_tokens=2, temperature=0)
    assert out.tokens == inline.tokens
    gc.collect()
    assert not list(tmp_path.glob("mlxi-video-*"))


async def test_a_video_that_cannot_be_saved_leaves_no_temp_file(
    engine, videos, tmp_path, monkeypatch
):
    import base64
    import os
    import tempfile

    real_mkstemp = tempfile.mkstemp

    def read_only_mkstemp(*args, **kwargs):  # every write to the temp file fails
        fd, name = real_mkstemp(*args, **kwargs)
        os.close(fd)
        return os.open(name, os.O_RDONLY), name

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(tempfile, "mkstemp", read_only_mkstemp)
    data = base64.b64encode(videos[0].read_bytes()).decode()
    with pytest.raises(ValueError, match=r"could not be saved for OpenCV .* TMPDIR"):
        await engine.chat(_user(f"data:video/mp4;base64,{data}"), max_tokens=2)
    assert not list(tmp_path.glob("mlxi-video-*"))
    monkeypatch.undo()
    assert (await engine.chat(_user(videos[0]), max_tokens=2)).finished
