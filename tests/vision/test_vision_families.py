"""A second mlx-vlm family, Qwen2-VL, whose prompt formatting differs from Qwen2.5-VL's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mlx_integrations.engine import SimpleEngine
from tests.support.tiny_vlm import build_tiny_vlm

IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def qwen2_vl(tmp_path_factory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("qwen2-vl"), arch="qwen2_vl")


@pytest.fixture(scope="module")
def engine(qwen2_vl: Path):
    eng = SimpleEngine(qwen2_vl)
    yield eng
    asyncio.run(eng.stop())


async def test_greedy_tokens_equal_mlx_vlm_and_images_differ(qwen2_vl, engine, test_images):
    from mlx_vlm import apply_chat_template, load, stream_generate

    model, processor = load(str(qwen2_vl))
    template = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}]
    prompt = apply_chat_template(processor, model.config, template)
    got = []
    for image in test_images:
        want = [
            r.token
            for r in stream_generate(
                model, processor, prompt, image=[str(image)], max_tokens=6, temperature=0.0
            )
            if r.finish_reason is None
        ]
        parts = [{"type": "image", "image": str(image)}, {"type": "text", "text": "What?"}]
        out = await engine.chat([{"role": "user", "content": parts}], max_tokens=6, temperature=0)
        assert out.tokens[: len(want)] == want
        got.append(out.tokens)
    assert got[0] != got[1]


def test_the_order_given_is_kept(engine, test_images) -> None:
    image = {"type": "image", "image": str(test_images[0])}
    text = {"type": "text", "text": "What?"}
    before = engine.render_prompt([{"role": "user", "content": [image, text]}])
    after = engine.render_prompt([{"role": "user", "content": [text, image]}])
    assert f"{IMAGE}What?" in before.replace(" ", "")
    assert f"What?{IMAGE}" in after.replace(" ", "")
