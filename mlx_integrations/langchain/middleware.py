"""Agent middleware for LangChain 1.x ``create_agent``: make the model call a tool first.

A small local model asked a question it needs a tool for tends to answer from memory.
``tool_choice`` set on the model before ``create_agent`` does not help: the agent binds
the tools again on every step and drops it. :class:`RequireToolCall` sets the tool
choice on the step itself, while the question still lacks a tool result; ChatMLX
enforces it by constrained decoding, so the call is always a valid one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

try:
    from langchain.agents.middleware import (
        AgentMiddleware,
        ModelCallResult,
        ModelRequest,
        ModelResponse,
    )
except ImportError as exc:  # langchain is optional: only agents need it
    raise ImportError(
        "RequireToolCall needs LangChain 1.x agents; install them with: "
        'pip install "langchain>=1.0"'
    ) from exc
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import BaseTool

__all__ = ["RequireToolCall"]


class RequireToolCall(AgentMiddleware):
    """Require tool calls before the model answers, then let it answer.

    Until the current question (the messages after the last human message) holds
    ``rounds`` model turns that called tools, each model step runs with a forced tool
    choice: ``"any"``, or the one tool named. A ``response_format`` of the agent is set
    aside on those steps (it would make the model write the final answer at once) and
    applies again to the answer. After the required rounds the tools are withdrawn, so
    that the model answers from the results instead of calling again; with
    ``keep_tools=True`` they stay offered and the model decides.

    Setup:
        .. code-block:: bash

            pip install "langchain>=1.0"

    Example:
        .. code-block:: python

            from langchain.agents import create_agent
            from langchain_core.tools import tool

            from mlx_integrations.langchain import ChatMLX, RequireToolCall


            @tool
            def get_weather(city: str) -> str:
                \"\"\"Get the current weather for a city.\"\"\"
                return f"It is 21 degrees and sunny in {city}."


            agent = create_agent(
                ChatMLX(model="smollm2-135m-instruct", max_tokens=64),
                tools=[get_weather],
                middleware=[RequireToolCall()],
            )
            agent.invoke({"messages": [("human", "What is the weather in Paris?")]})

    Args:
        tools: The tool, or tools, a required call must be to (names or tool objects).
            Default: any tool of the agent.
        rounds: How many model turns must call tools before the model answers.
        keep_tools: After the required rounds, keep the tools offered (the agent's own
            tool choice) instead of withdrawing them.

    Raises:
        ValueError: ``rounds`` is below 1, or ``tools`` is empty or names a tool
            twice; at the first model step, a named tool the agent lacks.
        TypeError: ``rounds`` is not an int, or ``tools`` holds something other than
            names and tools.
    """

    def __init__(
        self,
        tools: str | BaseTool | Sequence[str | BaseTool] | None = None,
        *,
        rounds: int = 1,
        keep_tools: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(rounds, bool) or not isinstance(rounds, int):
            raise TypeError(f"rounds must be an int of 1 or more, got {rounds!r}")
        if rounds < 1:
            raise ValueError(f"rounds must be 1 or more, got {rounds}")
        self.required_tools: tuple[str, ...] | None = _tool_names(tools)
        self.rounds = rounds
        self.keep_tools = bool(keep_tools)

    def wrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], ModelResponse],
    ) -> ModelCallResult:
        """Force a tool call, or withdraw the tools, on this model step."""
        return handler(self.adjust(request))

    async def awrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], Awaitable[ModelResponse]],
    ) -> ModelCallResult:
        """Force a tool call, or withdraw the tools, on this model step."""
        return await handler(self.adjust(request))

    def adjust(self, request: ModelRequest) -> ModelRequest:
        """The request for this step: a forced call, the tools withdrawn, or unchanged.

        Raises:
            ValueError: A required tool is not among the agent's tools.
        """
        if tool_rounds(request.messages) >= self.rounds:
            return request if self.keep_tools else request.override(tools=[])
        offered = {_name_of(t): t for t in request.tools}
        if self.required_tools is None:
            if not offered:
                raise ValueError(
                    "RequireToolCall found no tools to call; pass tools=[...] to create_agent."
                )
            return request.override(tool_choice="any", response_format=None)
        missing = [name for name in self.required_tools if name not in offered]
        if missing:
            raise ValueError(
                f"RequireToolCall(tools={list(self.required_tools)}): the agent has no tool "
                f"{', '.join(map(repr, missing))}; its tools are {sorted(offered)}."
            )
        if len(self.required_tools) == 1:
            choice: str = self.required_tools[0]
        else:
            choice = "any"
        return request.override(
            tools=[offered[name] for name in self.required_tools],
            tool_choice=choice,
            response_format=None,
        )


def tool_rounds(messages: Sequence[BaseMessage]) -> int:
    """How many model turns called tools since the last human message."""
    count = 0
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            break
        if isinstance(message, AIMessage) and message.tool_calls:
            count += 1
    return count


def _name_of(tool: Any) -> str:
    if isinstance(tool, BaseTool):
        return tool.name
    if isinstance(tool, dict):
        # A provider's built-in tool, or an OpenAI-format function.
        function = tool.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return function["name"]
        return str(tool.get("name", ""))
    return str(getattr(tool, "name", ""))


def _tool_names(tools: str | BaseTool | Sequence[str | BaseTool] | None) -> tuple[str, ...] | None:
    if tools is None:
        return None
    if isinstance(tools, (str, BaseTool)):
        items: Sequence[Any] = [tools]
    elif isinstance(tools, Sequence):
        items = tools
    else:
        raise TypeError(
            f"tools must be a tool name, a tool or a list of them, got "
            f"{type(tools).__name__}: {tools!r:.80}"
        )
    names: list[str] = []
    for item in items:
        if isinstance(item, BaseTool):
            names.append(item.name)
        elif isinstance(item, str) and item:
            names.append(item)
        else:
            raise TypeError(
                f"tools must hold tool names or tools, got {type(item).__name__}: {item!r:.80}"
            )
    if not names:
        raise ValueError("tools is empty; pass a tool name, or leave tools=None for any tool")
    if len(set(names)) != len(names):
        raise ValueError(f"tools names a tool twice: {names}")
    return tuple(names)
