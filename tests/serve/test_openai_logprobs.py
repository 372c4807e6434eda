"""``logprobs`` and ``n`` on the OpenAI endpoints, through the ``openai`` SDK: the
numbers equal mlx-lm's own for the same tokens, the tokens listed are those of the
answer, and n choices come back with their indices."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from mlx_integrations.chat.completion import token_bytes
from mlx_integrations.serve.config import ModelConfig, ServeConfig
from mlx_integrations.serve.server import BackgroundServer
from tests.serve.conftest import WEATHER, engine_of, no_eos_bias

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
PROMPT = "The weather in Paris is"


@pytest.fixture(scope="module")
def server(
    tiny_own_head: Path, tiny_llama: Path, thinking_model: Path
) -> Iterator[BackgroundServer]:
    """``own`` (greedy replies that vary, no prefix cache), ``tiny`` and ``thinker``."""
    config = ServeConfig(
        models=[
            ModelConfig(
                "own", source=str(tiny_own_head), options={"cache_memory_mb": 0}, preload=True
            ),
            ModelConfig("tiny", source=str(tiny_llama), preload=True),
            ModelConfig("thinker", source=str(thinking_model)),
        ],
        only_listed=True,
    )
    background = BackgroundServer(config)
    background.start()
    yield background
    background.stop()


@pytest.fixture(scope="module")
def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def mlx_lm_steps(path: Path, prompt: Any, tokens: int) -> list[tuple[int, list[float]]]:
    """mlx-lm's greedy tokens with the log-probabilities it reports at each step."""
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = mlx_lm.load(str(path))
    return [
        (response.token, response.logprobs.tolist())
        for response in mlx_lm.stream_generate(
            model, tokenizer, prompt, max_tokens=tokens, sampler=make_sampler(0.0)
        )
    ]


def top(row: list[float], k: int) -> list[int]:
    return sorted(range(len(row)), key=lambda i: -row[i])[:k]


def joined_text(content: list[Any]) -> str:
    """The listed tokens' bytes joined, as text (without the blanks at its ends, which
    a reply's text leaves out at its start)."""
    return b"".join(bytes(e.bytes or []) for e in content).decode("utf-8", "replace").strip()


def text_of(tokenizer: Any, token: int) -> str:
    return token_bytes(tokenizer, token).decode("utf-8", "replace")


# ------------------------------------------------------------------ logprobs


def test_chat_logprobs_equal_mlx_lms_for_the_same_tokens(
    client: openai.OpenAI, server: Any, tiny_own_head: Path
):
    engine = engine_of(server, "own")
    prompt = engine.tokenizer.encode(engine.render_prompt(MESSAGES), add_special_tokens=False)
    reference = mlx_lm_steps(tiny_own_head, prompt, 12)
    reply = client.chat.completions.create(
        model="own",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
    )
    assert reply.usage is not None and reply.usage.prompt_tokens == len(prompt)
    choice = reply.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    # The end-of-sequence token, if it came, adds no text: it is not listed.
    assert len(reference) - 1 <= len(content) <= len(reference)
    for entry, (token, row) in zip(content, reference, strict=False):
        assert entry.token == text_of(engine.tokenizer, token)
        assert entry.logprob == pytest.approx(row[token], abs=1e-4)
        best = top(row, 5)
        assert [t.token for t in entry.top_logprobs] == [text_of(engine.tokenizer, i) for i in best]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(
            [row[i] for i in best], abs=1e-4
        )
    assert joined_text(content) == (choice.message.content or "").strip()

    stream = client.chat.completions.create(
        model="own",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
        stream=True,
    )
    streamed, text = [], ""
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            if c.logprobs is not None and c.logprobs.content:
                streamed += c.logprobs.content
                assert c.delta.content or not c.delta.model_dump(exclude_none=True)
    assert text == choice.message.content
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    assert [e.top_logprobs for e in streamed] == [e.top_logprobs for e in content]


