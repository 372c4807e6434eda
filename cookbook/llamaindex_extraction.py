"""Structured extraction with LlamaIndex: structured_predict, constrained to the schema.

Run: python cookbook/llamaindex_extraction.py
"""

from __future__ import annotations

from example_model import example_model
from llama_index.core.prompts import PromptTemplate
from pydantic import BaseModel, Field

from mlx_integrations.llama_index import MLXLLM


class Person(BaseModel):
    """A person mentioned in the text."""

    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=130)
    city: str = Field(max_length=40)


def main() -> None:
    llm = MLXLLM(model=example_model(), temperature=0, max_tokens=64, repetition_penalty=1.2)
    prompt = PromptTemplate("Extract the person from this text: {text}")
    person = llm.structured_predict(
        Person, prompt, text="Alice Martin, 34, moved to Lyon last spring."
    )
    print(repr(person))


if __name__ == "__main__":
    main()
