"""Structured output: a pydantic object from free text, valid by construction.

Run: python cookbook/structured_output.py
"""

from __future__ import annotations

from typing import Literal

from example_model import example_model
from pydantic import BaseModel, Field

from mlx_integrations.langchain import ChatMLX


class City(BaseModel):
    """A city mentioned in the text."""

    name: str = Field(description="The city's name", max_length=40)
    country: str = Field(description="The country it is in", max_length=40)
    is_capital: bool = Field(description="Whether it is the capital of its country")
    continent: Literal["Africa", "Americas", "Asia", "Europe", "Oceania"]


def main() -> None:
    llm = ChatMLX(model=example_model(), temperature=0, max_tokens=96, repetition_penalty=1.2)
    extractor = llm.with_structured_output(City)
    city = extractor.invoke("Paris is the capital of France, a country in Europe.")
    print(repr(city))


if __name__ == "__main__":
    main()