def test_completion_logprobs_in_the_legacy_shape_equal_mlx_lms(
    client: openai.OpenAI, server: Any, tiny_own_head: Path
):
    tokenizer = engine_of(server, "own").tokenizer
    reference = mlx_lm_steps(tiny_own_head, PROMPT, 10)
    reply = client.completions.create(
        model="own", prompt=PROMPT, max_tokens=10, temperature=0, logprobs=3
    )
    choice = reply.choices[0]
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs
    assert logprobs.top_logprobs is not None and logprobs.text_offset is not None
    assert len(reference) - 1 <= len(logprobs.tokens) <= len(reference)
    for i, (token, row) in enumerate(reference[: len(logprobs.tokens)]):
        assert logprobs.tokens[i] == text_of(tokenizer, token)
        assert logprobs.token_logprobs[i] == pytest.approx(row[token], abs=1e-4)
        alternatives = logprobs.top_logprobs[i]
        best = top(row, 3)
        # The 3 most likely tokens, and the token itself (greedy: one of them).
        assert sorted(alternatives.values(), reverse=True) == pytest.approx(
            sorted({text_of(tokenizer, t): row[t] for t in best}.values(), reverse=True),
            abs=1e-4,
        )
    # Each token's text starts at its offset in the choice's text (a random model
    # writes parts of characters too, which read as U+FFFD; the first token's leading
    # blank is not in the text, as this tokenizer decodes it).
    ends = [*logprobs.text_offset[1:], len(choice.text)]
    for i, (token, start, end) in enumerate(
        zip(logprobs.tokens, logprobs.text_offset, ends, strict=True)
    ):
        if "\ufffd" not in choice.text[start:end] + token:
            assert choice.text[start:end] == (token.lstrip() if i == 0 else token)
    assert logprobs.text_offset == sorted(logprobs.text_offset)

    streamed: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for chunk in client.completions.create(
        model="own", prompt=PROMPT, max_tokens=10, temperature=0, logprobs=3, stream=True
    ):
        part = chunk.choices[0].logprobs if chunk.choices else None
        for key in streamed:
            streamed[key] += getattr(part, key, None) or []
    assert streamed == {
        "tokens": logprobs.tokens,
        "token_logprobs": logprobs.token_logprobs,
        "text_offset": logprobs.text_offset,
    }


def test_echo_with_logprobs_scores_the_prompt(client: openai.OpenAI, tiny_own_head: Path):
    """The prompt's tokens come first, the first with null, each with mlx-lm's
    log-probability given the tokens before it (one forward pass of its model); then
    the generated token, listed whatever its text."""
    import mlx.core as mx
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(tiny_own_head))
    ids = tokenizer.encode(PROMPT)
    logits = model(mx.array(ids)[None])[0].astype(mx.float32)
    rows = (logits - mx.logsumexp(logits, axis=-1, keepdims=True)).tolist()
    reply = client.completions.create(
        model="own", prompt=PROMPT, max_tokens=1, temperature=0, echo=True, logprobs=2
    )
    choice = reply.choices[0]
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.token_logprobs is not None
    assert logprobs.top_logprobs is not None and logprobs.text_offset is not None
    assert choice.text.startswith(PROMPT)
    assert len(logprobs.token_logprobs) == len(ids) + 1  # the prompt's, and the reply's
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    for i in range(1, len(ids)):
        assert logprobs.token_logprobs[i] == pytest.approx(rows[i - 1][ids[i]], abs=1e-4)
        best = {text_of(tokenizer, t): rows[i - 1][t] for t in top(rows[i - 1], 2)}
        best.setdefault(text_of(tokenizer, ids[i]), rows[i - 1][ids[i]])
        assert logprobs.top_logprobs[i] == pytest.approx(best, abs=1e-4)
    # The generated token: the most likely after the prompt (greedy).
    assert logprobs.token_logprobs[-1] == pytest.approx(max(rows[-1]), abs=1e-4)
    assert logprobs.tokens[-1] == text_of(tokenizer, top(rows[-1], 1)[0])
    assert reply.usage is not None and reply.usage.prompt_tokens == len(ids)
    # Each prompt token starts where its text does in the echo.
    for token, offset in zip(logprobs.tokens[1 : len(ids)], logprobs.text_offset[1:], strict=False):
        assert PROMPT[offset:].startswith(token)

    streamed: dict[str, list[Any]] = {"tokens": [], "token_logprobs": []}
    text = ""
    for chunk in client.completions.create(
        model="own", prompt=PROMPT, max_tokens=1, temperature=0, echo=True, logprobs=2, stream=True
    ):
        part = chunk.choices[0].logprobs if chunk.choices else None
        text += chunk.choices[0].text if chunk.choices else ""
        for key in streamed:
            streamed[key] += getattr(part, key, None) or []
    assert text == choice.text
    assert streamed == {"tokens": logprobs.tokens, "token_logprobs": logprobs.token_logprobs}


