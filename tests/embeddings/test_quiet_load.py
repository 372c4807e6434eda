"""Loading an embedder prints nothing of transformers' "PyTorch was not found" warning.

The engine takes only tokenizers from transformers, which need no torch. The warning is
written by transformers' own logging handler when it is first imported, so the test
reads the stderr of a fresh process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import json, logging, os, sys
from mlx_integrations.langchain import MLXEmbeddings
from mlx_integrations.llama_index import MLXEmbedding

vectors = [
    MLXEmbeddings(model_name=sys.argv[1]).embed_query("hello"),
    MLXEmbedding(model_name=sys.argv[1]).get_text_embedding("hello"),
]
print(json.dumps({
    "dimensions": [len(v) for v in vectors],
    "transformers_imported": "transformers" in sys.modules,
    "filters_left": len(logging.getLogger("transformers").filters),
    "advisory_env": os.environ.get("TRANSFORMERS_NO_ADVISORY_WARNINGS"),
}))
"""


def test_loading_minilm_prints_no_pytorch_warning(minilm_path: Path) -> None:
    # mlx-lm, imported by other tests, silences all of transformers' advice process-wide
    # through this variable, which a child would inherit.
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_NO_ADVISORY_WARNINGS"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(minilm_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "PyTorch was not found" not in proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["dimensions"] == [384, 384] and report["transformers_imported"]
    # Only that message of that import was dropped: no filter stays, no switch is set.
    assert report["filters_left"] == 0 and report["advisory_env"] is None
