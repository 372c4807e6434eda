"""Images over HTTP (a tiny vision model), and the server's media policy: no local files
but under an allowed folder, no loopback or private URLs unless allowed."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from mlx_integrations.serve.config import ModelConfig, ServeConfig
from mlx_integrations.serve.server import BackgroundServer
from tests.support.file_server import FileServer
from tests.support.tiny_vlm import make_test_image


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("served-images")
    make_test_image(folder / "stripes.png", "stripes")
    make_test_image(folder.parent / "private.png", "checker")
    return folder


def _server(tiny_vlm: Path, tiny_llama: Path, **settings) -> BackgroundServer:
    config = ServeConfig(
        models=[
            ModelConfig("vlm", source=str(tiny_vlm), preload=True),
            ModelConfig("text", source=str(tiny_llama)),
        ],
        **settings,
    )
    server = BackgroundServer(config)
    server.start()
    return server


@pytest.fixture(scope="module")
def strict(tiny_vlm: Path, tiny_llama: Path) -> Iterator[openai.OpenAI]:
    server = _server(tiny_vlm, tiny_llama)
    yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    server.stop()


def _ask(client: openai.OpenAI, url: str, model: str = "vlm"):
    return client.chat.completions.create(
        model=model,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": "What is in the picture?"},
                ],
            }
        ],
        max_tokens=4,
        temperature=0,
    )


def _data_url(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def test_an_image_as_a_data_url_is_seen(strict: openai.OpenAI, images: Path):
    plain = strict.chat.completions.create(
        model="vlm",
        messages=[{"role": "user", "content": "What is in the picture?"}],
        max_tokens=4,
        temperature=0,
    )
    reply = _ask(strict, _data_url(images / "stripes.png"))
    # The image's tokens are in the prompt.
    assert reply.usage.prompt_tokens > plain.usage.prompt_tokens + 4  # type: ignore[union-attr]


def test_local_files_are_refused_by_default(strict: openai.OpenAI, images: Path):
    for source in (str(images / "stripes.png"), f"file://{images / 'stripes.png'}"):
        with pytest.raises(openai.BadRequestError) as caught:
            _ask(strict, source)
        assert "refused" in caught.value.message
        assert caught.value.body["param"] == "messages"  # type: ignore[index]


def test_loopback_urls_are_refused_by_default(strict: openai.OpenAI, images: Path):
    with FileServer({"cat.png": (images / "stripes.png").read_bytes()}) as files:
        with pytest.raises(openai.BadRequestError) as caught:
            _ask(strict, files.url("cat.png"))
        assert "loopback, private" in caught.value.message
        assert files.hits == {}


def test_a_text_model_refuses_images(strict: openai.OpenAI, images: Path):
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(strict, _data_url(images / "stripes.png"), model="text")
    assert "text-only" in caught.value.message


def test_an_allowed_folder_and_private_urls_when_allowed(
    tiny_vlm: Path, tiny_llama: Path, images: Path
):
    server = _server(
        tiny_vlm, tiny_llama, allowed_local_media_path=str(images), allow_private_media_urls=True
    )
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        assert _ask(client, str(images / "stripes.png")).choices
        with pytest.raises(openai.BadRequestError) as caught:
            _ask(client, str(images.parent / "private.png"))  # outside the folder
        assert "not under the allowed folder" in caught.value.message
        link = images / "link.png"
        link.symlink_to(images.parent / "private.png")
        with pytest.raises(openai.BadRequestError):
            _ask(client, str(link))  # inside by name only
        with FileServer({"cat.png": (images / "stripes.png").read_bytes()}) as files:
            assert _ask(client, files.url("cat.png")).choices
            assert files.hits == {"cat.png": 1}
        messages = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
        data = base64.b64encode((images / "stripes.png").read_bytes()).decode()
        reply = messages.messages.create(
            model="vlm",
            max_tokens=3,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": data},
                        },
                        {"type": "text", "text": "Describe it."},
                    ],
                }
            ],
        )
        assert reply.usage.input_tokens > 10
    finally:
        server.stop()


def test_allowed_media_domains_admit_only_their_hosts(
    tiny_vlm: Path, tiny_llama: Path, images: Path
):
    """--allowed-media-domains: a URL on a listed host is fetched, one on any other host
    is a 400 naming the host, before any connection; the list does not open private
    addresses by itself."""
    picture = {"cat.png": (images / "stripes.png").read_bytes()}
    server = _server(
        tiny_vlm, tiny_llama, allowed_media_domains=["127.0.0.1"], allow_private_media_urls=True
    )
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        with FileServer(picture) as files:
            assert _ask(client, files.url("cat.png")).choices
            other = files.url("cat.png").replace("127.0.0.1", "localhost")
            with pytest.raises(openai.BadRequestError) as caught:
                _ask(client, other)
            assert "'localhost' is not among the allowed media domains" in caught.value.message
            assert files.hits == {"cat.png": 1}  # the refused URL was never fetched
    finally:
        server.stop()
    server = _server(tiny_vlm, tiny_llama, allowed_media_domains=["127.0.0.1"])
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        with FileServer(picture) as files:
            with pytest.raises(openai.BadRequestError) as caught:
                _ask(client, files.url("cat.png"))
            assert "loopback, private" in caught.value.message
            assert files.hits == {}
    finally:
        server.stop()
