"""``timeout``: a call that outlasts it is stopped on the engine and raises TimeoutError.

The model is held still by a logits processor that blocks the owner thread until the
test releases it, which the test does only once the call has raised: the deadline
passes while the engine is stuck, whatever the machine's speed (without the timeout,
the call would wait for the release and then finish normally).
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import pytest

TIMEOUT = 0.2
MESSAGE = (
    r"did not finish within timeout=0\.2 s, so its request was stopped on the engine\. "
    r"Raise timeout .* or lower max_tokens \(now 400\)"
)


class Blocker:
    """A logits processor that holds the owner thread at its ``at``-th token until the
    test releases it (or 20 s pass, so that a call that does not time out still ends)."""

    def __init__(self, at: int = 1) -> None:
        self.at = at
        self.calls = 0
        self.release = threading.Event()

    def __call__(self, tokens: Any, logits: Any) -> Any:
        self.calls += 1
        if self.calls == self.at:
            self.release.wait(20)
        return logits


def chatmlx(path: Path, **fields: Any) -> Any:
    from mlx_integrations.langchain import ChatMLX

    return ChatMLX(model=str(path), temperature=0, max_tokens=400, **fields)


def mlxllm(path: Path, **fields: Any) -> Any:
    from mlx_integrations.llama_index import MLXLLM

    return MLXLLM(model=str(path), temperature=0, max_tokens=400, **fields)


def user(text: str) -> list[Any]:
    from llama_index.core.base.llms.types import ChatMessage

    return [ChatMessage(role="user", content=text)]


def counts(llm: Any) -> tuple[int, int]:
    stats = llm.get_stats()
    return stats["num_requests_processed"], stats["num_requests_aborted"]


def check_stopped_and_serving(llm: Any, blocker: Blocker, before: tuple[int, int]) -> None:
    """After the release: the timed-out request generated nothing more, and the engine
    answers the next call in full."""
    blocker.release.set()
    reply = llm.invoke("Hi", max_tokens=3, timeout=None) if hasattr(llm, "invoke") else None
    if reply is None:
        reply = llm.chat(user("Hi"), max_tokens=3, timeout=None)
        assert reply.raw["finish_reason"] == "length"
    else:
        assert reply.response_metadata["finish_reason"] == "length"
    assert blocker.calls <= blocker.at  # stopped at the token it was held on
    processed, aborted = counts(llm)
    assert (processed, aborted) == (before[0] + 1, before[1] + 1)


@pytest.mark.parametrize("engine_type", ["simple", "batched"])
def test_invoke_times_out_and_the_engine_serves_the_next_call(tiny_llama: Path, engine_type):
    llm = chatmlx(tiny_llama, timeout=TIMEOUT, engine_type=engine_type)
    llm.invoke("Warm up", max_tokens=1, timeout=None)
    before = counts(llm)
    blocker = Blocker()
    with pytest.raises(TimeoutError, match=MESSAGE):
        llm.invoke("Hello", logits_processors=[blocker])
    check_stopped_and_serving(llm, blocker, before)


def test_stream_times_out_between_two_tokens(tiny_llama: Path):
    llm = chatmlx(tiny_llama, timeout=TIMEOUT)
    llm.invoke("Warm up", max_tokens=1, timeout=None)
    before = counts(llm)
    blocker = Blocker(at=3)
    chunks = []
    with pytest.raises(TimeoutError, match=MESSAGE):
        for chunk in llm.stream("Hello", logits_processors=[blocker]):
            chunks.append(chunk)
    assert not any(c.response_metadata.get("finish_reason") for c in chunks)
    check_stopped_and_serving(llm, blocker, before)


async def test_ainvoke_and_astream_time_out(tiny_llama: Path):
    llm = chatmlx(tiny_llama, timeout=TIMEOUT)
    await llm.ainvoke("Warm up", max_tokens=1, timeout=None)
    for method in ("ainvoke", "astream"):
        blocker = Blocker()
        with pytest.raises(TimeoutError, match=MESSAGE):
            if method == "ainvoke":
                await llm.ainvoke("Hello", logits_processors=[blocker])
            else:
                async for _ in llm.astream("Hello", logits_processors=[blocker]):
                    pass
        blocker.release.set()
    reply = await llm.ainvoke("Hi", max_tokens=3, timeout=None)
    assert reply.response_metadata["finish_reason"] == "length"


def test_batch_and_a_per_call_timeout(tiny_llama: Path):
    llm = chatmlx(tiny_llama)  # no timeout of its own
    llm.invoke("Warm up", max_tokens=1, timeout=None)
    before = counts(llm)
    blocker = Blocker()
    with pytest.raises(TimeoutError, match=MESSAGE):
        llm.batch(["Hello", "Bonjour"], logits_processors=[blocker], timeout=TIMEOUT)
    blocker.release.set()
    outs = llm.batch(["Hi", "Salut"], max_tokens=3, timeout=None)
    assert [o.response_metadata["finish_reason"] for o in outs] == ["length", "length"]
    # Both requests may share the step the blocker held (they arrived together): that
    # step ends with one call a row; no later step runs for them.
    assert blocker.calls <= 2
    processed, aborted = counts(llm)
    assert processed == before[0] + 2 and aborted == before[1] + 2


def test_mlxllm_chat_stream_and_raw_completion_time_out(tiny_llama: Path):
    llm = mlxllm(tiny_llama, timeout=TIMEOUT)
    llm.chat(user("Warm up"), max_tokens=1, timeout=None)
    before = counts(llm)
    calls = [
        lambda p: llm.chat(user("Hello"), logits_processors=[p]),
        lambda p: list(llm.stream_chat(user("Hello"), logits_processors=[p])),
        lambda p: llm.complete("Once upon a time", formatted=True, logits_processors=[p]),
    ]
    for call in calls:
        blocker = Blocker()
        with pytest.raises(TimeoutError, match=MESSAGE):
            call(blocker)
        blocker.release.set()
    reply = llm.chat(user("Hi"), max_tokens=3, timeout=None)
    assert reply.raw["finish_reason"] == "length"
    processed, aborted = counts(llm)
    assert processed == before[0] + 1 and aborted == before[1] + 3


async def test_mlxllm_achat_times_out(tiny_llama: Path):
    llm = mlxllm(tiny_llama, timeout=TIMEOUT)
    blocker = Blocker()
    with pytest.raises(TimeoutError, match=MESSAGE):
        await llm.achat(user("Hello"), logits_processors=[blocker])
    blocker.release.set()
    assert (await llm.achat(user("Hi"), max_tokens=3, timeout=None)).raw[
        "finish_reason"
    ] == "length"


@pytest.mark.parametrize("make", [chatmlx, mlxllm], ids=["ChatMLX", "MLXLLM"])
@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (0, ValueError, "positive finite number of seconds, got 0"),
        (-1.5, ValueError, "positive finite number of seconds, got -1.5"),
        (math.inf, ValueError, "positive finite number of seconds, got inf"),
        (math.nan, ValueError, "positive finite number of seconds, got nan"),
        ("5", TypeError, "timeout must be a number of seconds or None, got str '5'"),
        (True, TypeError, "timeout must be a number of seconds or None, got bool True"),
    ],
)
def test_timeout_must_be_a_positive_finite_number(tiny_llama: Path, make, value, error, message):
    with pytest.raises(error, match=message):
        make(tiny_llama, timeout=value)
    llm = make(tiny_llama, timeout=3)
    assert llm.timeout == 3.0 and make(tiny_llama).timeout is None
    call = llm.invoke if hasattr(llm, "invoke") else lambda *a, **k: llm.chat(user("Hi"), **k)
    with pytest.raises(error, match=message):
        call("Hi", timeout=value)