def test_token_id_prompts_and_max_tokens_0_score_alone(client: openai.OpenAI, tiny_own_head: Path):
    """What lm-evaluation-harness sends for a loglikelihood request: token ids, echo,
    logprobs=1; with max_tokens=0 only the prompt is read. Two prompts, two choices."""
    import mlx_lm

    _, tokenizer = mlx_lm.load(str(tiny_own_head))
    first, second = tokenizer.encode(PROMPT), tokenizer.encode("Rain in London")
    reply = client.completions.create(
        model="own", prompt=[first, second], max_tokens=0, echo=True, logprobs=1
    )
    assert [c.index for c in reply.choices] == [0, 1]
    for choice, ids in zip(reply.choices, [first, second], strict=True):
        assert choice.finish_reason == "length"
        assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
        assert len(choice.logprobs.token_logprobs) == len(ids)
        assert choice.text == tokenizer.decode(ids)
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(first) + len(second)
    assert reply.usage.completion_tokens == 0
    # The same scores as the text prompt's.
    by_text = client.completions.create(
        model="own", prompt=PROMPT, max_tokens=0, echo=True, logprobs=1
    )
    assert by_text.choices[0].logprobs.token_logprobs == pytest.approx(  # type: ignore[union-attr]
        reply.choices[0].logprobs.token_logprobs  # type: ignore[union-attr]
    )
    # Token ids generate too, as their text does.
    ids_reply = client.completions.create(model="own", prompt=first, max_tokens=5, temperature=0)
    text_reply = client.completions.create(model="own", prompt=PROMPT, max_tokens=5, temperature=0)
    assert ids_reply.choices[0].text == text_reply.choices[0].text


@pytest.mark.parametrize(
    ("arguments", "param", "words"),
    [
        ({"prompt": PROMPT, "max_tokens": 0}, "max_tokens", "taken with echo"),
        ({"prompt": [1, 10**8], "echo": True, "logprobs": 1}, "prompt[1]", "outside the vocab"),
        ({"prompt": [[1, 2], [3, 10**8]], "echo": True, "logprobs": 1}, "prompt[1][1]", "outside"),
        ({"prompt": [[1, 10**8]], "echo": True, "logprobs": 1}, "prompt[0][1]", "outside"),
        ({"prompt": [[1, 2], [3, 10**8]], "max_tokens": 1}, "prompt[1][1]", "outside"),
        ({"prompt": [1, -1], "echo": True, "logprobs": 1}, "prompt[1]", "outside the vocab"),
        ({"prompt": [1, 2**70], "echo": True}, "prompt[1]", "outside the vocab"),
        ({"prompt": [1, 10**8], "echo": True, "max_tokens": 0}, "prompt[1]", "outside"),
        ({"prompt": "", "echo": True, "max_tokens": 0}, "prompt", "empty"),
        (
            {"prompt": ["fine", ""], "echo": True, "max_tokens": 0},
            "prompt",
            "none of them empty",
        ),
        ({"prompt": [], "max_tokens": 1}, "prompt", "non-empty"),
        ({"prompt": PROMPT, "max_tokens": 1, "logprobs": 21}, "logprobs", "20"),
    ],
)
def test_bad_completions_are_a_400_naming_the_field(
    client: openai.OpenAI, arguments: dict[str, Any], param: str, words: str
):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="own", **arguments)
    body = caught.value.body
    assert isinstance(body, dict) and body["param"] == param
    assert words in body["message"]
    # The engine serves on.
    assert client.completions.create(model="own", prompt=PROMPT, max_tokens=2).choices


