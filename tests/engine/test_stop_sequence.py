"""A stop string ends a reply with finish_reason "stop" and is reported as the one that
ended it, also when it lay in text the detokenizer held back to the last token."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_integrations.engine import BatchedEngine, SimpleEngine

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.mark.parametrize("engine_class", [SimpleEngine, BatchedEngine])
async def test_the_stop_string_is_reported(tiny_llama: Path, engine_class):
    engine = engine_class(tiny_llama)
    try:
        whole = await engine.chat(MESSAGES, max_tokens=10, temperature=0)
        assert whole.finish_reason == "length" and len(whole.text) > 4
        assert whole.stop_sequence is None
        # This model's greedy reply is one token of an incomplete character, again and
        # again: its text comes out only when the reply ends.
        stop = whole.text[2:4]
        stopped = await engine.chat(MESSAGES, max_tokens=10, temperature=0, stop=[stop, "zzz"])
        assert stopped.text == whole.text[: whole.text.index(stop)]
        assert stopped.finish_reason == "stop"
        assert stopped.stop_sequence == stop
    finally:
        await engine.stop()
