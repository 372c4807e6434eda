"""Vision-language models on mlx-vlm: loading, prompt formatting and the decode loop.

A model folder whose config.json has a ``vision_config`` (Qwen2-VL, Qwen2.5-VL,
Gemma 3, SmolVLM, Pixtral, Llama 3.2 Vision...) is served through mlx-vlm: its model
classes, its processor (image preprocessing, image-token expansion) and its per-family
prompt formatting. The engines keep their own contract around it (sampling, logits
processors and constraints, stop strings, streaming, cancellation, stats); mlx-vlm is
imported only when such a model loads, from the ``[vision]`` extra.

Everything that makes MLX arrays (the processor's output, the forward passes) runs on
the engine's owner thread; images are decoded to PIL images before, off the event loop.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import weakref
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlx_integrations.chat.messages import media_sources
from mlx_integrations.engine.vision.media import (
    MediaError,
    MediaLimits,
    describe,
    load_image,
    read_file,
    resolve_video,
)

if TYPE_CHECKING:
    from PIL.Image import Image

INSTALL_HINT = 'pip install "mlx-integrations[vision]"'


def is_vision_config(config: dict[str, Any]) -> bool:
    """Whether a model's config.json describes a vision-language model."""
    return isinstance(config.get("vision_config"), dict)


def import_mlx_vlm(model_name: str) -> Any:
    """Import mlx-vlm, or say how to install it.

    Raises:
        ImportError: mlx-vlm is not installed.
    """
    try:
        import mlx_vlm
    except ImportError as exc:
        raise ImportError(
            f"{model_name!r} is a vision-language model; serving it needs mlx-vlm: {INSTALL_HINT}"
        ) from exc
    return mlx_vlm


@dataclass
class VisionInputs:
    """A request's decoded images and video files, in the order the prompt names them."""

    images: list[Image] = field(default_factory=list)
    videos: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    """A digest of each image's pixels and each video's bytes, in prompt order: image
    tokens are the same ids for any image, so a cached prefix is reused only where
    these match too."""
    names: list[str] = field(default_factory=list)
    """Each image's and video's source, shortened, in prompt order (for errors)."""


class VisionTokenizer:
    """The model's mlx-lm tokenizer, whose chat template goes through mlx-vlm's formatting.

    mlx-vlm knows how each family wants images in a message (content parts, image
    tokens in the text...); messages keep their parts in the order given. Everything
    else (encode, detokenizer, EOS ids, thinking markers) is the mlx-lm tokenizer's.
    """

    def __init__(self, tokenizer: Any, processor: Any, model_config: Any):
        self._wrapped = tokenizer
        self._processor = processor
        self._model_type = str(model_config.model_type)
        self._config = model_config

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)

    @property
    def chat_template(self) -> Any:
        return getattr(self._processor, "chat_template", None) or getattr(
            self._wrapped, "chat_template", None
        )

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tokenize: bool = True,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> Any:
        from mlx_vlm.prompt_utils import get_chat_template

        kwargs.pop("return_dict", None)
        formatted: list[Any] = []
        for msg in messages:
            if msg.get("tool_calls") or msg.get("role") == "tool":
                formatted.append(dict(msg))
            else:
                formatted.append(self._message_json(msg["role"], msg.get("content")))
        # Rendered by the tokenizer (which holds the processor's template): the processor
        # would warn on every template variable it does not know (enable_thinking...).
        hf = getattr(self._wrapped, "_tokenizer", self._wrapped)
        text = get_chat_template(hf, formatted, add_generation_prompt, **kwargs)
        if tokenize:
            return self._wrapped.encode(text, add_special_tokens=False)
        return text

    def _message_json(self, role: str, content: Any) -> Any:
        """One message as mlx-vlm formats it for the model's family, parts in the order
        given (mlx-vlm writes a message's videos before its text: each is put back)."""
        if not isinstance(content, list):
            return self._formatted(role, content or "", 0, [])
        n_images = sum(1 for p in content if p["type"] == "image")
        videos = [p["video"] for p in content if p["type"] == "video"]
        if videos:
            # Each video marked by a text part, which mlx-vlm keeps in its place.
            marked, seen = [], 0
            for part in content:
                if part["type"] == "video":
                    part, seen = {"type": "text", "text": _video_mark(seen)}, seen + 1
                marked.append(part)
            placed = _videos_in_place(self._formatted(role, marked, n_images, videos), seen)
            if placed is not None:
                return placed
            # A family that takes no video parts this way: formatted as mlx-vlm does.
            content = [p for p in content if p["type"] != "video"]
        return self._formatted(role, content, n_images, videos)

    def _formatted(self, role: str, content: Any, n_images: int, videos: list[str]) -> Any:
        from mlx_vlm.prompt_utils import get_message_json

        extra: dict[str, Any] = {"video": videos} if videos else {}
        try:
            return get_message_json(
                self._model_type,
                content,
                role,
                skip_image_token=n_images == 0,
                num_images=n_images,
                **extra,
            )
        except ValueError as exc:  # e.g. a single-image family given several
            raise ValueError(f"{exc} (model type {self._model_type!r})") from None


