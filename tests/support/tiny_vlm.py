"""A tiny random Qwen2.5-VL model folder, and small test images, built offline.

The folder holds what a real pulled Qwen2.5-VL holds: config.json with a
``vision_config``, safetensors weights, a tokenizer with the vision markers, the image
and video processor configs, ``processor_config.json`` (without it Qwen processors
ask the Hub) and a chat template that takes images, videos and tools. mlx-vlm loads
it with ``mlx_vlm.load``; a 112x112 image becomes 16 image tokens, and a reply of a
few tokens takes well under a second on a CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.tiny_models import (
    SPECIAL_TOKENS,
    added_tokens_decoder,
    cached_build,
    save_model,
    train_tokenizer,
)

VISION_TOKENS = [
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Qwen2.5-VL's template (images and videos as content parts, in the order given),
# with Hermes-style tools, assistant tool calls and tool results.
QWEN_VL_TEMPLATE = r"""
{%- macro render(content) -%}
{%- if content is string -%}{{- content -}}
{%- else -%}{%- for part in content -%}
{%- if part['type'] == 'image' or part['type'] == 'image_url' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
{%- elif part['type'] == 'video' -%}{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
{%- elif 'text' in part -%}{{- part['text'] -}}
{%- endif -%}
{%- endfor -%}{%- endif -%}
{%- endmacro -%}
{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0]['role'] == 'system' %}{{- render(messages[0]['content']) + '\n\n' }}{%- endif %}
{{- '# Tools\n\nYou may call one or more functions. Function signatures:\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools>\n\nFor each call, return <tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call><|im_end|>\n' }}
{%- elif messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\n' + render(messages[0]['content']) + '<|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message['role'] == 'user' or (message['role'] == 'system' and not loop.first) %}
{{- '<|im_start|>' + message['role'] + '\n' + render(message['content']) + '<|im_end|>\n' }}
{%- elif message['role'] == 'assistant' %}
{{- '<|im_start|>assistant\n' }}
{%- if message['content'] %}{{- render(message['content']) }}{%- endif %}
{%- for tool_call in message.get('tool_calls') or [] %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '<tool_call>{"name": "' + tool_call.name + '", "arguments": ' + (tool_call.arguments | tojson) + '}</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message['role'] == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + render(message['content']) + '\n</tool_response><|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
""".strip()

_IMAGE_PROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2_5_VLProcessor",
    "do_resize": True,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "do_convert_rgb": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    # Small bounds keep the image token count (and the tests) small: 112x112 -> 16.
    "min_pixels": 56 * 56,
    "max_pixels": 224 * 224,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
}


def build_tiny_vlm(
    out_dir: Path,
    *,
    arch: str = "qwen2_5_vl",
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    vision_hidden_size: int = 32,
    vision_depth: int = 2,
    seed: int = 0,
    max_position_embeddings: int = 4096,
) -> Path:
    """Write a random Qwen2.5-VL (or Qwen2-VL) folder that ``mlx_vlm.load`` opens.

    Args:
        out_dir: Folder to create.
        arch: ``"qwen2_5_vl"`` or ``"qwen2_vl"`` (mlx-vlm formats their prompts apart).
        hidden_size: Width of the language model (4 heads, 2 KV heads).
        num_hidden_layers: Depth of the language model.
        vision_hidden_size: Width of the vision tower (2 heads).
        vision_depth: Blocks of the vision tower.
        seed: Random seed of the weights.
        max_position_embeddings: Context length written to config.json.
    """
    import mlx.core as mx
    from mlx_vlm.models import qwen2_5_vl, qwen2_vl
    from tokenizers import AddedToken

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(vocab_size=400)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    ids = {t: tok.token_to_id(t) for t in (*SPECIAL_TOKENS, *VISION_TOKENS)}
    heads = 4
    head_dim = hidden_size // heads
    half = head_dim // 2
    # mrope splits each head's rotary half into temporal, height and width sections.
    mrope = [half - 2 * (half * 3 // 8), half * 3 // 8, half * 3 // 8]
    config = {
        "architectures": [
            "Qwen2_5_VLForConditionalGeneration"
            if arch == "qwen2_5_vl"
            else "Qwen2VLForConditionalGeneration"
        ],
        "model_type": arch,
        "hidden_size": hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "intermediate_size": 2 * hidden_size,
        "num_attention_heads": heads,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "vocab_size": tok.get_vocab_size(),
        "max_position_embeddings": max_position_embeddings,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": mrope},
        # An own output head: random tied weights tend to repeat one token.
        "tie_word_embeddings": False,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "vision_token_id": ids["<|vision_pad|>"],
        "torch_dtype": "float32",
        "vision_config": {
            "model_type": "qwen2_5_vl",
            "depth": vision_depth,
            "hidden_size": vision_hidden_size,
            "intermediate_size": 2 * vision_hidden_size,
            "out_hidden_size": hidden_size,
            "num_heads": 2,
            "in_channels": 3,
            "patch_size": 14,
            "spatial_patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [vision_depth - 1],
            "tokens_per_second": 2,
        },
    }
    if arch == "qwen2_vl":  # its vision tower: embed_dim wide, merged to the text width
        config["vision_config"] = {
            "model_type": "qwen2_vl",
            "depth": vision_depth,
            "embed_dim": vision_hidden_size,
            "hidden_size": hidden_size,
            "num_heads": 2,
            "mlp_ratio": 2,
            "in_channels": 3,
            "patch_size": 14,
            "spatial_patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        }
    elif arch != "qwen2_5_vl":
        raise ValueError(f"arch must be 'qwen2_5_vl' or 'qwen2_vl', got {arch!r}")
    module = qwen2_5_vl if arch == "qwen2_5_vl" else qwen2_vl
    # The configs as mlx_vlm.utils.load_model builds them from config.json.
    raw = json.loads(json.dumps(config))
    model_config = module.ModelConfig.from_dict(raw)
    model_config.text_config = module.TextConfig.from_dict(raw["text_config"])
    model_config.vision_config = module.VisionConfig.from_dict(raw["vision_config"])
    mx.random.seed(seed)
    model = module.Model(model_config)
    save_model(out_dir, model, config, "float32")

    tok.save(str(out_dir / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "Qwen2TokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": max_position_embeddings,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "chat_template": QWEN_VL_TEMPLATE,
        "added_tokens_decoder": added_tokens_decoder(ids),
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    )
    (out_dir / "chat_template.json").write_text(json.dumps({"chat_template": QWEN_VL_TEMPLATE}))
    (out_dir / "preprocessor_config.json").write_text(json.dumps(_IMAGE_PROCESSOR, indent=2))
    video = {
        **_IMAGE_PROCESSOR,
        "video_processor_type": "Qwen2VLVideoProcessor",
        "fps": 2.0,
        "min_frames": 2,
        "max_frames": 4,
    }
    (out_dir / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2))
    processor = "Qwen2_5_VLProcessor" if arch == "qwen2_5_vl" else "Qwen2VLProcessor"
    (out_dir / "processor_config.json").write_text(
        json.dumps({"processor_class": processor}, indent=2)
    )
    (out_dir / "generation_config.json").write_text(
        json.dumps({"eos_token_id": ids["<|im_end|>"], "do_sample": False})
    )
    return out_dir


def make_test_image(path: Path, kind: str = "stripes", size: int = 112) -> Path:
    """Write a small PNG: ``"stripes"`` (red and blue bands) or ``"checker"`` (green/white).

    The two kinds differ in every patch, so a vision model sees two different images.
    """
    from PIL import Image

    img = Image.new("RGB", (size, size))
    px = img.load()
    assert px is not None
    for y in range(size):
        for x in range(size):
            if kind == "stripes":
                px[x, y] = (220, 30, 30) if (x // 14) % 2 == 0 else (30, 30, 220)
            elif kind == "checker":
                px[x, y] = (30, 200, 60) if ((x // 28) + (y // 28)) % 2 == 0 else (250, 250, 250)
            else:
                raise ValueError(f"unknown test image kind {kind!r}; use 'stripes' or 'checker'")
    path = Path(path)
    img.save(path, format="PNG")
    return path


def cached_tiny_vlm(name: str = "tiny-qwen2.5-vl", **kwargs: object) -> Path:
    """The tiny VLM built once per machine (``$MLXI_TEST_CACHE``) and reused across runs.

    The folder name carries a hash of this module and the arguments, so a change to
    the builder builds it again. Used where a path is needed outside fixtures.
    """
    here = Path(__file__)
    return cached_build(name, build_tiny_vlm, [here, here.parent / "tiny_models.py"], **kwargs)


def make_test_video(path: Path, kind: str = "red", size: int = 112, frames: int = 4) -> Path:
    """Write a short MP4 (2 fps) whose colored band grows frame by frame: ``"red"`` or
    ``"green"``."""
    import cv2
    import numpy as np

    bgr = {"red": (0, 0, 255), "green": (0, 255, 0)}[kind]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 2.0, (size, size))
    for i in range(frames):
        frame = np.zeros((size, size, 3), np.uint8)
        frame[:, : size * (i + 1) // frames] = bgr
        writer.write(frame)
    writer.release()
    return Path(path)


def huge_png(width: int, height: int) -> bytes:
    """A valid 1-bit grey PNG of ``width`` x ``height`` pixels that takes a few KiB: its
    rows are zeros, compressed here row by row so the raw image is never in memory."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    row = bytes(1 + (width + 7) // 8)  # filter byte 0, then the packed bits
    packer = zlib.compressobj(9)
    idat = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )


def noisy_png(size: int = 300, seed: int = 0) -> bytes:
    """A ``size`` x ``size`` PNG of four-colour noise: about 23 KiB at 300 px, so its
    base64 is far longer than any file name can be."""
    import io

    import numpy as np
    from PIL import Image

    levels = np.random.default_rng(seed).integers(0, 4, (size, size), dtype=np.uint8)
    img = Image.fromarray(levels * 80).convert("RGB")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()
