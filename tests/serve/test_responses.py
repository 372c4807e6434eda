"""The ``openai`` SDK's Responses API against ``/v1/responses``: text, tools, streaming."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.serve.conftest import CITY_SCHEMA, WEATHER

TOOL = {"type": "function", **WEATHER["function"]}


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_text_in_text_out(client: openai.OpenAI):
    reply = client.responses.create(
        model="exact",
        input="What is the weather in Paris?",
        max_output_tokens=8,
        temperature=0,
        instructions="Be brief.",
    )
    assert reply.object == "response"
    assert reply.status in ("completed", "incomplete")
    assert reply.output[0].type == "message"
    assert isinstance(reply.output_text, str)
    assert reply.usage is not None and 0 < reply.usage.output_tokens <= 8
    assert reply.usage.input_tokens > 0


def test_the_stream_helper_accumulates_the_response(client: openai.OpenAI):
    whole = client.responses.create(
        model="exact", input="Hello", max_output_tokens=8, temperature=0
    )
    with client.responses.stream(
        model="exact", input="Hello", max_output_tokens=8, temperature=0
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == whole.output_text
    numbers = []
    for event in client.responses.create(
        model="exact", input="Hello", max_output_tokens=4, stream=True
    ):
        numbers.append(event.sequence_number)
    assert numbers == list(range(len(numbers)))


def test_forced_function_call_and_its_output(client: openai.OpenAI):
    reply = client.responses.create(
        model="tiny",
        input="Weather in Paris?",
        tools=[TOOL],
        tool_choice="required",  # type: ignore[list-item]
        max_output_tokens=64,
        temperature=0,
    )
    calls = [o for o in reply.output if o.type == "function_call"]
    assert len(calls) == 1
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["function"]["parameters"])
    follow = client.responses.create(
        model="tiny",
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": calls[0].call_id,
                "name": "get_weather",
                "arguments": calls[0].arguments,
            },
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"},
        ],
        tools=[TOOL],
        tool_choice="none",
        max_output_tokens=4,
        temperature=0,  # type: ignore[list-item]
    )
    assert all(o.type != "function_call" for o in follow.output)
    plain = client.responses.create(
        model="tiny",
        input="Weather in Paris?",
        tools=[TOOL],
        tool_choice="none",  # type: ignore[list-item]
        max_output_tokens=1,
        temperature=0,
    )
    # The call and its output are in the prompt.
    assert follow.usage.input_tokens > plain.usage.input_tokens + 10  # type: ignore[union-attr]


def test_streamed_function_call_is_the_whole_one(client: openai.OpenAI):
    kwargs = dict(
        model="exact",
        input="Weather in Paris?",
        tools=[TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=64,
        temperature=0,
    )
    whole = client.responses.create(**kwargs)  # type: ignore[call-overload]
    with client.responses.stream(**kwargs) as stream:  # type: ignore[arg-type]
        final = stream.get_final_response()
    pick = lambda r: [(o.name, o.arguments) for o in r.output if o.type == "function_call"]  # noqa: E731
    assert pick(final) == pick(whole) and pick(whole)


def test_text_format_json_schema_holds(client: openai.OpenAI):
    reply = client.responses.create(
        model="tiny",
        input="A city as JSON.",
        max_output_tokens=120,
        temperature=0,
        text={
            "format": {"type": "json_schema", "name": "city", "schema": CITY_SCHEMA, "strict": True}
        },
    )
    jsonschema.validate(json.loads(reply.output_text), CITY_SCHEMA)


def test_stateful_fields_are_refused(client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="tiny", input="hi", previous_response_id="resp_1")
    assert caught.value.body["param"] == "previous_response_id"  # type: ignore[index]