_MARK = re.compile(" ?\x00mlxi-video-(\\d+)\x00 ?")


def _video_mark(index: int) -> str:
    """A text part standing for the message's ``index``-th video while mlx-vlm formats it."""
    return f"\x00mlxi-video-{index}\x00"


def _videos_in_place(message: Any, count: int) -> Any:
    """Put the ``count`` video parts of a message formatted by mlx-vlm where their marks
    are (:func:`_video_mark`); mlx-vlm writes them first, before the text.

    Returns:
        The message with its parts in the order given, or None when it is not as
        expected (a family that takes no video parts): it is then formatted unmarked.
    """
    items = message.get("content") if isinstance(message, dict) else None
    if not isinstance(items, list):
        return None
    clips = [i for i in items if isinstance(i, dict) and i.get("type") == "video"]
    if len(clips) != count:
        return None
    placed: list[Any] = []
    used: list[int] = []
    for item in items:
        if item in clips:
            continue
        text = item.get("text") if isinstance(item, dict) else None
        if not isinstance(text, str) or not _MARK.search(text):
            placed.append(item)
            continue
        # text, index, text, index, ..., text: the marks of the videos it holds
        for k, piece in enumerate(_MARK.split(text)):
            if k % 2 and int(piece) < count:
                used.append(int(piece))
                placed.append(clips[int(piece)])
            elif k % 2 == 0 and piece:
                placed.append(
                    {**item, **{key: piece for key in ("text", "content") if key in item}}
                )
    if sorted(used) != list(range(count)):
        return None
    return {**message, "content": placed}


@dataclass
class LoadedVision:
    """What :func:`load_vision_model` returns."""

    model: Any
    processor: Any
    tokenizer: VisionTokenizer


def load_vision_model(path: Path, model_name: str) -> LoadedVision:
    """Load a VLM folder with mlx-vlm (on the owner thread), offline.

    The path is absolute, so processors that look for optional files on the Hub
    (Qwen's ``processor_config.json``) never take it for a repository id.
    """
    import_mlx_vlm(model_name)
    from mlx_lm.tokenizer_utils import load as load_tokenizer
    from mlx_vlm import load

    path = Path(path).resolve()
    model, processor = load(str(path))
    config = json.loads((path / "config.json").read_text())
    eos = config.get("eos_token_id") or (config.get("text_config") or {}).get("eos_token_id")
    base = load_tokenizer(path, eos_token_ids=[eos] if isinstance(eos, int) else eos)
    hf = getattr(base, "_tokenizer", base)
    template = getattr(processor, "chat_template", None)
    if isinstance(template, str) and not getattr(hf, "chat_template", None):
        hf.chat_template = template  # checkpoints that keep it in chat_template.json/.jinja
    # mlx-vlm ends a reply at every id its stopping criteria know; so do the engines.
    criteria = getattr(getattr(processor, "tokenizer", processor), "stopping_criteria", None)
    for token in getattr(criteria, "eos_token_ids", None) or []:
        base.add_eos_token(str(token))
    return LoadedVision(model, processor, VisionTokenizer(base, processor, model.config))


