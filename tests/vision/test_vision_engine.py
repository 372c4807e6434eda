"""SimpleEngine serving a vision-language model (the tiny Qwen2.5-VL) through mlx-vlm."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest

from mlx_integrations.engine import SimpleEngine

QUESTION = "Describe the image."


def _user(image: Path | str, text: str = QUESTION) -> list[dict]:
    return [
        {
            "role": "user",
            "content": [{"type": "image", "image": str(image)}, {"type": "text", "text": text}],
        }
    ]


@pytest.fixture(scope="module")
def engine(tiny_vlm: Path):
    eng = SimpleEngine(tiny_vlm)
    yield eng
    asyncio.run(eng.stop())


@pytest.fixture(scope="module")
def reference(tiny_vlm: Path, test_images: tuple[Path, Path]) -> dict[Path, tuple[list[int], int]]:
    """mlx-vlm's own greedy tokens and prompt size for each test image, 10 tokens."""
    from mlx_vlm import apply_chat_template, load, stream_generate

    model, processor = load(str(tiny_vlm))
    prompt = apply_chat_template(processor, model.config, QUESTION, num_images=1)
    out = {}
    for image in test_images:
        results = list(
            stream_generate(
                model, processor, prompt, image=[str(image)], max_tokens=10, temperature=0.0
            )
        )
        tokens = [r.token for r in results if r.finish_reason is None]
        out[image] = (tokens, results[-1].prompt_tokens)
    return out


def test_is_mllm(engine: SimpleEngine) -> None:
    assert engine.is_mllm


async def test_greedy_tokens_equal_mlx_vlm_generate(engine, test_images, reference) -> None:
    for image in test_images:
        out = await engine.chat(_user(image), max_tokens=10, temperature=0)
        want_tokens, want_prompt = reference[image]
        assert out.tokens[: len(want_tokens)] == want_tokens
        assert out.prompt_tokens == want_prompt  # the 16 image tokens are counted


async def test_two_images_give_different_replies(engine, test_images) -> None:
    outs = [await engine.chat(_user(img), max_tokens=8, temperature=0) for img in test_images]
    assert outs[0].tokens != outs[1].tokens


async def test_usage_counts_the_image_tokens(engine, test_images) -> None:
    with_image = await engine.chat(_user(test_images[0]), max_tokens=2, temperature=0)
    text_only = await engine.chat(
        [{"role": "user", "content": QUESTION}], max_tokens=2, temperature=0
    )
    # One 112x112 image: 8x8 patches of 14 px, merged 2x2 -> 16 tokens, plus its two markers.
    assert with_image.prompt_tokens - text_only.prompt_tokens == 16 + 2
    assert engine.get_stats()["last_request"]["prompt_tokens"] == text_only.prompt_tokens


async def test_streaming_equals_chat(engine, test_images) -> None:
    whole = await engine.chat(_user(test_images[1]), max_tokens=8, temperature=0)
    chunks = [
        c async for c in engine.stream_chat(_user(test_images[1]), max_tokens=8, temperature=0)
    ]
    assert "".join(c.new_text for c in chunks) == whole.text
    assert chunks[-1].tokens == whole.tokens and chunks[-1].finished
    assert chunks[-1].prompt_tokens == whole.prompt_tokens


async def test_images_argument_goes_before_the_last_user_text(engine, test_images) -> None:
    inline = await engine.chat(_user(test_images[0]), max_tokens=6, temperature=0)
    given = await engine.chat(
        [{"role": "user", "content": QUESTION}],
        images=[str(test_images[0])],
        max_tokens=6,
        temperature=0,
    )
    assert given.tokens == inline.tokens


async def test_every_source_form_gives_the_same_reply(engine, test_images) -> None:
    image = test_images[0]
    raw = base64.b64encode(image.read_bytes()).decode()
    forms = [str(image), image.as_uri(), f"data:image/png;base64,{raw}", raw]
    outs = [await engine.chat(_user(form), max_tokens=4, temperature=0) for form in forms]
    assert all(o.tokens == outs[0].tokens for o in outs)


