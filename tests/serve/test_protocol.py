"""The protocol models at the wire: fields the server uses are strict (a wrong type is a
400 naming its path), fields it does not use are accepted and named in
``x-mlxi-ignored-fields``, ``param`` comes from the path and never from the wording,
and ``/openapi.json`` is a valid OpenAPI document whose request schemas take what the
real clients send."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openapi_spec_validator import validate as validate_openapi
from pydantic import BaseModel

from mlx_integrations.serve.paths import WirePaths
from mlx_integrations.serve.protocol.anthropic import MessagesRequest
from mlx_integrations.serve.protocol.base import IGNORED_HEADER, ignored_fields
from tests.serve.conftest import CITY_SCHEMA, TIME, WEATHER, sse_events

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": WEATHER["function"]["parameters"],
}


def post(url: str, path: str, body: dict[str, Any], **params: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/{path}", json=body, params=params, timeout=60)


def ignored(response: httpx.Response) -> list[str]:
    header = response.headers.get(IGNORED_HEADER)
    return header.split(",") if header else []


# ------------------------------------------------------------------ lenient


def test_unknown_fields_are_accepted_and_named_in_a_header(url: str):
    body = {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": "Be brief.", "name": "rules"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "x"}}],
            },
        ],
        "max_tokens": 2,
        "tools": [WEATHER, {**TIME, "cache_control": {"type": "ephemeral"}}],
        "stream_options": {"include_usage": True, "include_obfuscation": False},
        "store": False,
        "a_field_nobody_knows": {"deep": [1, 2]},
    }
    reply = post(url, "chat/completions", body)
    assert reply.status_code == 200, reply.text
    assert ignored(reply) == [
        "stream_options.include_obfuscation",
        "messages[0].name",
        "messages[1].content[0].cache_control",
        "tools[1].cache_control",
        "store",
        "a_field_nobody_knows",
    ]
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=60
    ) as streamed:
        assert streamed.status_code == 200
        assert ignored(streamed) == ignored(reply)
        assert [d for _, d in sse_events(streamed)][-1] == "[DONE]"
    plain = post(url, "chat/completions", {"model": "tiny", "messages": USER, "max_tokens": 2})
    assert IGNORED_HEADER not in plain.headers


def test_what_claude_code_sends_is_served(url: str):
    body = {
        "model": "tiny",
        "max_tokens": 4,
        "system": [
            {"type": "text", "text": "You are a CLI.", "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "Hi",
                        "cache_control": {"type": "ephemeral", "ttl": "1h"},
                    }
                ],
            }
        ],
        "tools": [{**ANTHROPIC_TOOL, "cache_control": {"type": "ephemeral"}}],
        "thinking": {"type": "adaptive", "display": "summarized"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "metadata": {"user_id": "user_1"},
        "temperature": 0,
    }
    assert httpx.head(f"{url}/").status_code == 200  # its first request
    reply = post(url, "messages", body, beta="true")
    assert reply.status_code == 200, reply.text
    assert reply.json()["type"] == "message"
    assert ignored(reply) == [
        "messages[0].content[0].cache_control",
        "system[0].cache_control",
        "tools[0].cache_control",
        "thinking.display",
        "metadata",
        "context_management",
    ]
    counted = post(url, "messages/count_tokens", body, beta="true")
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0


def test_what_codex_sends_is_served(url: str):
    body = {
        "model": "tiny",
        "instructions": "You are a coding agent.",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "Be brief."}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        ],
        "tools": [{"type": "function", **WEATHER["function"], "strict": False}],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": None, "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "019a-session",
        "client_metadata": {"x-codex-installation-id": "abc"},
        "max_output_tokens": 4,
        "temperature": 0,
    }
    with httpx.stream("POST", f"{url}/v1/responses", json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        assert ignored(response) == [  # store: false is honoured, not ignored
            "tools[0].strict",
            "reasoning.summary",
            "include",
            "prompt_cache_key",
            "client_metadata",
        ]
        events = [data for _, data in sse_events(response)]
    assert events[-1]["type"] == "response.completed"


def test_nested_unused_fields_are_found_in_lists_of_objects():
    request = MessagesRequest.model_validate(
        {
            "model": "m",
            "messages": USER,
            "tools": [ANTHROPIC_TOOL] * 3 + [{**ANTHROPIC_TOOL, "cache_control": {"type": "x"}}],
            "thinking": {"type": "enabled", "budget_tokens": 10, "display": "omitted"},
        }
    )
    assert ignored_fields(request) == ["tools[3].cache_control", "thinking.display"]


# ------------------------------------------------------------------- strict


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "chat/completions",
            {
                "tools": [
                    WEATHER,
                    TIME,
                    {"type": "function", "function": {"name": "f", "parameters": "{}"}},
                ]
            },
            "tools[2].function.parameters",
        ),
        (
            "chat/completions",
            {"messages": [USER[0], {"role": "user", "content": 7}]},
            "messages[1].content",
        ),
        ("chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        (
            "chat/completions",
            {"stream_options": {"include_usage": "yes"}},
            "stream_options.include_usage",
        ),
        ("chat/completions", {"max_tokens": True}, "max_tokens"),
        (
            "responses",
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}]},
            "input[0].content[0].text",
        ),
        (
            "responses",
            {"text": {"format": {"type": "json_schema", "name": "x"}}},
            "text.format.schema",
        ),
        ("completions", {"prompt": 5}, "prompt"),
        ("embeddings", {"input": "hi", "encoding_format": "hex"}, "encoding_format"),
    ],
)
def test_a_used_field_of_the_wrong_type_is_a_400_naming_its_path(url, path, body, param):
    base = {"model": "tiny", "max_tokens": 2}
    if path == "chat/completions":
        base["messages"] = USER
    elif path == "responses":
        base = {"model": "tiny", "input": "Hi"}
    elif path == "completions":
        base["prompt"] = "Hi"
    elif path == "embeddings":
        base = {"model": "tiny"}
    reply = post(url, path, {**base, **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"
    assert repr(param) in error["message"]


def test_anthropic_errors_name_the_path_in_their_own_shape(url: str):
    body = {
        "model": "tiny",
        "max_tokens": 2,
        "messages": USER,
        "tools": [ANTHROPIC_TOOL, {"name": "g", "input_schema": ["not", "an", "object"]}],
    }
    reply = post(url, "messages", body)
    assert reply.status_code == 400, reply.text
    error = reply.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "'tools[1].input_schema' must be an object" in error["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        # The chat core names these in chat-completions terms; each API's own names come back.
        ("chat/completions", {"max_completion_tokens": 0}, "max_completion_tokens"),
        ("chat/completions", {"tool_choice": "required"}, "tool_choice"),
        ("chat/completions", {"top_p": 0}, "top_p"),
        ("responses", {"max_output_tokens": 0}, "max_output_tokens"),
        (
            "responses",
            {
                "text": {
                    "format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}
                }
            },
            "text.format.schema",
        ),
        (
            "responses",
            {"tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}]},
            "tools[0].parameters",
        ),
        (
            "responses",
            {
                "input": [
                    {"role": "user", "content": "Hi"},
                    {"type": "function_call", "call_id": "c", "name": "", "arguments": "{}"},
                ]
            },
            "input[1]",
        ),
        (
            "responses",
            {"include": ["message.output_text.logprobs"], "top_logprobs": 21},
            "top_logprobs",
        ),
    ],
)
def test_chat_core_paths_come_back_in_each_apis_names(url, path, body, param):
    base: dict[str, Any] = {"model": "tiny", "max_tokens": 2, "messages": USER}
    if path == "responses":
        base = {"model": "tiny", "input": "Hi", "max_output_tokens": 2}
    reply = post(url, path, {**base, **body})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param, reply.json()


def test_param_does_not_depend_on_the_wording_of_a_message(url: str, monkeypatch):
    """With every message of the chat core and of the protocol models reworded, each
    error names the same field: the server never reads the text."""
    from mlx_integrations.chat.request import RequestError
    from mlx_integrations.serve.protocol import base

    cases = [
        (
            {"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [WEATHER]},
            "tool_choice",
        ),
        ({"temperature": -1}, "temperature"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias"),
        ({"temperature": "hot"}, "temperature"),
        ({"messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
    ]

    def params() -> list[tuple[str, str]]:
        out = []
        for extra, _ in cases:
            reply = post(
                url,
                "chat/completions",
                {"model": "tiny", "max_tokens": 2, "messages": USER, **extra},
            )
            assert reply.status_code == 400, reply.text
            error = reply.json()["error"]
            out.append((error["param"], error["message"]))
        return out

    before = params()
    assert [p for p, _ in before] == [param for _, param in cases]
    original = RequestError.__init__

    def reworded(self: Any, message: str, path: str = "") -> None:
        original(self, "Quelque chose ne va pas (tools, temperature, messages).", path)

    monkeypatch.setattr(RequestError, "__init__", reworded)
    monkeypatch.setattr(base, "_phrase", lambda error: "ne convient pas")
    after = params()
    assert [p for p, _ in after] == [p for p, _ in before]
    assert all(m1 != m2 for (_, m1), (_, m2) in zip(before, after, strict=True))


def test_wire_paths_map_the_chat_cores_names():
    paths = WirePaths(
        fields={
            "max_tokens": "max_output_tokens",
            "response_format.json_schema": "text.format",
            "response_format": "text.format",
        },
        messages=["instructions", "input[0]", "input[2]"],
        tools=["tools[1]"],
        tool_fields={"function.parameters": "parameters", "function": ""},
    )
    assert paths("max_tokens") == "max_output_tokens"
    assert paths("response_format.json_schema.schema") == "text.format.schema"
    assert paths("response_format") == "text.format"
    assert paths("messages[2].content[1]") == "input[2].content[1]"
    assert paths("messages[0]") == "instructions"
    assert paths("tools[0].function.parameters") == "tools[1].parameters"
    assert paths("tools[0].function") == "tools[1]"
    assert paths("temperature") == "temperature"
    assert WirePaths()("tools[2].function.parameters") == "tools[2].function.parameters"


# ------------------------------------------------------------------ schema


@pytest.fixture(scope="module")
def spec(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/openapi.json").json()


def test_openapi_json_is_a_valid_openapi_document_and_docs_are_served(url, spec):
    validate_openapi(spec)
    assert spec["openapi"].startswith("3.")
    assert {"/v1/chat/completions", "/v1/messages", "/v1/responses"} <= set(spec["paths"])
    page = httpx.get(f"{url}/docs")
    assert page.status_code == 200 and "swagger" in page.text.lower()


class Recorder:
    """The JSON bodies the real clients send, by path (an httpx event hook)."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[Any]] = {}

    def __call__(self, request: httpx.Request) -> None:
        if request.content:
            self.bodies.setdefault(request.url.path, []).append(json.loads(request.content))

    def client(self) -> httpx.Client:
        return httpx.Client(event_hooks={"request": [self]}, timeout=60)

    def anthropic_client(self) -> Any:
        import httpx2  # the anthropic SDK's own httpx

        return httpx2.Client(event_hooks={"request": [self]}, timeout=60)