def gather_media(
    messages: list[dict[str, Any]],
    images: list[str] | None,
    videos: list[str] | None,
    limits: MediaLimits,
) -> tuple[list[dict[str, Any]], VisionInputs]:
    """Attach ``images=``/``videos=`` to the last user message and decode every source.

    Images and videos given as arguments go at the start of the last user message's
    content (before its text), in the order given; parts inside messages stay where
    they are. Runs off the event loop (downloads, decoding).

    Raises:
        MediaError: A source that cannot be read, or more media than ``limits`` allow.
        ValueError: ``images=`` given with no user message to attach them to.
    """
    extra = [{"type": "image", "image": s} for s in _sources(images, "images")]
    extra += [{"type": "video", "video": s} for s in _sources(videos, "videos")]
    if extra:
        last = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
        if last is None:
            raise ValueError(
                "images/videos were given but there is no user message to attach them to; "
                "add a user message"
            )
        msg = dict(messages[last])
        content = msg["content"]
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        msg["content"] = extra + [p for p in parts if p["type"] != "text" or p["text"]]
        messages = [*messages[:last], msg, *messages[last + 1 :]]
    found = media_sources(messages)
    if len(found) > limits.max_images:
        raise MediaError(
            f"the request holds {len(found)} images and videos, more than this engine takes "
            f"({limits.max_images}, the engine option max_images); send fewer or raise it"
        )
    inputs = VisionInputs()
    temp_files: list[str] = []
    # Downloaded videos live until the request's inputs are gone.
    weakref.finalize(inputs, _remove_files, temp_files)
    for kind, source in found:
        inputs.names.append(f"{kind} {describe(source)}")
        if kind == "image":
            image = load_image(source, limits)
            inputs.images.append(image)
            digest = hashlib.sha256(f"{image.size}{image.mode}".encode() + image.tobytes())
        else:
            inputs.videos.append(resolve_video(source, limits, temp_files))
            digest = hashlib.sha256(read_file(Path(inputs.videos[-1]), limits, "video"))
        inputs.keys.append(f"{kind}:{digest.hexdigest()}")
    return messages, inputs


