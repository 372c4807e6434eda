"""A LlamaIndex FunctionAgent with a tool, on a local model.

`initial_tool_choice="required"` makes the first step call a tool (constrained decoding
guarantees a valid call); a small model would otherwise answer without it.

Run: python cookbook/llamaindex_agent.py
"""

from __future__ import annotations

import asyncio

from example_model import example_model
from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult

from mlx_integrations.llama_index import MLXLLM


def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return f"It is 21 degrees and sunny in {city}."


async def main() -> None:
    llm = MLXLLM(model=example_model(), temperature=0, max_tokens=64, repetition_penalty=1.2)
    agent = FunctionAgent(tools=[get_weather], llm=llm, initial_tool_choice="required")
    handler = agent.run(user_msg="What is the weather in Paris?")
    async for event in handler.stream_events():
        if isinstance(event, ToolCallResult):
            print(f"[tool] {event.tool_name}({event.tool_kwargs}) -> {event.tool_output}")
    print(await handler)


if __name__ == "__main__":
    asyncio.run(main())
