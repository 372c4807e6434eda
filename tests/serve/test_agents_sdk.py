"""The OpenAI Agents SDK (``openai-agents``) against the server: streamed runs over chat
completions and over Responses, each calling a tool, as an agent does."""

from __future__ import annotations

from typing import Any

import agents
import pytest
from openai import AsyncOpenAI


@agents.function_tool
def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: The city.
    """
    return f"Sunny in {city}"


@pytest.fixture(autouse=True)
def no_tracing() -> Any:
    """The SDK's traces go to OpenAI's servers: not from here."""
    agents.set_tracing_disabled(True)
    yield
    agents.set_tracing_disabled(False)


@pytest.mark.parametrize("model_class", ["OpenAIChatCompletionsModel", "OpenAIResponsesModel"])
async def test_a_streamed_run_calls_the_tool_and_ends(url: str, model_class: str):
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    model = getattr(agents, model_class)(model="tiny", openai_client=client)
    agent = agents.Agent(
        name="weather",
        instructions="Answer with the weather tool.",
        model=model,
        tools=[get_weather],
        # The tool is forced, and its output is the run's answer: one model turn.
        model_settings=agents.ModelSettings(
            tool_choice="get_weather", max_tokens=64, temperature=0, include_usage=True
        ),
        tool_use_behavior="stop_on_first_tool",
    )
    result = agents.Runner.run_streamed(agent, "What is the weather in Paris?")
    kinds = [
        event.item.type
        async for event in result.stream_events()
        if event.type == "run_item_stream_event"
    ]
    assert kinds == ["tool_call_item", "tool_call_output_item"]
    assert isinstance(result.final_output, str) and result.final_output.startswith("Sunny in ")
    # The model's turn came whole, usage included (the stream's last events).
    raw = result.raw_responses
    assert len(raw) == 1 and raw[0].usage.input_tokens > 0
    await client.close()