def _remove_files(paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _sources(value: Any, name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise TypeError(
            f"{name} must be a list of sources (paths, URLs, base64), got {describe(value)}"
        )
    return list(value)


def prepare_vision_prompt(
    loaded: LoadedVision, prompt: str, inputs: VisionInputs
) -> tuple[list[int], dict[str, Any]]:
    """Run the processor (owner thread): the expanded prompt ids and the model inputs.

    Returns:
        The prompt's token ids with each image's tokens expanded, and the keyword
        arguments ``mlx_vlm.stream_generate`` takes for them.
    """
    from mlx_vlm import prepare_inputs
    from mlx_vlm.utils import should_add_special_tokens

    model, processor = loaded.model, loaded.processor
    try:
        out = prepare_inputs(
            processor,
            images=inputs.images or None,
            videos=inputs.videos or None,
            prompts=prompt,
            image_token_index=getattr(model.config, "image_token_index", None),
            add_special_tokens=should_add_special_tokens(model.config.model_type, processor),
        )
    except (OSError, RuntimeError, ValueError) as exc:  # OpenCV's and the processors' own
        if not inputs.images and not inputs.videos:
            raise
        reason = str(exc).removeprefix("Failed to process inputs with error: ")
        raise MediaError(
            f"the model's processor cannot take {_culprit(processor, inputs)}: {reason}; pass "
            "another image or video (an extreme aspect ratio wants cropping or padding)"
        ) from None
    input_ids = out.pop("input_ids")
    kwargs = {
        "input_ids": input_ids,
        "pixel_values": out.pop("pixel_values", None),
        "mask": out.pop("attention_mask", None),
        **{k: v for k, v in out.items() if v is not None},
    }
    return [int(t) for t in input_ids.flatten().tolist()], kwargs


def _culprit(processor: Any, inputs: VisionInputs) -> str:
    """Which of a request's images or videos the processor refused, found by giving it
    each image alone; all of them named when that does not tell."""
    count = len(inputs.images) + len(inputs.videos)
    names = inputs.names or [f"image {i + 1}" for i in range(len(inputs.images))]
    if count == 1 and len(names) == 1:
        return names[0] + _pixels(inputs.images)
    image_names = [n for n in names if n.startswith("image ")]
    probe: Any = getattr(processor, "image_processor", None)
    for i, image in enumerate(inputs.images if callable(probe) else []):
        try:
            probe(images=[image], return_tensors="np")
        except Exception:  # the processor's own error types differ by family
            name = image_names[i] if i < len(image_names) else f"image {i + 1}"
            where = f"image {i + 1} of {len(inputs.images)}"
            return f"{name} ({image.width}x{image.height} pixels, {where})"
    return f"one of the request's {count} images and videos ({', '.join(names)})"


def _pixels(images: list[Image]) -> str:
    return f" ({images[0].width}x{images[0].height} pixels)" if images else ""


@dataclass
class VisionRun:
    """What one vision request's decode loop reports besides its tokens."""

    cached_tokens: int = 0
    """Prompt tokens whose KV came from the previous turn (no prefill, no image encoding)."""
    cache: Any = None
    """The KV cache the request used (owner thread only)."""


class _WithPrompt:
    """A logits processor seeing the whole prompt before the reply, as on the text path.

    mlx-vlm hands processors the tokens of its last prefill step and the reply; penalties
    (repetition, presence, frequency) and the caller's processors read the prompt too.
    """

    def __init__(self, processor: Callable[..., Any], prompt: Any):
        self._processor = processor
        self._prompt = prompt
        self._tail: int | None = None

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx

        if self._tail is None:  # the first call: mlx-vlm's tokens end the prompt
            self._tail = tokens.size
        reply = tokens[self._tail :]
        return self._processor(
            mx.concatenate([self._prompt, reply.astype(self._prompt.dtype)]), logits
        )


def with_prompt(
    processors: list[Callable[..., Any]], prompt: list[int]
) -> list[Callable[..., Any]]:
    """``processors``, each called with ``prompt`` and the reply so far (owner thread)."""
    if not processors:
        return []
    import mlx.core as mx

    tokens = mx.array(prompt, dtype=mx.uint32)
    return [_WithPrompt(processor, tokens) for processor in processors]


def vision_steps(
    loaded: LoadedVision,
    prompt: str,
    model_inputs: dict[str, Any],
    *,
    processors: list[Callable[..., Any]],
    max_tokens: int,
    sampler: Callable[[Any], Any],
    prefill_step_size: int,
    kv_options: dict[str, Any],
    turn: Any,
    run: VisionRun,
) -> Generator[tuple[int, int, bool], None, None]:
    """mlx-vlm's decode loop, one ``(token, 0, False)`` step per sampled token.

    mlx-vlm stops by itself at an end-of-sequence token without yielding it; that
    token comes last here, so the caller ends the reply as the text path does.

    ``turn`` (an ``mlx_vlm`` ``PromptCacheState``, or None) holds the previous request's
    tokens and KV cache: when this prompt extends them with text only, mlx-vlm reuses
    the cache (mRoPE state included) and prefills only the new part. The caller stores
    the finished request's tokens and ``run.cache`` there.
    """
    from mlx_vlm import stream_generate
    from mlx_vlm.models import cache

    fresh = cache.make_prompt_cache(loaded.model.language_model)
    run.cache = fresh
    results = stream_generate(
        loaded.model,
        loaded.processor,
        prompt,
        max_tokens=max_tokens,
        sampler=sampler,
        logits_processors=processors or None,
        prefill_step_size=prefill_step_size,
        prompt_cache=fresh,
        prompt_cache_state=turn,
        **kv_options,
        **model_inputs,
    )
    try:
        for result in results:
            if result.cached_tokens and run.cache is fresh:  # the previous turn's cache
                run.cached_tokens, run.cache = int(result.cached_tokens), turn.cache
            if result.token is None:  # nothing generated
                return
            if result.finish_reason is None:
                yield int(result.token), 0, False
            elif result.finish_reason == "stop":  # the end-of-sequence token, unseen so far
                yield int(result.token), 0, False
                return
            else:  # "length" repeats the last token
                return
    finally:
        results.close()
