"""Every cookbook example runs offline, end to end, on the real SmolLM2 model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.minilm import ensure_minilm
from tests.support.tiny_vlm import cached_tiny_vlm

COOKBOOK = Path(__file__).resolve().parent.parent / "cookbook"

EXPECTED = {
    "quickstart.py": "Paris",
    "tools_agent.py": "get_weather",
    "structured_output.py": "City(",
    "rag_chain.py": "Quillby",
    "long_lived_pipeline.py": "cleared:",
    "llamaindex_rag.py": "Quillby",
    "llamaindex_agent.py": "[tool] get_weather",
    "llamaindex_extraction.py": "Person(",
    "vision_describe.py": "[retrieved] Sales chart legend",
}

pytestmark = pytest.mark.smollm


def test_every_example_is_covered():
    examples = {p.name for p in COOKBOOK.glob("*.py") if p.name != "example_model.py"}
    assert examples == set(EXPECTED)


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs(script, smollm2_path, tmp_path):
    env = {
        **os.environ,
        "MLXI_EXAMPLE_MODEL": str(smollm2_path),
        "MLXI_EXAMPLE_EMBEDDINGS": str(ensure_minilm()),
        "MLXI_EXAMPLE_VISION_MODEL": str(cached_tiny_vlm()),
        "MLXI_HOME": str(tmp_path / "store"),
        "HF_HUB_OFFLINE": "1",
    }
    done = subprocess.run(
        [sys.executable, str(COOKBOOK / script)],
        cwd=COOKBOOK,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert EXPECTED[script] in done.stdout, done.stdout[-2000:]
