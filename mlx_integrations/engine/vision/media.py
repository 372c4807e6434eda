"""Images and videos from every source form, checked and decoded at the boundary.

A source is a string: a local path, a ``file://`` URL, an ``http(s)://`` URL (fetched
with a size limit and a timeout), a ``data:`` URL, or raw base64. Each image is
decoded in full here, so a truncated or corrupt file fails with a message naming it
instead of later, deep inside the model, as a raw ``OSError``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import http.client
import io
import os
import re
import socket
import stat
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlx_integrations.engine.vision.policy import MediaError, MediaPolicy

if TYPE_CHECKING:
    from PIL.Image import Image

MiB = 1024 * 1024
_BASE64 = re.compile(r"^[A-Za-z0-9+/=_\-\s]+$")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")


@dataclass(frozen=True)
class MediaLimits:
    """What one request may bring.

    Args:
        max_images: Most images (and videos) in one request.
        max_bytes: Largest encoded image or video (a file, a download, a data URL).
        timeout_s: Seconds an ``http(s)`` download may take in all: connecting,
            redirects, headers and body.
        max_pixels: Most pixels (width x height) one decoded image may have; a small
            file can hold a huge image, so the size is checked before decoding.
        policy: Which local files and hosts a source may name (every one by default;
            a server restricts them, see :class:`MediaPolicy`).
    """

    max_images: int = 8
    max_bytes: int = 20 * MiB
    timeout_s: float = 10.0
    max_pixels: int = 50_000_000
    policy: MediaPolicy = field(default_factory=MediaPolicy)


def describe(source: Any) -> str:
    """A short form of a source for error messages: a long one keeps its start and its
    end (a path's file name), base64 payloads are cut."""
    text = str(source)
    if len(text) <= 80:
        return repr(text)
    return repr(f"{text[:40]}...{text[-24:]} ({len(text)} characters)")


def load_image(source: Any, limits: MediaLimits = MediaLimits()) -> Image:
    """Resolve ``source`` and decode it to an RGB PIL image.

    Raises:
        MediaError: A missing file, an unsupported URL scheme, a download that fails or
            is too large, data that is not an image or is truncated.
        TypeError: ``source`` is not a string (or bytes of an encoded image).
    """
    data, where = read_source(source, limits, kind="image")
    return decode_image(data, where, limits.max_pixels)


def decode_image(data: bytes, where: str, max_pixels: int = MediaLimits.max_pixels) -> Image:
    """Decode encoded image bytes fully (so truncation fails here) to an RGB image.

    The width and height are read from the header and checked against ``max_pixels``
    before any pixel is decoded.
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    img: Any
    try:
        img = Image.open(io.BytesIO(data))
        width, height = img.size
        if width * height > max_pixels:
            raise MediaError(
                f"{where} is {width}x{height} pixels ({width * height / 1e6:.1f} million), "
                f"more than the limit of {max_pixels / 1e6:.1f} million; scale it down or "
                "raise the engine option max_image_pixels"
            )
        img.load()  # decode every pixel now: a truncated file fails here
    except MediaError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # Pillow's own cap (Image.MAX_IMAGE_PIXELS), met when max_image_pixels is above it.
        raise MediaError(
            f"{where} is too large for Pillow to decode safely ({exc}); scale it down (the "
            f"engine takes up to max_image_pixels={max_pixels}, Pillow up to "
            "PIL.Image.MAX_IMAGE_PIXELS)"
        ) from None
    except UnidentifiedImageError:
        raise MediaError(
            f"{where} is not an image (PIL cannot identify {len(data)} bytes); pass a PNG, "
            "JPEG, WebP, GIF or BMP file"
        ) from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise MediaError(
            f"{where} is a damaged or truncated image ({exc}); re-save or re-download it"
        ) from None
    img = ImageOps.exif_transpose(img)
    return img.convert("RGB")


def resolve_video(
    source: Any, limits: MediaLimits = MediaLimits(), temp_files: list[str] | None = None
) -> str:
    """A local file path for a video source (downloads and data go to a temp file),
    checked to hold a first frame that OpenCV (which mlx-vlm reads videos with) decodes.

    Args:
        source: The video source.
        limits: Size and time limits.
        temp_files: Receives the path of a temp file made for the video (the caller
            deletes it once the video is read).

    Raises:
        MediaError: As :func:`load_image` for the source, or not a readable video.
    """
    if isinstance(source, str):
        path = _local_path(source.strip(), limits.policy)
        if path is not None:
            _check_file(path, limits, "video")
            return _check_video(str(path), f"video file {str(path)!r}")
    data, where = read_source(source, limits, kind="video")
    import tempfile

    name = ""
    try:
        fd, name = tempfile.mkstemp(prefix="mlxi-video-", suffix=".mp4")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        _check_video(name, where)
    except BaseException as exc:
        if name:
            with contextlib.suppress(OSError):
                os.unlink(name)
        if isinstance(exc, OSError):
            raise MediaError(
                f"{where} could not be saved for OpenCV to read ({exc.strerror or exc}); free "
                f"space in {tempfile.gettempdir()!r} or point TMPDIR elsewhere"
            ) from None
        raise
    if temp_files is not None:
        temp_files.append(name)
    return name


def _check_video(path: str, where: str) -> str:
    import cv2

    capture = cv2.VideoCapture(path)
    try:
        readable = capture.isOpened() and capture.read()[0]
    finally:
        capture.release()
    if not readable:
        raise MediaError(
            f"{where} is not a video OpenCV can read (no frame decodes); pass an MP4, "
            "WebM, AVI or MOV file"
        )
    return path


def read_source(source: Any, limits: MediaLimits, *, kind: str) -> tuple[bytes, str]:
    """The encoded bytes of a source, and how to name it in errors."""
    if isinstance(source, (bytes, bytearray)):
        return _check_size(bytes(source), limits, f"the {kind} bytes"), f"the {kind} bytes"
    if isinstance(source, Path):
        source = str(source)
    if not isinstance(source, str):
        raise TypeError(
            f"an {kind} source must be a string (a path, a file://, http(s):// or data: "
            f"URL, or base64), got {type(source).__name__}"
        )
    text = source.strip()
    if not text:
        raise MediaError(f"an {kind} source is empty; pass a path, a URL or base64 data")
    where = f"{kind} {describe(text)}"
    if text.startswith("data:"):
        return _check_size(_data_url(text, where), limits, where), where
    if text.lower().startswith(("http://", "https://")):
        return _download(text, limits, where), where
    path = _local_path(text, limits.policy)
    if path is not None:
        return read_file(path, limits, kind), f"{kind} file {str(path)!r}"
    scheme = _SCHEME.match(text)
    if scheme:
        raise MediaError(
            f"{where} has the unsupported URL scheme {describe(scheme.group(1))}; use a "
            "local path, a file://, http://, https:// or data: URL, or base64 data"
        )
    if len(text) > 64 and _BASE64.match(text):
        try:
            data = base64.b64decode(_padded(text), validate=False)
        except (binascii.Error, ValueError):
            data = b""
        if data:
            where = f"the base64 {kind} data ({len(text)} characters)"
            return _check_size(data, limits, where), where
    raise MediaError(f"{where} is neither a file, a URL nor base64 data")


def _local_path(text: str, policy: MediaPolicy = MediaPolicy()) -> Path | None:
    """The path a ``file://`` URL or a plain path names, None for anything else.

    Under a policy that restricts files, a path is checked before anything is looked
    up, so whether a refused file exists is never told.
    """
    if policy.restricts_files:
        candidate = _path_candidate(text)
        if candidate is None:
            return None
        text = str(policy.check_local(candidate))
    if text.lower().startswith("file://"):
        parsed = urllib.parse.urlparse(text)
        if parsed.netloc not in ("", "localhost"):
            raise MediaError(
                f"{describe(text)} names the host {describe(parsed.netloc)}; file:// URLs "
                "must be local (file:///path/to/image.png)"
            )
        path = Path(urllib.parse.unquote(parsed.path))
        if not _exists(path):
            raise MediaError(f"{describe(text)}: there is no file {describe(path)}")
        return path
    scheme = _SCHEME.match(text)
    if scheme and len(scheme.group(1)) > 1:  # a URL (a Windows drive letter is a path)
        return None
    try:
        path = Path(text).expanduser()
    except RuntimeError:  # "~user" of no such user
        path = Path(text)
    if _exists(path):
        return path
    if len(text) > 64 and _BASE64.match(text):  # raw base64 ("." never appears in it)
        return None
    raise MediaError(f"there is no file {describe(text)}; check the path")


def _path_candidate(text: str) -> Path | None:
    """The path ``text`` would name (a ``file://`` URL or a plain path), None for a URL
    of another scheme or raw base64; nothing is looked up."""
    if text.lower().startswith("file://"):
        parsed = urllib.parse.urlparse(text)
        if parsed.netloc not in ("", "localhost"):
            raise MediaError(
                f"{describe(text)} names the host {describe(parsed.netloc)}; file:// URLs "
                "must be local (file:///path/to/image.png)"
            )
        return Path(urllib.parse.unquote(parsed.path))
    scheme = _SCHEME.match(text)
    if scheme and len(scheme.group(1)) > 1:
        return None
    if len(text) > 64 and _BASE64.match(text) and "." not in text:
        return None  # raw base64 (a path this long without a dot is taken as data)
    return Path(text)


def _exists(path: Path) -> bool:
    """Whether ``path`` names something; False for a name no file can have (a base64
    payload longer than PATH_MAX, or with a part over 255 characters)."""
    try:
        return path.exists()
    except OSError:
        return False


def read_file(path: Path, limits: MediaLimits, kind: str) -> bytes:
    """The bytes of a local regular file of at most ``limits.max_bytes``.

    Raises:
        MediaError: A folder, a FIFO, socket or device (whose size says nothing of
            what reading it gives), a file that cannot be read or is too large.
    """
    _check_file(path, limits, kind)
    try:  # non-blocking: a FIFO swapped in after the check is not waited on
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise MediaError(f"{kind} file {describe(path)} cannot be read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise MediaError(_not_regular(path, kind))
        data = f.read(limits.max_bytes + 1)
    return _check_size(data, limits, f"{kind} file {describe(path)}")


def _check_file(path: Path, limits: MediaLimits, kind: str) -> None:
    try:
        info = path.stat()
    except OSError as exc:
        raise MediaError(f"{kind} file {describe(path)} cannot be read: {exc.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        raise MediaError(f"{describe(path)} is a folder, not an {kind} file")
    if not stat.S_ISREG(info.st_mode):
        raise MediaError(_not_regular(path, kind))
    if info.st_size > limits.max_bytes:
        raise MediaError(
            f"{kind} file {describe(path)} has {info.st_size / MiB:.1f} MiB, more than the "
            f"limit of {limits.max_bytes / MiB:.1f} MiB; shrink it or raise max_media_mb"
        )


def _not_regular(path: Path, kind: str) -> str:
    return (
        f"{describe(path)} is not a regular file (a FIFO, socket or device, which could "
        f"be read without end); save the {kind} to a file and pass its path"
    )


def _check_size(data: bytes, limits: MediaLimits, where: str) -> bytes:
    if len(data) > limits.max_bytes:
        raise MediaError(
            f"{where} has {len(data) / MiB:.1f} MiB, more than the limit of "
            f"{limits.max_bytes / MiB:.1f} MiB; shrink it or raise max_media_mb"
        )
    return data


def _padded(text: str) -> str:
    text = "".join(text.split())
    return text + "=" * (-len(text) % 4)


def _data_url(text: str, where: str) -> bytes:
    header, sep, payload = text.partition(",")
    if not sep:
        raise MediaError(f"{where} is a data: URL without a comma before its data")
    if header.endswith(";base64"):
        try:
            return base64.b64decode(_padded(payload), validate=False)
        except (binascii.Error, ValueError) as exc:
            raise MediaError(f"{where} holds invalid base64 data: {exc}") from None
    return urllib.parse.unquote_to_bytes(payload)


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects to http(s) URLs only (urllib would follow ftp:// too)."""

    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        if not newurl.lower().startswith(("http://", "https://")):
            raise MediaError(
                f"{describe(req.full_url)} redirects to {describe(newurl)}, which is not http(s)"
            )
        self.policy.check_url(newurl)  # a redirect is held to the policy too
        return super().redirect_request(req, fp, code, msg, headers, newurl)

    def __init__(self, policy: MediaPolicy) -> None:
        super().__init__()
        self.policy = policy


class _Deadline:
    """One download's deadline: each connection takes the time left as its timeout, and
    a timer shuts every socket the download opened (redirects open more) when the time
    is up, so neither headers nor a body sent a byte at a time outlast it."""

    def __init__(self, timeout_s: float, policy: MediaPolicy = MediaPolicy()) -> None:
        self.policy = policy
        self.url = ""
        self.at = time.monotonic() + timeout_s
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(timeout_s, self.expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def left(self) -> float:
        return max(self.at - time.monotonic(), 0.001)

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shut(sock)

    def expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    # A read blocked in another thread returns at once; the socket's owner closes it.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _DeadlineConnect:
    """Connects with the time the download has left, and puts the socket under watch."""

    _deadline: _Deadline | None = None
    timeout: Any
    sock: Any

    def connect(self) -> None:
        if self._deadline is not None:
            self.timeout = self._deadline.left()
        super().connect()  # type: ignore[misc]
        if self._deadline is not None:
            self._deadline.watch(self.sock)
            # The address connected to, not the one looked up before: a name that
            # resolves elsewhere the second time is caught here.
            self._deadline.policy.check_address(self.sock.getpeername()[0], self._deadline.url)


class _HTTPConnection(_DeadlineConnect, http.client.HTTPConnection):
    def __init__(self, host: str, deadline: _Deadline | None = None, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self._deadline = deadline


class _HTTPSConnection(_DeadlineConnect, http.client.HTTPSConnection):
    def __init__(self, host: str, deadline: _Deadline | None = None, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self._deadline = deadline


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(_HTTPConnection, req, deadline=self._deadline)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def https_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(_HTTPSConnection, req, deadline=self._deadline)


def _read_body(response: Any, limits: MediaLimits, deadline: _Deadline, where: str) -> bytes:
    """Read at most ``max_bytes + 1`` bytes before the deadline."""
    chunks: list[bytes] = []
    size = 0
    read = getattr(response, "read1", response.read)  # what has arrived, not a full block
    while size <= limits.max_bytes:
        chunk = read(min(64 * 1024, limits.max_bytes + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if time.monotonic() > deadline.at:
            raise _timed_out(where, limits)
    return b"".join(chunks)


def _timed_out(where: str, limits: MediaLimits) -> MediaError:
    return MediaError(
        f"{where} took longer than {limits.timeout_s:g} s to download; raise "
        "media_timeout_s or use a faster or smaller source"
    )


def _download(url: str, limits: MediaLimits, where: str) -> bytes:
    """GET ``url`` within ``timeout_s`` in all, refusing a body larger than the limit.

    The time counts from before the connection opens (name lookup is left to the
    system's resolver and its own timeout).
    """
    limits.policy.check_url(url)
    request = urllib.request.Request(url, headers={"User-Agent": "mlx-integrations"})
    with _Deadline(limits.timeout_s, limits.policy) as deadline:
        deadline.url = url
        handlers: list[Any] = [
            _HttpOnlyRedirects(limits.policy),
            _HTTPHandler(deadline),
            _HTTPSHandler(deadline),
        ]
        if not limits.policy.unrestricted:
            # A proxy would be the peer checked: a restricted download goes direct.
            handlers.append(urllib.request.ProxyHandler({}))
        opener = urllib.request.build_opener(*handlers)
        try:
            with opener.open(request, timeout=limits.timeout_s) as response:
                declared = response.headers.get("Content-Length")
                if declared and declared.isdigit() and int(declared) > limits.max_bytes:
                    raise MediaError(
                        f"{where} is {int(declared) / MiB:.1f} MiB, more than the download "
                        f"limit of {limits.max_bytes / MiB:.1f} MiB; raise max_media_mb or "
                        "use a smaller file"
                    )
                data = _read_body(response, limits, deadline, where)
        except MediaError:
            raise
        except urllib.error.HTTPError as exc:
            if deadline.expired:
                raise _timed_out(where, limits) from None
            raise MediaError(
                f"{where} could not be fetched: HTTP {exc.code} {exc.reason}"
            ) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            if deadline.expired:  # the timer shut the socket mid-read
                raise _timed_out(where, limits) from None
            reason = getattr(exc, "reason", exc)
            raise MediaError(
                f"{where} could not be fetched ({reason}); check the URL and the network, "
                f"downloads time out after {limits.timeout_s:g} s"
            ) from None
        if deadline.expired:  # a body cut short by the timer reads as a short body
            raise _timed_out(where, limits)
    if len(data) > limits.max_bytes:
        raise MediaError(
            f"{where} is larger than the download limit of {limits.max_bytes / MiB:.1f} MiB; "
            "raise max_media_mb or use a smaller file"
        )
    return data
