"""Image and video parts of neutral messages: how the adapters write them, and the
check that keeps them from engines of text-only models.

A part is ``{"type": "image", "image": source}`` or ``{"type": "video", "video": source}``,
where ``source`` is a string the engine resolves: a local path, a ``file://``,
``http(s)://`` or ``data:`` URL, or raw base64. The adapters never read or fetch a
source themselves; bytes they are given become a ``data:`` URL.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from typing import Any, Literal

from mlx_integrations.chat.fields import RequestError

MediaKind = Literal["image", "video"]
MEDIA_KINDS: tuple[MediaKind, ...] = ("image", "video")

# Parts the engines do not take from any adapter (named in the error of a text model).
_NAMED = {"image_url": "image", "input_image": "image", "video_url": "video"}


def media_part(kind: MediaKind, source: Any, where: str) -> dict[str, str]:
    """The neutral part for one image or video.

    Args:
        kind: ``"image"`` or ``"video"``.
        source: A path (``str`` or ``os.PathLike``) or a URL string.
        where: Where the source came from, for the error message.

    Raises:
        TypeError: ``source`` is not a string or a path.
        ValueError: ``source`` is empty.
    """
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str):
        raise TypeError(
            f"{where} gives the {kind} as {type(source).__name__} {source!r:.60}; give a "
            "path, a file://, http(s):// or data: URL, or base64 data"
        )
    if not source.strip():
        raise ValueError(
            f"{where} has an empty {kind} source; give a path, a file://, http(s):// or "
            "data: URL, or base64 data"
        )
    return {"type": kind, kind: source}


def data_url(kind: MediaKind, data: Any, mime_type: Any, where: str) -> str:
    """A ``data:`` URL for base64 text or raw bytes (encoded here), or the base64 as is
    when no MIME type is known (the engine reads the format from the data).

    Raises:
        TypeError: ``data`` is neither text nor bytes.
        ValueError: ``data`` is empty, or ``mime_type`` is not a ``kind/...`` type.
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = base64.b64encode(bytes(data)).decode("ascii")
    if not isinstance(data, str):
        raise TypeError(
            f"{where} holds {kind} data of type {type(data).__name__}; give base64 text or bytes"
        )
    if not data.strip():
        raise ValueError(f"{where} holds empty {kind} data; give the base64 of the file")
    if mime_type is None or mime_type == "":
        return data
    if not isinstance(mime_type, str) or not mime_type.startswith(f"{kind}/"):
        raise ValueError(
            f"{where} gives mime_type {mime_type!r} for {kind} data; use a {kind}/... type "
            f"(e.g. {'image/png' if kind == 'image' else 'video/mp4'}) or leave it out"
        )
    return f"data:{mime_type};base64,{data}"


VISION_MODELS = (
    "a vision-language model such as Qwen2.5-VL (mlx-community/Qwen2.5-VL-3B-Instruct-4bit), "
    "Gemma 3 or SmolVLM (install mlx-integrations[vision])"
)
"""Which models take images and video, for the errors of text-only models."""


def media_kind_of(part: Any) -> str | None:
    """``"image"`` or ``"video"`` for a media part (in any of the forms the engines'
    templates recognise), else None."""
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind in MEDIA_KINDS:
        return str(kind)
    return _NAMED.get(str(kind))


def reject_media_for_text_model(
    messages: list[dict[str, Any]],
    model_name: str,
    is_mllm: bool,
    images: Sequence[str] = (),
    videos: Sequence[str] = (),
) -> None:
    """Refuse images and videos, given beside the messages or in them, when the
    engine's model takes neither.

    Raises:
        RequestError: Media given and ``is_mllm`` False; the message says which one
            and which models take them.
    """
    if is_mllm:
        return
    for given, value in (("images", images), ("videos", videos)):
        if value:
            raise RequestError(
                f"{model_name!r} is a text-only model and cannot take {given} "
                f"({len(value)} given); remove them or use {VISION_MODELS}",
                given,
            )
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            kind = media_kind_of(part)
            if kind is None:
                continue
            noun = "images" if kind == "image" else "video"
            raise RequestError(
                f"{model_name!r} does not take {noun}: it is a text-only model, and "
                f"messages[{i}] holds {'an image' if kind == 'image' else 'a video'}. "
                f"Remove it, or use {VISION_MODELS}",
                f"messages[{i}].content[{j}]",
            )