def test_reasoning_tokens_are_not_listed(client: openai.OpenAI, thinking_model: Path):
    """The thinking (cut after 3 tokens by its budget) and its end marker are left out:
    the tokens listed are those of the answer."""
    reply = client.chat.completions.create(
        model="thinker",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=14,
        temperature=0,
        logprobs=True,
        extra_body={"thinking_budget": 3},
    )
    choice = reply.choices[0]
    assert (choice.message.model_extra or {}).get("reasoning_content")
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert joined_text(choice.logprobs.content) == (choice.message.content or "").strip()
    assert reply.usage is not None
    assert len(choice.logprobs.content) < reply.usage.completion_tokens


def test_a_tool_calls_markup_is_not_listed(client: openai.OpenAI):
    reply = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=64,
        temperature=0,
        logprobs=True,
    )
    choice = reply.choices[0]
    assert choice.message.tool_calls
    assert choice.logprobs is not None and choice.logprobs.content == []


# ------------------------------------------------------------------------- n


def test_n_choices_each_sample_with_the_seed_plus_their_index(client: openai.OpenAI):
    def ask(**extra: Any) -> Any:
        return client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=1.0,
            **extra,
        )

    many = ask(n=3, seed=7)
    assert [c.index for c in many.choices] == [0, 1, 2]
    for i, choice in enumerate(many.choices):
        alone = ask(seed=7 + i)
        assert choice.message.content == alone.choices[0].message.content
    assert len({c.message.content for c in many.choices}) > 1
    single = ask(seed=7)
    assert many.usage is not None and single.usage is not None
    assert many.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counts once
    alone_tokens = [ask(seed=7 + i).usage.completion_tokens for i in range(3)]  # type: ignore[union-attr]
    assert many.usage.completion_tokens == sum(alone_tokens)

    stream = ask(n=3, seed=7, stream=True, stream_options={"include_usage": True})
    texts = {0: "", 1: "", 2: ""}
    finished, usage = set(), None
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
        usage = chunk.usage or usage
    assert finished == {0, 1, 2}
    assert [texts[i] for i in range(3)] == [c.message.content for c in many.choices]
    assert usage is not None and usage.completion_tokens == many.usage.completion_tokens


def test_n_with_logprobs_gives_each_choice_its_own(client: openai.OpenAI):
    reply = client.chat.completions.create(
        model="own",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=6,
        temperature=1.0,
        seed=3,
        n=2,
        logprobs=True,
        top_logprobs=2,
    )
    for choice in reply.choices:
        assert choice.logprobs is not None and choice.logprobs.content is not None
        assert joined_text(choice.logprobs.content) == (choice.message.content or "").strip()
        assert all(len(e.top_logprobs) == 2 for e in choice.logprobs.content)


def test_completions_n_per_prompt(client: openai.OpenAI, server: Any):
    reply = client.completions.create(
        model="tiny", prompt=["one", "two"], n=2, max_tokens=4, temperature=1.0, seed=11
    )
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    again = client.completions.create(
        model="tiny", prompt="two", max_tokens=4, temperature=1.0, seed=11 + 3
    )
    assert reply.choices[3].text == again.choices[0].text
    # Several prompts stream too, each choice under its index.
    texts: dict[int, str] = {}
    body = {
        "model": "tiny",
        "prompt": ["one", "two"],
        "n": 2,
        "max_tokens": 4,
        "temperature": 1.0,
        "seed": 11,
        "stream": True,
    }
    for chunk in client.completions.create(**body):  # type: ignore[call-overload]
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert [texts[i] for i in range(4)] == [c.text for c in reply.choices]
    assert engine_of(server, "tiny").get_stats()["num_running"] == 0


def test_n_out_of_range_is_a_400_naming_it(server: Any):
    body = {"model": "tiny", "messages": MESSAGES, "n": 64}
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "n"
    assert "32" in reply.json()["error"]["message"]


def test_n_choices_decode_in_one_batch(client: openai.OpenAI, server: Any):
    engine = engine_of(server, "tiny")
    before = engine.get_stats()
    reply = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=6,
        temperature=1.0,
        n=4,
        logit_bias=no_eos_bias(engine),
    )
    assert [c.finish_reason for c in reply.choices] == ["length"] * 4
    after = engine.get_stats()
    steps = after["steps_executed"] - before["steps_executed"]
    solo = after["solo_tokens"] - before["solo_tokens"]
    # One choice after the other would take 4 x 6 steps; together, about 6.
    assert steps + solo < 2 * 6
