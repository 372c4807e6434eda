"""MLXLLM against the LlamaIndex conformance suite, on a tiny random model.

Tool calls and structured output are guaranteed by constrained decoding, so even a
random model passes; the suite runs again on SmolLM2 in test_mlxllm_smollm.py.
"""

from __future__ import annotations

import pytest
from llama_index.core.tools import FunctionTool

from mlx_integrations.llama_index import MLXLLM
from tests.llama_index.conformance import LLMConformanceTests


def lucky_number(color: str) -> str:
    """Give the lucky number of a color (red, green or blue)."""
    return {"red": "7", "green": "3", "blue": "9"}.get(color, "0")


@pytest.fixture(scope="module")
def tool() -> FunctionTool:
    tool = FunctionTool.from_defaults(lucky_number)
    # A random model rarely closes a free string: bound the argument.
    tool.metadata.fn_schema.model_fields["color"].json_schema_extra = {
        "enum": ["red", "green", "blue"]
    }
    tool.metadata.fn_schema.model_rebuild(force=True)
    return tool


@pytest.fixture(scope="module")
def llm(tiny_llama) -> MLXLLM:
    return MLXLLM(model=str(tiny_llama), temperature=0, max_tokens=16)


class TestMLXLLMConformanceTiny(LLMConformanceTests):
    """The whole suite on a random Llama-shaped model."""