class City(BaseModel):
    """A city."""

    name: str
    population: int


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


@pytest.fixture(scope="module")
def recorded(url: str) -> Iterator[dict[str, list[Any]]]:
    """Bodies sent by the openai, anthropic and langchain-openai clients in a few calls
    each (plain, tools, schemas, streams), all answered by the server."""
    recorder = Recorder()
    with recorder.client() as http:
        oai = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", http_client=http, max_retries=0)
        short = {"model": "tiny", "max_tokens": 2, "temperature": 0}
        oai.chat.completions.create(messages=USER, **short)  # type: ignore[arg-type]
        oai.chat.completions.create(
            messages=USER,
            tools=[WEATHER, TIME],
            tool_choice="auto",
            **short,  # type: ignore[list-item]
        )
        oai.chat.completions.create(
            messages=USER,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "city", "schema": CITY_SCHEMA},
            },
            **short,  # type: ignore[arg-type]
        )
        list(
            oai.chat.completions.create(
                messages=USER, stream=True, stream_options={"include_usage": True}, **short
            )
        )  # type: ignore[call-overload]
        oai.responses.create(
            model="tiny",
            input="Hi",
            max_output_tokens=2,
            tools=[{"type": "function", **WEATHER["function"]}],
        )  # type: ignore[list-item]
        claude = anthropic.Anthropic(
            base_url=url, api_key="unused", http_client=recorder.anthropic_client(), max_retries=0
        )
        claude.messages.create(
            model="tiny",
            max_tokens=2,
            system="Be brief.",
            messages=USER,
            tools=[ANTHROPIC_TOOL],  # type: ignore[arg-type,list-item]
            tool_choice={"type": "auto"},
            metadata={"user_id": "u"},
        )
        with claude.messages.stream(model="tiny", max_tokens=2, messages=USER) as stream:  # type: ignore[arg-type]
            stream.until_done()
        claude.messages.count_tokens(model="tiny", messages=USER)  # type: ignore[arg-type]
        chat = ChatOpenAI(
            model="tiny",
            base_url=f"{url}/v1",
            api_key="unused",
            http_client=http,  # type: ignore[arg-type]
            max_tokens=2,
            temperature=0,
            max_retries=0,
        )
        chat.invoke("Hi")
        chat.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Paris?")
        with contextlib.suppress(openai.LengthFinishReasonError):  # 2 tokens: cut short
            chat.with_structured_output(City, method="json_schema").invoke("A city")
        list(chat.stream("Hi"))
    yield recorder.bodies


