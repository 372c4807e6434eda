"""Tools and tool choice, read once at the boundary into one typed spec.

The prompt (the chat template's ``tools``), the constraint that forces a call and the
parser that reads calls back all take a :class:`ToolRequest`, so a tool is checked in
one place and every layer sees the same names and schemas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from mlx_integrations.chat.fields import RequestError, RequestTypeError, checking
from mlx_integrations.chat.schemas import check_json_schema


@dataclass(frozen=True)
class ToolSpec:
    """One function tool.

    Attributes:
        name: The function name the model writes.
        parameters: JSON schema of the arguments object (checked, enforceable).
        description: Free text shown to the model.
    """

    name: str
    parameters: dict[str, Any] = field(hash=False)
    description: str = ""
    function: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    """The function dict as given, for the chat template (its keys and their order kept)."""

    @classmethod
    def from_openai(cls, tool: Any, index: int = 0) -> ToolSpec:
        """Read an OpenAI-style tool ``{"type": "function", "function": {...}}``.

        A bare function dict (``{"name", "description", "parameters"}``) is read too.

        Raises:
            TypeError: The tool or one of its fields has the wrong type.
            ValueError: The tool has no name, or invalid parameters.
        """
        if isinstance(tool, ToolSpec):
            return tool
        where = f"tools[{index}]"
        if not isinstance(tool, Mapping):
            raise RequestTypeError(
                f"{where} must be a dict like "
                '{"type": "function", "function": {"name": ..., "parameters": {...}}}, '
                f"got {type(tool).__name__}: {tool!r:.80}",
                where,
            )
        kind = tool.get("type", "function")
        if kind != "function":
            raise RequestError(
                f"{where} has type {kind!r}; only 'function' tools can be called", f"{where}.type"
            )
        function = tool.get("function", tool)
        base = f"{where}.function" if function is not tool else where  # the path
        if not isinstance(function, Mapping):
            raise RequestTypeError(
                f"{where}['function'] must be a dict, got {type(function).__name__}", base
            )
        name = function.get("name")
        if not isinstance(name, str) or not name.strip():
            raise RequestError(
                f"{where} has no name; give the function a non-empty 'name'", f"{base}.name"
            )
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        at = f"{base}.parameters"
        if not isinstance(parameters, Mapping):
            raise RequestTypeError(
                f"Tool {name!r} ({where}): 'parameters' must be a JSON schema dict, "
                f"got {type(parameters).__name__}: {parameters!r:.80}",
                at,
            )
        if parameters.get("type", "object") != "object":
            raise RequestError(
                f"Tool {name!r} ({where}): 'parameters' must describe an object "
                f"(type 'object'), got type {parameters.get('type')!r}",
                at,
            )
        with checking(at):
            parameters = check_json_schema(parameters, f"The parameters of tool {name!r}")
            _check_required(name, parameters)
        description = function.get("description") or ""
        if not isinstance(description, str):
            raise RequestTypeError(
                f"Tool {name!r} ({where}): 'description' must be a string, "
                f"got {type(description).__name__}",
                f"{base}.description",
            )
        function = dict(function)
        function["parameters"] = parameters
        # Optional in OpenAI's format, but some templates read it unconditionally.
        function.setdefault("description", "")
        return cls(name=name, parameters=parameters, description=description, function=function)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI-style dict that chat templates take, as the caller wrote it."""
        if self.function is not None:
            return {"type": "function", "function": self.function}
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}

    @property
    def constrained_parameters(self) -> dict[str, Any]:
        """The schema a forced call is held to: closed objects, non-empty required strings."""
        return nonempty_required_strings(closed_schema(self.parameters))

    @property
    def properties(self) -> dict[str, Any]:
        """The argument schemas by name, in the schema's order."""
        props = self.parameters.get("properties")
        return dict(props) if isinstance(props, Mapping) else {}

    @property
    def required(self) -> list[str]:
        """The names of the required arguments."""
        return [str(name) for name in self.parameters.get("required") or []]


def _check_required(name: str, parameters: Mapping[str, Any]) -> None:
    """Required arguments must be listed: calls are held to the listed properties."""
    if parameters.get("additionalProperties") not in (None, False):
        return
    listed = parameters.get("properties") or {}
    missing = [r for r in parameters.get("required") or [] if r not in listed]
    if missing:
        raise ValueError(
            f"Tool {name!r} requires {missing[0]!r}, which is not among its properties "
            f"({', '.join(listed) or 'none'}); add it to 'properties' or remove it from "
            "'required'"
        )


def read_tools(tools: Any) -> tuple[ToolSpec, ...]:
    """Check OpenAI-style tools and return them as :class:`ToolSpec`.

    Raises:
        TypeError: ``tools`` is not a list, or a tool has the wrong shape.
        ValueError: A tool is invalid (the message names it). Of several tools with one
            name, the first is kept.
    """
    if tools is None:
        return ()
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise RequestTypeError(
            f"tools must be a list of tool dicts, got {type(tools).__name__}: {tools!r:.80}",
            "tools",
        )
    specs: dict[str, ToolSpec] = {}
    for i, tool in enumerate(tools):
        spec = ToolSpec.from_openai(tool, i)
        # A tool bound twice under one name (a function and its schema) is kept once:
        # the first definition is the one the model sees and the calls are checked against.
        specs.setdefault(spec.name, spec)
    return tuple(specs.values())


