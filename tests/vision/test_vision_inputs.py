"""Bad images and videos get a clear error naming the problem; the engine serves on."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlx_integrations.engine import SimpleEngine
from mlx_integrations.engine.vision.media import MediaError, decode_image, describe
from tests.support.file_server import SlowHeadersServer
from tests.support.tiny_vlm import huge_png, noisy_png

QUESTION = "Describe the image."


def _user(*sources: str, text: str = QUESTION) -> list[dict]:
    parts = [{"type": "image", "image": s} for s in sources]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def engine(tiny_vlm: Path):
    eng = SimpleEngine(tiny_vlm, max_images=2, max_media_mb=0.05)
    yield eng
    asyncio.run(eng.stop())


@pytest.fixture(scope="module")
def server(test_images: tuple[Path, Path], tmp_path_factory) -> Iterator[str]:
    """A loopback HTTP server: /stripes.png, /big.png (over the 50 KiB limit), 404s."""
    folder = tmp_path_factory.mktemp("served")
    (folder / "stripes.png").write_bytes(test_images[0].read_bytes())
    (folder / "big.png").write_bytes(b"\x89PNG" + bytes(200_000))

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, *args) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, test_images) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bad")
    text = folder / "notes.png"
    text.write_text("these are not pixels\n" * 10)
    truncated = folder / "truncated.png"
    truncated.write_bytes(test_images[0].read_bytes()[:300])
    huge = folder / "huge.png"  # 8 KiB on disk, 64 million pixels (below Pillow's own cap)
    huge.write_bytes(huge_png(8000, 8000))
    return {"text": text, "truncated": truncated, "huge": huge}


async def _serves(engine: SimpleEngine, image: Path) -> None:
    out = await engine.chat(_user(str(image)), max_tokens=2, temperature=0)
    assert out.finished and out.prompt_tokens > 16


def _cases(bad_files: dict[str, Path], server: str, image: Path) -> list[tuple[dict, str]]:
    return [
        (dict(messages=_user("/no/such/cat.png")), "there is no file '/no/such/cat.png'"),
        (dict(messages=_user("file:///no/such/cat.png")), "there is no file '/no/such/cat.png'"),
        (dict(messages=_user(str(bad_files["text"]))), "is not an image"),
        (dict(messages=_user(str(bad_files["truncated"]))), "damaged or truncated image"),
        (
            dict(messages=_user(str(bad_files["huge"]))),
            r"huge\.png' is 8000x8000 pixels \(64\.0 million\), more than the limit of "
            r"50\.0 million; .* max_image_pixels",
        ),
        (dict(messages=_user("ftp://example.com/cat.png")), "unsupported URL scheme 'ftp'"),
        (dict(messages=_user(f"{server}/big.png")), "more than the download limit"),
        (dict(messages=_user(f"{server}/missing.png")), "HTTP 404"),
        (dict(messages=_user("data:image/png;base64,AAAA")), "is not an image"),
        (dict(messages=_user(*[str(image)] * 3)), "holds 3 images and videos, more than"),
        (dict(messages=_user(str(image)), images=[str(image)] * 2), "holds 3 images"),
        (
            dict(messages=[{"role": "assistant", "content": [{"type": "image", "image": "x"}]}]),
            "go in user messages",
        ),
        (dict(messages=_user(str(image)), images=str(image)), "images must be a list"),
    ]


async def test_each_bad_input_is_named_and_the_engine_serves_on(
    engine, bad_files, server, test_images
) -> None:
    await _serves(engine, test_images[0])
    failed = engine.get_stats()["num_requests_failed"]
    for call, match in _cases(bad_files, server, test_images[0]):
        with pytest.raises((ValueError, TypeError), match=match):
            await engine.chat(**{"max_tokens": 2, **call})
        await _serves(engine, test_images[1])
    # Every one was refused before the model saw it.
    assert engine.get_stats()["num_requests_failed"] == failed


async def test_an_http_image_is_fetched(engine, server, test_images) -> None:
    fetched = await engine.chat(_user(f"{server}/stripes.png"), max_tokens=4, temperature=0)
    local = await engine.chat(_user(str(test_images[0])), max_tokens=4, temperature=0)
    assert fetched.tokens == local.tokens


async def test_an_image_in_a_tool_result_reaches_the_model(engine, test_images) -> None:
    call = {"id": "c1", "function": {"name": "snapshot", "arguments": {}}}
    messages = [
        {"role": "user", "content": "Take a snapshot."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "image", "image": ""}]},
    ]
    outs = []
    for image in test_images:
        messages[2]["content"] = [{"type": "image", "image": str(image)}]
        outs.append(await engine.chat(messages, max_tokens=6, temperature=0))
    assert outs[0].prompt_tokens == outs[1].prompt_tokens > 16
    assert outs[0].tokens != outs[1].tokens


async def test_a_text_model_refuses_images_naming_vision_models(tiny_llama: Path, test_images):
    eng = SimpleEngine(tiny_llama)
    try:
        for call in (
            dict(messages=[{"role": "user", "content": "hi"}], images=[str(test_images[0])]),
            dict(messages=_user(str(test_images[0]))),
        ):
            with pytest.raises(ValueError, match=r"text-only model.*Qwen2\.5-VL"):
                await eng.chat(max_tokens=2, **call)
        assert not eng.is_mllm
        assert (await eng.chat([{"role": "user", "content": "hi"}], max_tokens=2)).finished
    finally:
        await eng.stop()


def test_a_vision_model_refuses_batching_and_speculation(tiny_vlm: Path) -> None:
    from mlx_integrations.engine import BatchedEngine

    with pytest.raises(ValueError, match="BatchedEngine serves text models only"):
        BatchedEngine(tiny_vlm)
    with pytest.raises(ValueError, match="speculative decoding"):
        SimpleEngine(tiny_vlm, prompt_lookup=3)


@pytest.mark.parametrize(
    ("option", "value", "match"),
    [
        ("max_images", 0, "max_images must be"),
        ("max_media_mb", -1, "max_media_mb must be"),
        ("max_image_pixels", 0, "max_image_pixels must be"),
    ],
)
def test_bad_media_options(tiny_vlm: Path, option: str, value: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SimpleEngine(tiny_vlm, **{option: value})


async def test_images_that_outgrow_the_context_window(tmp_path, test_images) -> None:
    from tests.support.tiny_vlm import build_tiny_vlm

    # The text prompt fits in 50 tokens; with its 16 image tokens expanded it does not.
    small = SimpleEngine(build_tiny_vlm(tmp_path / "small", max_position_embeddings=50))
    try:
        with pytest.raises(ValueError, match="with its images expanded, more than the context"):
            await small.chat(_user(str(test_images[0])), max_tokens=2)
        out = await small.chat([{"role": "user", "content": "Hi"}], max_tokens=40)
        assert out.finished and out.prompt_tokens + out.completion_tokens <= 50
    finally:
        await small.stop()


async def test_a_redirect_to_another_scheme_is_refused(engine, test_images) -> None:
    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", "ftp://127.0.0.1/cat.png")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/cat.png"
        with pytest.raises(ValueError, match="which is not http"):
            await engine.chat(_user(url), max_tokens=2)
    finally:
        httpd.shutdown()
        httpd.server_close()
    await _serves(engine, test_images[0])


async def test_a_download_that_trickles_past_the_timeout(tiny_vlm, test_images) -> None:
    import time

    class Trickle(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            try:
                for byte in test_images[0].read_bytes()[:40]:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:  # the client gave up
                pass

        def log_message(self, *args) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    engine = SimpleEngine(tiny_vlm, media_timeout_s=0.5)
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/slow.png"
        with pytest.raises(ValueError, match=r"took longer than 0\.5 s to download"):
            await engine.chat(_user(url), max_tokens=2)
        await _serves(engine, test_images[0])
    finally:
        await engine.stop()
        httpd.shutdown()
        httpd.server_close()


async def test_headers_that_trickle_past_the_timeout(tiny_vlm, test_images) -> None:
    # 40 headers a byte each 0.05 s apart take about 40 s; the download gets 0.5 s in all.
    engine = SimpleEngine(tiny_vlm, media_timeout_s=0.5)
    try:
        with SlowHeadersServer(headers=40, delay=0.05) as server:
            url = server.url("slow.png")
            for source in (url, f"{url}?again"):  # and the engine serves on
                with pytest.raises(MediaError) as caught:
                    await engine.chat(_user(source), max_tokens=2)
                assert str(caught.value).startswith(f"image {source!r} took longer than 0.5 s")
        await _serves(engine, test_images[0])
    finally:
        await engine.stop()


@pytest.mark.parametrize("side", [10_000, 14_000])  # past Pillow's warning, past its error
def test_pillows_own_pixel_cap_is_a_media_error(side: int) -> None:
    with pytest.raises(
        MediaError, match=r"image .x. is too large for Pillow .*PIL.Image.MAX_IMAGE_PIXELS"
    ):
        decode_image(huge_png(side, side), "image 'x'", max_pixels=10**9)


def test_an_image_within_the_pixel_limit_decodes() -> None:
    assert decode_image(huge_png(300, 200), "image 'x'", max_pixels=60_000).size == (300, 200)
    with pytest.raises(MediaError, match=r"300x200 pixels \(0\.1 million\)"):
        decode_image(huge_png(300, 200), "image 'x'", max_pixels=59_999)


async def test_raw_base64_of_a_real_size_image_in_every_form(engine, tmp_path) -> None:
    png = tmp_path / "noise.png"
    png.write_bytes(noisy_png(300))
    b64 = base64.b64encode(png.read_bytes()).decode()
    assert len(b64) > 4096  # longer than any path the OS takes
    want = await engine.chat(_user(str(png)), max_tokens=4, temperature=0)
    forms = [
        dict(messages=_user(b64)),
        dict(messages=[{"role": "user", "content": QUESTION}], images=[b64]),
        dict(messages=_user(f"data:image/png;base64,{b64}")),
        dict(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": b64}},
                        {"type": "text", "text": QUESTION},
                    ],
                }
            ]
        ),
    ]
    for call in forms:
        out = await engine.chat(**call, max_tokens=4, temperature=0)
        assert out.tokens == want.tokens
        assert out.prompt_tokens == want.prompt_tokens


@pytest.mark.parametrize(
    "source",
    [
        "x" * 5000 + ".png",  # longer than PATH_MAX
        "pictures/" + "x" * 300 + ".png",  # a part longer than a file name may be
        "@" * 5000,
        base64.b64encode(bytes(3000)).decode(),  # base64, but not of an image
    ],
)
async def test_a_long_source_is_named_shortly(engine, test_images, source: str) -> None:
    with pytest.raises(MediaError) as caught:
        await engine.chat(_user(source), max_tokens=2)
    message = str(caught.value)
    assert f"({len(source)} characters)" in message and len(message) < 300
    kept = source[:40] in message and source[-24:] in message  # a path keeps its file name
    assert kept or message.startswith("the base64 image data")
    await _serves(engine, test_images[0])


@contextlib.contextmanager
def _fifo_fed(path: Path, size: int) -> Iterator[Path]:
    """A FIFO at ``path`` whose reader, if one opens it, gets ``size`` zero bytes and an
    end; the writer never blocks waiting for a reader, so nothing can hang."""
    os.mkfifo(path)
    stop = threading.Event()

    def feed() -> None:
        while not stop.is_set():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader yet
                stop.wait(0.01)
                continue
            os.set_blocking(fd, True)
            try:
                for _ in range(size // 65536):
                    os.write(fd, bytes(65536))
            except OSError:  # the reader went away
                pass
            finally:
                os.close(fd)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    try:
        yield path
    finally:
        stop.set()
        writer.join(timeout=10)


@pytest.mark.parametrize("kind", ["image", "video"])
async def test_a_fifo_or_device_is_refused_unread(engine, test_images, tmp_path, kind) -> None:
    with _fifo_fed(tmp_path / "pipe.png", 1 << 20) as fifo:
        for source in (str(fifo), fifo.as_uri(), "/dev/null"):
            call = {f"{kind}s": [source], "messages": [{"role": "user", "content": QUESTION}]}
            with pytest.raises(MediaError, match=r"is not a regular file \(a FIFO"):
                await asyncio.wait_for(engine.chat(**call, max_tokens=2), timeout=60)
    await _serves(engine, test_images[0])


async def test_an_image_the_processor_refuses_is_named(engine, test_images, tmp_path) -> None:
    from PIL import Image

    thin = tmp_path / "thin.png"
    Image.new("RGB", (2, 600), (200, 10, 10)).save(thin)  # Qwen takes ratios up to 200
    with pytest.raises(MediaError) as caught:
        await engine.chat(_user(str(test_images[0]), str(thin)), max_tokens=2)
    message = str(caught.value)
    # A long path is shortened in messages (its start and its file name kept).
    assert message.startswith(f"the model's processor cannot take image {describe(thin)}")
    assert "(2x600 pixels, image 2 of 2): absolute aspect ratio must be smaller" in message
    await _serves(engine, test_images[0])