def _schema_of(spec: dict[str, Any], path: str) -> dict[str, Any]:
    ref = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return {**ref, "components": spec["components"]}


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"]
)
def test_the_request_schemas_take_what_the_real_clients_send(spec, recorded, path):
    bodies = recorded[path]
    assert bodies
    validator = jsonschema.Draft202012Validator(_schema_of(spec, path))
    for body in bodies:
        validator.validate(body)
    if path == "/v1/chat/completions":  # openai and langchain-openai both
        assert len(bodies) >= 8
        assert any(b.get("tools") for b in bodies) and any(b.get("stream") for b in bodies)
    # The schema is no rubber stamp: a wrong type fails it.
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({**bodies[0], "model": 7})


# ------------------------------------------------ what the coding agents send


def test_a_system_message_in_the_conversation_joins_the_system_prompt(url: str):
    """Claude Code sends its agents' list as a system message after the first user turn."""
    base = {"model": "exact", "max_tokens": 1, "system": "Be brief."}
    alone = post(url, "messages/count_tokens", {**base, "messages": USER}).json()
    body = {**base, "messages": [*USER, {"role": "system", "content": "Agents: claude, explore."}]}
    joined = post(url, "messages/count_tokens", body)
    assert joined.status_code == 200, joined.text
    assert joined.json()["input_tokens"] > alone["input_tokens"]
    reply = post(url, "messages", {**body, "temperature": 0})
    assert reply.status_code == 200, reply.text
    image = {"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}
    refused = post(
        url, "messages", {**base, "messages": [*USER, {"role": "system", "content": [image]}]}
    )
    assert refused.status_code == 400
    assert "'messages[1].content[0].type'" in refused.json()["error"]["message"]


def test_responses_take_namespaces_and_custom_tools_and_leave_out_hosted_ones(url: str):
    """Codex sends its sub-agent tools as a namespace, web_search, and apply_patch as a
    custom (freeform) tool: the namespace's functions and the custom tool are served,
    web_search is left out and named in the header, and a namespaced function can be
    forced."""
    inner = {"type": "function", **TIME["function"]}
    body = {
        "model": "exact",
        "input": "What time is it?",
        "max_output_tokens": 40,
        "temperature": 0,
        "tools": [
            {"type": "function", **WEATHER["function"]},
            {"type": "namespace", "name": "clock", "description": "Clocks.", "tools": [inner]},
            {"type": "web_search", "external_web_access": False},
            {
                "type": "custom",
                "name": "apply_patch",
                "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "x"'},
            },
        ],
        "tool_choice": {"type": "function", "name": "get_time"},
    }
    reply = post(url, "responses", body)
    assert reply.status_code == 200, reply.text
    assert ignored(reply) == ["tools[1].name", "tools[1].description", "tools[2]"]
    calls = [item for item in reply.json()["output"] if item["type"] == "function_call"]
    assert [c["name"] for c in calls] == ["get_time"]
    jsonschema.validate(json.loads(calls[0]["arguments"]), TIME["function"]["parameters"])
    bad = {
        "type": "namespace",
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "array"}}],
    }
    refused = post(url, "responses", {**body, "tools": [bad], "tool_choice": "auto"})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "tools[0].tools[0].parameters"