class ToolChoiceMode(StrEnum):
    """How a generation may call tools."""

    AUTO = "auto"
    """Free text or calls, as the model decides; a call, once opened, must be valid."""
    REQUIRED = "required"
    """One or more valid calls of any of the tools, and nothing else."""
    NAMED = "named"
    """One or more valid calls of one named tool, and nothing else."""
    NONE = "none"
    """Text only: the model is not shown the tools and cannot open a call."""


_CHOICE_HELP = (
    "use 'auto', 'none', 'required' (or 'any', True), a tool name, or "
    '{"type": "function", "function": {"name": ...}}'
)


@dataclass(frozen=True)
class ToolRequest:
    """The tools of one request and how they may be called.

    Attributes:
        tools: The tools, checked.
        mode: See :class:`ToolChoiceMode`.
        tool_name: The tool to call in ``NAMED`` mode.
        parallel: Several calls may come in one turn (else one in forced modes).
    """

    tools: tuple[ToolSpec, ...] = ()
    mode: ToolChoiceMode = ToolChoiceMode.AUTO
    tool_name: str | None = None
    parallel: bool = True

    @property
    def active(self) -> bool:
        """Tools are shown to the model and its calls are parsed."""
        return bool(self.tools) and self.mode is not ToolChoiceMode.NONE

    @property
    def forced(self) -> bool:
        """The reply must be tool calls."""
        return self.mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.NAMED)

    @property
    def callable_tools(self) -> tuple[ToolSpec, ...]:
        """The tools a call may name."""
        if self.mode is ToolChoiceMode.NAMED:
            return tuple(t for t in self.tools if t.name == self.tool_name)
        return self.tools

    def openai_tools(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template takes them; None when the model must not see them."""
        return [t.to_openai() for t in self.tools] if self.active else None


def read_tool_request(tools: Any, tool_choice: Any = None, parallel: Any = True) -> ToolRequest:
    """Check ``tools`` and ``tool_choice`` together; the one entry point for both.

    Args:
        tools: OpenAI-style tool dicts (or :class:`ToolSpec`), or None.
        tool_choice: None or ``"auto"``, ``"none"``/False, ``"required"``/``"any"``/True,
            a tool name, or ``{"type": "function", "function": {"name": ...}}``.
        parallel: Allow several calls in one turn.

    Raises:
        TypeError / ValueError: naming the bad tool or choice and how to fix it.
    """
    specs = read_tools(tools)
    if parallel is None:  # what OpenAI clients send when they leave it to the server
        parallel = True
    if not isinstance(parallel, bool):
        raise RequestTypeError(
            f"parallel_tool_calls must be True or False, got {parallel!r}", "parallel_tool_calls"
        )
    name: str | None = None
    if tool_choice is None or tool_choice == "auto":
        mode = ToolChoiceMode.AUTO
    elif tool_choice is False or tool_choice == "none":
        mode = ToolChoiceMode.NONE
    elif tool_choice is True or tool_choice in ("required", "any"):
        mode = ToolChoiceMode.REQUIRED
    elif isinstance(tool_choice, str):
        mode, name = ToolChoiceMode.NAMED, tool_choice
    elif isinstance(tool_choice, Mapping):
        function = tool_choice.get("function", tool_choice)
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str):
            raise RequestError(
                f"tool_choice {dict(tool_choice)!r} names no function; {_CHOICE_HELP}",
                "tool_choice",
            )
        mode = ToolChoiceMode.NAMED
    else:
        raise RequestTypeError(
            f"tool_choice {tool_choice!r} is not understood; {_CHOICE_HELP}", "tool_choice"
        )
    if mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.NAMED) and not specs:
        raise RequestError(
            f"tool_choice={tool_choice!r} needs tools; bind some tools first", "tool_choice"
        )
    names = [t.name for t in specs]
    if name is not None and name not in names:
        raise RequestError(
            f"tool_choice names the tool {name!r}, which is not bound; bound tools: "
            f"{', '.join(names)}",
            "tool_choice",
        )
    return ToolRequest(specs, mode, name, parallel)


def closed_schema(schema: Any) -> Any:
    """A copy of a JSON schema where objects allow no properties beyond those listed.

    Small models like to add keys that the schema merely permits (``"type"``,
    ``"description"`` copied from the prompt); like OpenAI's strict mode, constrained
    outputs keep to the listed properties unless a schema says otherwise.
    """
    if isinstance(schema, list):
        return [closed_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed_schema(v) for k, v in schema.items()}
    is_object = out.get("type") == "object" or "properties" in out
    if is_object and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def nonempty_required_strings(schema: Any) -> Any:
    """Required string arguments must not be empty (unless the schema sets minLength).

    Forced into a call it has no words for, a small model writes ``""``; a tool's
    required string argument is practically never meant to be empty.
    """
    if isinstance(schema, list):
        return [nonempty_required_strings(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: nonempty_required_strings(v) for k, v in schema.items()}
    props = out.get("properties")
    if isinstance(props, dict):
        for name in out.get("required") or []:
            prop = props.get(name)
            if isinstance(prop, dict) and prop.get("type") == "string" and "minLength" not in prop:
                props[name] = {**prop, "minLength": 1}
    return out
