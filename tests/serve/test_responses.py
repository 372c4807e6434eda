"""The ``openai`` SDK's Responses API against ``/v1/responses``: text, tools, streaming."""

from __future__ import annotations

import json
import re

import httpx
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


# A custom (freeform) tool whose input is held to a regular expression.
PATCH_RE = r"(add|drop) [a-z]{1,8}(, (add|drop) [a-z]{1,8}){0,2}"
EDIT = {
    "type": "custom",
    "name": "edit",
    "description": "Edits the list.",
    "format": {"type": "grammar", "syntax": "regex", "definition": PATCH_RE},
}
# Codex's apply_patch is a custom tool with a Lark grammar (its free lines bounded
# here: a random model would write one line until max_output_tokens).
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edits files. This is a FREEFORM tool, so do not wrap the patch in JSON.",
    "format": {
        "type": "grammar",
        "syntax": "lark",
        "definition": "start: begin hunk+ end\n"
        'begin: "*** Begin Patch" LF\n'
        'hunk: "*** Delete File: " NAME LF\n'
        'end: "*** End Patch"\n'
        "NAME: /[a-z]{1,8}\\.py/\n"
        "%import common.LF",
    },
}
PATCH = r"\*\*\* Begin Patch\n(\*\*\* Delete File: [a-z]{1,8}\.py\n)+\*\*\* End Patch"


def test_a_custom_tool_call_is_a_custom_tool_call_item(client: openai.OpenAI):
    """Served as a function of one string, the call comes back as OpenAI's custom call,
    its input held to the tool's regular expression."""
    kwargs = dict(
        model="tiny",
        input="Edit the list.",
        tools=[TOOL, EDIT],
        tool_choice={"type": "custom", "name": "edit"},
        max_output_tokens=80,
        temperature=0,
    )
    reply = client.responses.create(**kwargs)  # type: ignore[call-overload]
    [call] = [o for o in reply.output if o.type == "custom_tool_call"]
    assert call.name == "edit" and call.call_id and call.id.startswith("ctc_")
    assert re.fullmatch(PATCH_RE, call.input), call.input
    with client.responses.stream(**kwargs) as stream:  # type: ignore[arg-type]
        events = list(stream)
        final = stream.get_final_response()
    [done] = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
    [streamed] = [o for o in final.output if o.type == "custom_tool_call"]
    assert done.input == "".join(deltas) == streamed.input == call.input


def test_a_custom_tool_round_trip(client: openai.OpenAI):
    """A tool like Codex's apply_patch (a Lark grammar) is offered and forced; its call
    and output go back into the next request's input."""
    forced = client.responses.create(
        model="tiny",
        input="Patch the file.",
        tools=[APPLY_PATCH],
        tool_choice={"type": "custom", "name": "apply_patch"},
        max_output_tokens=80,
        temperature=0,
    )
    [call] = [o for o in forced.output if o.type == "custom_tool_call"]
    # A grammar without recursion holds as a pattern: the input is a patch.
    assert call.name == "apply_patch"
    assert re.fullmatch(PATCH, call.input), call.input
    history = [
        {"role": "user", "content": "Patch the file."},
        {"type": "custom_tool_call", "call_id": "call_1", "name": "apply_patch", "input": "x"},
        {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Done, 1 file."},
    ]
    follow = client.responses.create(
        model="tiny",
        input=history,  # type: ignore[arg-type]
        tools=[APPLY_PATCH],
        tool_choice="none",
        max_output_tokens=1,
        temperature=0,
    )
    plain = client.responses.create(
        model="tiny",
        input="Patch the file.",
        tools=[APPLY_PATCH],
        tool_choice="none",
        max_output_tokens=1,
        temperature=0,
    )
    # The call and its output are in the prompt.
    assert follow.usage.input_tokens > plain.usage.input_tokens + 10  # type: ignore[union-attr]


def test_store_is_used_either_way(url: str):
    body = {"model": "tiny", "input": "Hi", "max_output_tokens": 1}
    header = "x-mlxi-ignored-fields"
    for store in (False, True):
        reply = httpx.post(f"{url}/v1/responses", json={**body, "store": store}, timeout=60)
        assert reply.status_code == 200 and header not in reply.headers
        assert reply.json()["store"] is store
        kept = httpx.get(f"{url}/v1/responses/{reply.json()['id']}", timeout=60)
        assert kept.status_code == (200 if store else 404)
    include = ["reasoning.encrypted_content"]
    codex = httpx.post(
        f"{url}/v1/responses", json={**body, "store": False, "include": include}, timeout=60
    )
    assert codex.status_code == 200 and codex.headers[header] == "include"
