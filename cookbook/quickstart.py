"""Quick start: stream an answer from a local MLX model through LangChain.

Run: python cookbook/quickstart.py ["your question"]
"""

from __future__ import annotations

import sys

from example_model import example_model

from mlx_integrations.langchain import ChatMLX


def main() -> None:
    question = " ".join(sys.argv[1:]) or "What is the capital of France? Answer in one sentence."
    llm = ChatMLX(model=example_model(), temperature=0, max_tokens=96)
    print(f"> {question}")
    last = None
    for chunk in llm.stream(
        [("system", "You are a concise, helpful assistant."), ("human", question)]
    ):
        print(chunk.content, end="", flush=True)
        last = chunk
    print()
    usage = last.usage_metadata if last is not None else None
    if usage:
        meta = last.response_metadata
        print(
            f"[{usage['input_tokens']} prompt + {usage['output_tokens']} generated tokens, "
            f"{meta['tokens_per_second']:.1f} tokens/s, first token after "
            f"{meta['time_to_first_token_s']:.2f}s]",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
