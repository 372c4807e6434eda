"""MediaPolicy: what a server lets image sources name (files, hosts, addresses), and the
default that lets the caller's own files through."""

from __future__ import annotations

import base64
import socket
from pathlib import Path

import pytest

from mlx_integrations.engine.options import EngineOptions
from mlx_integrations.engine.vision.media import MediaError, MediaLimits, read_source
from mlx_integrations.engine.vision.policy import MediaPolicy
from tests.support.file_server import FileServer
from tests.support.tiny_vlm import make_test_image

PNG_HEADER = b"\x89PNG"


def _limits(policy: MediaPolicy) -> MediaLimits:
    return MediaLimits(policy=policy)


@pytest.fixture
def image(tmp_path: Path) -> Path:
    """A PNG in a folder of its own (the folder a policy allows)."""
    folder = tmp_path / "allowed"
    folder.mkdir()
    return make_test_image(folder / "cat.png")


def test_the_default_reads_the_callers_own_files(image: Path):
    data, _ = read_source(str(image), MediaLimits(), kind="image")
    assert data.startswith(PNG_HEADER)
    assert MediaPolicy().unrestricted
    assert EngineOptions().media_limits.policy == MediaPolicy()


def test_a_restricted_policy_refuses_every_local_path_alike(image: Path, tmp_path: Path):
    limits = _limits(MediaPolicy.restricted())
    errors = []
    for source in (str(image), f"file://{image}", str(tmp_path / "missing.png")):
        with pytest.raises(MediaError) as caught:
            read_source(source, limits, kind="image")
        errors.append(str(caught.value))
        assert "refused" in str(caught.value)
        assert "--allowed-local-media-path" in str(caught.value)
    # An existing and a missing file get the same answer: no oracle of the disk.
    assert "there is no file" not in "".join(errors)


def test_an_allowed_folder_and_nothing_outside_it(image: Path, tmp_path: Path):
    allowed = image.parent
    limits = _limits(MediaPolicy.restricted(allowed_local_path=allowed))
    data, _ = read_source(str(image), limits, kind="image")
    assert data.startswith(PNG_HEADER)
    outside = make_test_image(tmp_path / "outside.png")
    link = allowed / "link.png"
    link.symlink_to(outside)  # inside by name, outside once resolved
    for source in (
        str(outside),
        str(link),
        str(allowed / ".." / "outside.png"),
        f"file://{outside}",
    ):
        with pytest.raises(MediaError, match="not under the allowed folder"):
            read_source(source, limits, kind="image")


def test_data_urls_and_base64_pass_any_policy(image: Path):
    payload = base64.b64encode(image.read_bytes()).decode()
    limits = _limits(MediaPolicy.restricted())
    for source in (f"data:image/png;base64,{payload}", payload):
        data, _ = read_source(source, limits, kind="image")
        assert data.startswith(PNG_HEADER)


def test_loopback_urls_are_refused_unless_allowed(image: Path):
    with FileServer({"cat.png": image.read_bytes()}) as files:
        url = files.url("cat.png")
        with pytest.raises(MediaError, match="loopback, private"):
            read_source(url, _limits(MediaPolicy.restricted()), kind="image")
        assert files.hits == {}  # refused before any connection
        data, _ = read_source(
            url, _limits(MediaPolicy.restricted(allow_private_urls=True)), kind="image"
        )
        assert data.startswith(PNG_HEADER) and files.hits == {"cat.png": 1}


def test_allowed_domains_keep_downloads_to_their_hosts(image: Path):
    policy = MediaPolicy.restricted(allowed_domains=["images.example.org"], allow_private_urls=True)
    with FileServer({"cat.png": image.read_bytes()}) as files:
        with pytest.raises(MediaError, match="not among the allowed media domains"):
            read_source(files.url("cat.png"), _limits(policy), kind="image")
        assert files.hits == {}


def test_a_name_that_resolves_elsewhere_when_connecting_is_caught(
    image: Path, monkeypatch: pytest.MonkeyPatch
):
    """DNS rebinding: the name checks out as public, then connects to loopback."""
    real = socket.getaddrinfo
    answers = iter(["93.184.216.34"])

    def resolve(host, port, *args, **kwargs):
        if host == "rebind.test":
            address = next(answers, "127.0.0.1")
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    with FileServer({"cat.png": image.read_bytes()}) as files:
        port = files.url("").rsplit(":", 1)[1].strip("/")
        with pytest.raises(MediaError, match=r"127\.0\.0\.1"):
            read_source(
                f"http://rebind.test:{port}/cat.png",
                _limits(MediaPolicy.restricted()),
                kind="image",
            )
        assert files.hits == {}  # the connection was closed before a request was sent


def test_a_bad_policy_is_refused_when_made(tmp_path: Path):
    with pytest.raises(ValueError, match="not a folder"):
        MediaPolicy.restricted(allowed_local_path=tmp_path / "nope")
    with pytest.raises(TypeError, match="allowed_domains"):
        MediaPolicy(allowed_domains="example.org")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="media_policy"):
        EngineOptions(media_policy="strict")  # type: ignore[arg-type]
