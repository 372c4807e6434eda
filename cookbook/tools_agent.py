"""An agent with tools on a local model: LangChain's create_agent calls a tool, then
answers in a schema, streamed as it goes.

- ``RequireToolCall`` makes the model call a tool before it answers: a 135M model asked
  about the weather would answer from memory. Constrained decoding keeps the call
  valid; once the result is in, the model answers from it. A model that calls tools
  well on its own needs no middleware.
- ``response_format=Weather``: the answer is a ``Weather`` object. ChatMLX's profile says
  it does structured output, so the agent asks for JSON in that schema, and constrained
  decoding holds the model to it.
- ``stream_mode=["messages", "updates"]``: the answer's tokens as they come, and each
  step (tool call, tool result, structured response) when it is done.

Run: python cookbook/tools_agent.py ["your question"]
"""

from __future__ import annotations

import sys
from typing import Literal

from example_model import example_model
from langchain.agents import create_agent
from langchain_core.tools import tool
from pydantic import BaseModel, Field

from mlx_integrations.langchain import ChatMLX, RequireToolCall


@tool
def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return f"It is 21 degrees and sunny in {city}."


class Weather(BaseModel):
    """The weather in a city."""

    city: str = Field(max_length=40)
    degrees: int = Field(ge=-90, le=60, description="Temperature in degrees Celsius")
    sky: Literal["sunny", "cloudy", "rainy", "snowy"]


def main() -> None:
    question = " ".join(sys.argv[1:]) or "What is the weather in Paris?"
    llm = ChatMLX(model=example_model(), temperature=0, max_tokens=64, repetition_penalty=1.2)
    agent = create_agent(
        llm,
        tools=[get_weather],
        middleware=[RequireToolCall()],
        response_format=Weather,
    )
    print(f"> {question}")
    answering = False
    weather = None
    for mode, data in agent.stream(
        {"messages": [("human", question)]}, stream_mode=["messages", "updates"]
    ):
        if mode == "messages":  # one token (a message chunk) of a model step
            token, meta = data
            if meta["langgraph_node"] == "model" and token.content:
                print("" if answering else "[answer] ", token.content, sep="", end="", flush=True)
                answering = True
            continue
        for update in data.values():  # a step is done
            for message in (update or {}).get("messages", []):
                for call in getattr(message, "tool_calls", None) or []:
                    print(f"[tool call] {call['name']}({call['args']})")
                if message.type == "tool":
                    print(f"[tool result] {message.content}")
            weather = (update or {}).get("structured_response") or weather
    print()
    print(repr(weather))


if __name__ == "__main__":
    main()