async def test_parts_keep_their_order(engine, test_images) -> None:
    a, b = (str(p) for p in test_images)
    prompt = engine.render_prompt(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "first"},
                    {"type": "image", "image": a},
                    {"type": "text", "text": "then"},
                    {"type": "image", "image": b},
                ],
            }
        ]
    )
    image = "<|vision_start|><|image_pad|><|vision_end|>"
    assert f"first{image}then{image}" in prompt.replace(" ", "")
    ab = await engine.chat(
        [
            {
                "role": "user",
                "content": [{"type": "image", "image": a}, {"type": "image", "image": b}],
            }
        ],
        max_tokens=6,
        temperature=0,
    )
    ba = await engine.chat(
        [
            {
                "role": "user",
                "content": [{"type": "image", "image": b}, {"type": "image", "image": a}],
            }
        ],
        max_tokens=6,
        temperature=0,
    )
    assert ab.prompt_tokens == ba.prompt_tokens and ab.tokens != ba.tokens


async def test_stop_strings_and_abort(engine, test_images) -> None:
    whole = await engine.chat(_user(test_images[1]), max_tokens=8, temperature=0)
    stop = whole.text[2:4]
    cut = await engine.chat(_user(test_images[1]), max_tokens=8, temperature=0, stop=[stop])
    assert cut.finish_reason == "stop" and cut.text == whole.text[: whole.text.index(stop)]

    before = engine.get_stats()["num_requests_aborted"]
    stream = engine.stream_chat(
        _user(test_images[0]), max_tokens=64, temperature=0, request_id="v1"
    )
    first = await stream.__anext__()
    assert first.new_text or not first.finished
    assert await engine.abort_request("v1")
    rest = [c async for c in stream]
    assert rest[-1].finish_reason == "abort"
    assert engine.get_stats()["num_requests_aborted"] == before + 1


async def test_structured_output_from_a_vision_model(engine, test_images) -> None:
    import json

    schema = {
        "type": "object",
        "properties": {"color": {"type": "string", "enum": ["red", "green"]}},
        "required": ["color"],
        "additionalProperties": False,
    }
    out = await engine.chat(
        _user(test_images[0], "Which color? Answer in JSON."),
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    assert json.loads(out.text)["color"] in ("red", "green")


async def test_forced_tool_call_from_a_vision_model(engine, test_images) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "tag_image",
                "description": "Tag the image with a color",
                "parameters": {
                    "type": "object",
                    "properties": {"color": {"type": "string"}},
                    "required": ["color"],
                },
            },
        }
    ]
    out = await engine.chat(
        _user(test_images[1], "Tag it."),
        max_tokens=40,
        temperature=0,
        tools=tools,
        tool_choice="any",
    )
    assert out.text.startswith('<tool_call>{"name": "tag_image", "arguments": {"color": "')


async def test_a_quantized_kv_cache(tiny_vlm, tmp_path, test_images) -> None:
    from mlx_integrations.runtime import quantized_attention_error
    from tests.support.tiny_vlm import build_tiny_vlm

    with pytest.raises(ValueError, match="attention heads of 16 values"):
        SimpleEngine(tiny_vlm, kv_bits=8).prepare_for_start()
    if quantized_attention_error("float32", 32, 8, 32) is not None:
        pytest.skip("MLX's CUDA backend has no kernel for attention over a quantized KV cache")
    wide = build_tiny_vlm(tmp_path / "wide", hidden_size=128)  # heads of 32 values
    engine = SimpleEngine(wide, kv_bits=8, kv_group_size=32)
    try:
        outs = [await engine.chat(_user(img), max_tokens=6, temperature=0) for img in test_images]
    finally:
        await engine.stop()
    assert outs[0].tokens != outs[1].tokens and all(len(o.tokens) == 6 for o in outs)


async def test_a_second_turn_reuses_the_first_turns_cache(tiny_vlm, test_images) -> None:
    first = _user(test_images[0])
    cold = SimpleEngine(tiny_vlm, cache_memory_mb=0)
    warm = SimpleEngine(tiny_vlm)
    try:
        one = await warm.chat(first, max_tokens=6, temperature=0)
        second = [
            *first,
            {"role": "assistant", "content": one.text},
            {"role": "user", "content": "More?"},
        ]
        reused = await warm.chat(second, max_tokens=6, temperature=0)
        fresh = await cold.chat(second, max_tokens=6, temperature=0)
    finally:
        await warm.stop()
        await cold.stop()
    # The image and the first turn are not prefilled (nor encoded) again.
    assert reused.cached_tokens > one.prompt_tokens - 4 and fresh.cached_tokens == 0
    assert reused.tokens == fresh.tokens and reused.prompt_tokens == fresh.prompt_tokens
    assert warm.get_stats()["total_cached_tokens"] == reused.cached_tokens


