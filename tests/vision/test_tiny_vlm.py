"""The tiny VLM fixture is a real mlx-vlm model: it loads and sees its images."""

from __future__ import annotations

from pathlib import Path


def test_mlx_vlm_loads_the_tiny_vlm_and_two_images_differ(
    tiny_vlm: Path, test_images: tuple[Path, Path]
) -> None:
    from mlx_vlm import apply_chat_template, generate, load

    model, processor = load(str(tiny_vlm))
    prompt = apply_chat_template(processor, model.config, "Describe the image.", num_images=1)
    outs = [
        generate(model, processor, prompt, image=[str(img)], max_tokens=8, temperature=0.0)
        for img in test_images
    ]
    assert outs[0].prompt_tokens == outs[1].prompt_tokens > 16  # 16 image tokens each
    assert outs[0].text != outs[1].text
