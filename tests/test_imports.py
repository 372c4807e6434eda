"""Public names are pinned, and importing the core loads no framework and no MLX."""

from __future__ import annotations

import subprocess
import sys

import mlx_integrations.engine as engine
import mlx_integrations.langchain as langchain
import mlx_integrations.llama_index as llama_index


def test_public_names():
    assert sorted(langchain.__all__) == ["ChatMLX", "MLXEmbeddings", "MLXRerank", "RequireToolCall"]
    assert sorted(llama_index.__all__) == [
        "MLXEmbedding",
        "MLXLLM",
        "MLXRerank",
        "react_grammar",
        "react_response_format",
    ]
    assert set(engine.__all__) >= {
        "BaseEngine",
        "BatchedEngine",
        "DistributedEngine",
        "DistributedError",
        "EngineBusy",
        "GenerationOutput",
        "SimpleEngine",
        "cleanup_startup_cancellation",
        "run_blocking_startup_work",
        "suspend_cancellation",
    }
    for module in (engine, langchain, llama_index):
        for name in module.__all__:
            assert getattr(module, name) is not None


def test_core_import_is_light():
    code = (
        "import sys, mlx_integrations, mlx_integrations.engine, mlx_integrations.langchain, "
        "mlx_integrations.llama_index; "
        "heavy = [m for m in ('mlx.core', 'langchain_core', 'llama_index.core', 'torch', "
        "'transformers') if m in sys.modules]; print(','.join(heavy))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


def test_every_package_folder_is_installed():
    """A folder with __init__.py that pyproject.toml does not list is missing from the wheel."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    listed = set(
        tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    folders = {
        ".".join(init.parent.relative_to(root).parts)
        for init in (root / "mlx_integrations").rglob("__init__.py")
    }
    folders |= {"mlx_integrations.cli"}
    assert folders <= listed, f"add {sorted(folders - listed)} to [tool.setuptools] packages"
