"""Tools and an agent: a LangGraph ReAct agent on a local model calls a tool and answers.

Small models rarely start a tool call on their own, so the model is chosen per step:
while the question is unanswered a call is required (constrained decoding guarantees a
valid one); once the tool result is in, calls are forbidden and the model answers.
With a larger model, `llm.bind_tools(tools)` (tool_choice "auto") is all you need.

Run: python cookbook/tools_agent.py
"""

from __future__ import annotations

from example_model import example_model
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent

from mlx_integrations.langchain import ChatMLX


@tool
def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return f"It is 21 degrees and sunny in {city}."


def main() -> None:
    llm = ChatMLX(model=example_model(), temperature=0, max_tokens=64, repetition_penalty=1.2)

    def model_for(state, runtime):
        needs_tool = isinstance(state["messages"][-1], HumanMessage)
        return llm.bind_tools([get_weather], tool_choice="any" if needs_tool else "none")

    agent = create_react_agent(model_for, [get_weather])
    result = agent.invoke({"messages": [("human", "What is the weather in Paris?")]})
    for message in result["messages"]:
        calls = getattr(message, "tool_calls", None)
        print(f"[{message.type}] {message.content}" + (f" {calls}" if calls else ""))


if __name__ == "__main__":
    main()
