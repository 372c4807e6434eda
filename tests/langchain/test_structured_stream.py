"""with_structured_output streams: partial objects as the JSON grows, then the whole one;
a reply cut off at max_tokens still raises, streamed or not."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.exceptions import OutputParserException
from typing_extensions import TypedDict

from mlx_integrations.langchain import ChatMLX
from tests.support.forcing import forcing

JSON = '{"name": "Paris", "country": "France"}'


class City(TypedDict):
    name: str
    country: str


@pytest.fixture(scope="module")
def llm(tiny_llama) -> ChatMLX:
    return ChatMLX(model=str(tiny_llama), temperature=0, max_tokens=40)


def forced(llm: ChatMLX) -> dict[str, Any]:
    processor, _ = forcing(llm.engine.tokenizer, JSON)
    return {"logits_processors": [processor]}


def test_stream_yields_growing_partial_objects(llm):
    structured = llm.with_structured_output(City)
    parts = list(structured.stream("Paris", **forced(llm)))
    assert len(parts) > 2  # not one object at the end
    assert parts[-1] == {"name": "Paris", "country": "France"}
    assert any(p.get("name") == "Paris" and "country" not in p for p in parts)

    async def collect() -> list[Any]:
        return [p async for p in structured.astream("Paris", **forced(llm))]

    async_parts = asyncio.run(collect())
    assert len(async_parts) > 2 and async_parts[-1] == parts[-1]
    assert structured.invoke("Paris", **forced(llm)) == parts[-1]


def test_a_cut_off_reply_raises_streamed_or_not(llm):
    structured = llm.with_structured_output(City)
    with pytest.raises(OutputParserException, match="cut off at max_tokens") as caught:
        list(structured.stream("Paris", max_tokens=6, **forced(llm)))
    assert caught.value.llm_output.startswith('{"name"')
    with pytest.raises(OutputParserException, match="cut off at max_tokens"):
        structured.invoke("Paris", max_tokens=6, **forced(llm))
