"""``mlxi`` with a vision-language model: pull keeps the processor files, show says
"vision", quantize goes through mlx-vlm, ``run --image`` answers about the image."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from mlx_integrations.cli.main import app
from typer.testing import CliRunner

from mlx_integrations.engine import SimpleEngine
from tests.cli.conftest import store_with
from tests.support.fake_hub import FakeHub

PROCESSOR_FILES = {
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
    "chat_template.json",
    "tokenizer.json",
    "tokenizer_config.json",
}


@pytest.fixture(scope="module")
def hub():
    with FakeHub() as server:
        yield server


def mlxi(*args: str):
    return CliRunner().invoke(app, list(args))


def engine_reply(model: Path, image: Path, question: str, max_tokens: int) -> str:
    async def ask() -> str:
        engine = SimpleEngine(model)
        parts = [{"type": "image", "image": str(image)}, {"type": "text", "text": question}]
        try:
            out = await engine.chat(
                [{"role": "user", "content": parts}], max_tokens=max_tokens, temperature=0
            )
        finally:
            await engine.stop()
        return out.text

    return asyncio.run(ask())


def test_pull_keeps_the_processor_files_and_show_says_vision(hub, env, tiny_vlm):
    hub.add_repo("org/tiny-vl", tiny_vlm)
    pulled = mlxi("pull", "org/tiny-vl", "--json")
    assert pulled.exit_code == 0, pulled.stderr
    shown = mlxi("show", "org/tiny-vl", "--json")
    info = json.loads(shown.stdout)
    assert info["vision"] is True and info["architecture"] == "qwen2_5_vl"
    assert {f["path"] for f in info["files"]} >= PROCESSOR_FILES | {"model.safetensors"}
    text = mlxi("show", "org/tiny-vl")
    assert "text and images (vision)" in text.stdout


def test_show_a_text_model_says_text(home):
    shown = mlxi("show", "tiny")
    assert shown.exit_code == 0
    line = next(li for li in shown.stdout.splitlines() if li.startswith("input"))
    assert line.split()[-1] == "text"


def test_run_image_answers_as_the_engine_does(tmp_path, monkeypatch, tiny_vlm, test_images):
    store_with(tmp_path, monkeypatch, tiny_vlm, "tiny-vl")
    answers = []
    for image in test_images:
        result = mlxi("run", "tiny-vl", "--image", str(image), "Describe it.", "-t", "0", "-m", "6")
        assert result.exit_code == 0, result.stderr
        answers.append(result.stdout)
        assert result.stdout.rstrip("\n") == engine_reply(tiny_vlm, image, "Describe it.", 6)
    assert answers[0] != answers[1]


def test_run_image_errors(home, tmp_path, test_images):
    missing = mlxi("run", "tiny", "--image", str(tmp_path / "nope.png"), "What is it?")
    assert missing.exit_code == 2 and "there is no file" in missing.stderr
    text_model = mlxi("run", "tiny", "--image", str(test_images[0]), "What is it?", "-m", "2")
    assert text_model.exit_code == 2  # a usage error, as other bad input
    assert "text-only model" in text_model.stderr and "Qwen2.5-VL" in text_model.stderr


def test_quantize_a_vlm_through_mlx_vlm(tmp_path, monkeypatch, tiny_vlm, test_images):
    store_with(tmp_path, monkeypatch, tiny_vlm, "tiny-vl")
    result = mlxi("quantize", "tiny-vl", "--bits", "8", "--json")
    assert result.exit_code == 0, result.stderr
    name = json.loads(result.stdout)["name"]
    info = json.loads(mlxi("show", name, "--json").stdout)
    assert info["vision"] is True and info["quantization"]["bits"] == 8
    assert {f["path"] for f in info["files"]} >= {"preprocessor_config.json", "chat_template.json"}
    weights = json.loads(Path(info["path"], "config.json").read_text())
    assert weights["quantization"]["bits"] == 8
    # The vision tower stays unquantized; the language model is quantized; it still sees.
    replies = [engine_reply(Path(info["path"]), image, "Describe it.", 6) for image in test_images]
    assert replies[0] != replies[1]


def test_a_session_gives_the_images_with_the_first_question(
    tmp_path, monkeypatch, tiny_vlm, test_images
):
    import re

    from tests.cli.test_run import Terminal

    store_with(tmp_path, monkeypatch, tiny_vlm, "tiny-vl")
    args = ["run", "tiny-vl", "--image", str(test_images[0]), "-t", "0", "-m", "3", "-v"]
    with Terminal(args) as term:
        term.read_until(">>> ")
        term.send("Hi")
        first = term.read_until(" prompt tokens")
        term.read_until(">>> ", start=first.index(" prompt tokens"))
        mark = len(term.seen)
        term.send("Hi")
        second = term.read_until(" prompt tokens", start=mark)
        term.send("/bye")
        assert term.close() == 0
    counts = [int(n) for n in re.findall(r"\[(\d+) prompt tokens", second)]
    # The image goes with the first question only, as in this conversation on the engine.
    parts = [{"type": "image", "image": str(test_images[0])}, {"type": "text", "text": "Hi"}]
    turns = [{"role": "user", "content": parts}]

    async def expected() -> list[int]:
        engine = SimpleEngine(tiny_vlm)
        try:
            one = await engine.chat(turns, max_tokens=3, temperature=0)
            again = [*turns, {"role": "assistant", "content": one.text}]
            two = await engine.chat(
                [*again, {"role": "user", "content": "Hi"}], max_tokens=3, temperature=0
            )
        finally:
            await engine.stop()
        return [one.prompt_tokens, two.prompt_tokens]

    assert counts == asyncio.run(expected())


def test_pull_quantize_a_vlm(hub, env, tiny_vlm, test_images):
    hub.add_repo("org/tiny-vl-q", tiny_vlm)
    result = mlxi("pull", "org/tiny-vl-q", "--quantize", "8", "--json")
    assert result.exit_code == 0, result.stderr
    quantized = json.loads(result.stdout)["quantized"]
    assert quantized["name"] == "org/tiny-vl-q-q8"
    info = json.loads(mlxi("show", quantized["name"], "--json").stdout)
    assert info["vision"] is True and info["quantization"]["bits"] == 8
    replies = [engine_reply(Path(info["path"]), image, "Describe it.", 6) for image in test_images]
    assert replies[0] != replies[1]


def test_warm_refuses_a_vlm(tmp_path, monkeypatch, tiny_vlm):
    store_with(tmp_path, monkeypatch, tiny_vlm, "tiny-vl")
    result = mlxi("warm", "tiny-vl", "--system", "You describe images.")
    assert result.exit_code == 1
    assert "vision-language model; warm caches are for text models" in result.stderr