async def test_the_previous_turn_counts_in_the_cache_stats_and_budget(
    tiny_vlm, test_images
) -> None:
    first = _user(test_images[0])
    warm = SimpleEngine(tiny_vlm)
    try:
        one = await warm.chat(first, max_tokens=6, temperature=0)
        held = warm.get_cache_stats()
        assert held["entry_count"] == 1 and held["misses"] == 1
        assert 0 < held["current_memory_mb"] <= held["max_memory_mb"]
        second = [
            *first,
            {"role": "assistant", "content": one.text},
            {"role": "user", "content": "More?"},
        ]
        reused = await warm.chat(second, max_tokens=6, temperature=0)
        stats = warm.get_cache_stats()
        assert stats["hits"] == 1 and stats["tokens_saved"] == reused.cached_tokens > 0
        assert warm.get_stats()["prefix_cache"]["entry_count"] == 1
        cleared = warm.clear_runtime_caches()
        assert cleared["dropped_entries"] == 1 and cleared["freed_cache_mb"] > 0
        assert warm.get_cache_stats()["entry_count"] == 0
    finally:
        await warm.stop()
    # A budget smaller than the turn's KV keeps nothing: the next turn prefills it all.
    small = SimpleEngine(tiny_vlm, cache_memory_mb=held["current_memory_mb"] / 2)
    try:
        await small.chat(first, max_tokens=6, temperature=0)
        assert small.get_cache_stats()["entry_count"] == 0
        again = await small.chat(second, max_tokens=6, temperature=0)
    finally:
        await small.stop()
    assert again.cached_tokens == 0 and again.tokens == reused.tokens


async def test_another_image_is_not_served_from_the_cache(tiny_vlm, test_images) -> None:
    # Image tokens are the same ids for every image: the cache must know which it holds.
    warm, cold = SimpleEngine(tiny_vlm), SimpleEngine(tiny_vlm, cache_memory_mb=0)
    try:
        one = await warm.chat(_user(test_images[0]), max_tokens=6, temperature=0)
        second = [
            *_user(test_images[1]),
            {"role": "assistant", "content": one.text},
            {"role": "user", "content": "More?"},
        ]
        got = await warm.chat(second, max_tokens=6, temperature=0)
        want = await cold.chat(second, max_tokens=6, temperature=0)
    finally:
        await warm.stop()
        await cold.stop()
    assert got.cached_tokens == 0 and got.tokens == want.tokens


async def test_mlx_work_runs_on_the_owner_thread(engine, test_images, monkeypatch) -> None:
    import threading

    import mlx_vlm

    seen: list[str] = []
    for name in ("prepare_inputs", "stream_generate"):
        real = getattr(mlx_vlm, name)

        def spy(*args, _real=real, **kwargs):
            seen.append(threading.current_thread().name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(mlx_vlm, name, spy)
    await engine.chat(_user(test_images[0]), max_tokens=2, temperature=0)
    assert len(seen) == 2 and all(n.startswith("mlxi-owner-") for n in seen)


async def test_logits_processors_see_the_whole_prompt_then_the_reply(engine, test_images) -> None:
    """As on the text path: penalties and the caller's processors read the prompt too."""
    seen: list[list[int]] = []

    def record(tokens, logits):
        seen.append(tokens.tolist())
        return logits

    plain = await engine.chat(_user(test_images[0]), max_tokens=6, temperature=0)
    out = await engine.chat(
        _user(test_images[0]), max_tokens=6, temperature=0, logits_processors=[record]
    )
    assert out.tokens == plain.tokens  # a processor that changes nothing changes nothing
    n = out.prompt_tokens  # the expanded image tokens included
    assert [len(s) for s in seen] == [n + k for k in range(len(seen))]
    assert len(seen) >= len(out.tokens) - 1
    prompt = seen[0]
    for k, tokens in enumerate(seen):
        assert tokens == prompt + out.tokens[:k]
