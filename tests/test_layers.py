"""The package's layout holds: layers import only downward, no module loops, small rooms.

The layers, lowest first, as docs/architecture.md draws them. A module may import its
own layer and the ones below; every import counts, inside functions and under
``TYPE_CHECKING`` too, so a loop cannot hide behind a lazy import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mlx_integrations"

# Lowest first. The engine contract (engine/base.py) is the floor everyone may import.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "floor",
        (
            "mlx_integrations",
            "mlx_integrations.lazy_imports",
            "mlx_integrations.runtime",
            "mlx_integrations.engine.base",
        ),
    ),
    ("chat core", ("mlx_integrations.chat",)),
    ("model store", ("mlx_integrations.models",)),
    ("embeddings", ("mlx_integrations.embeddings",)),
    ("engines", ("mlx_integrations.engine",)),
    ("adapter settings", ("mlx_integrations.settings",)),
    ("adapters", ("mlx_integrations.langchain", "mlx_integrations.llama_index")),
    ("server", ("mlx_integrations.serve",)),
    ("coding agents", ("mlx_integrations.coding_agents",)),
    ("cli", ("mlx_integrations.cli",)),
]
MAX_MODULES_PER_FOLDER = 13
MAX_LINES = 650


def module_files() -> dict[str, Path]:
    files = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in (ROOT / "cli").rglob("*.py"):
        parts = ("mlx_integrations", *path.relative_to(ROOT).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


FILES = module_files()


def imports_of(name: str, path: Path) -> set[str]:
    """The package's modules that ``name`` imports (the longest known prefix of each)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            while target and target not in FILES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: imports_of(name, path) for name, path in FILES.items()}


def layer_of(module: str) -> int:
    best, layer = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, layer = len(prefix), index
    assert layer >= 0, f"{module} is on no layer; add it to LAYERS and docs/architecture.md"
    return layer


def test_layers_import_only_downward():
    upward = [
        f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
        for a, targets in GRAPH.items()
        for b in targets
        if layer_of(b) > layer_of(a)
    ]
    assert not upward, "\n".join(sorted(upward))


def test_no_module_loops():
    """Tarjan's strongly connected components: every component is one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in GRAPH[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for node in GRAPH:
        if node not in index:
            visit(node)
    assert not loops, f"modules that import each other: {loops}"


@pytest.mark.parametrize(
    "folder", sorted({p.parent for p in FILES.values()}), ids=lambda p: str(p.relative_to(ROOT))
)
def test_a_folder_holds_about_a_dozen_modules(folder: Path):
    modules = [p for p in folder.glob("*.py") if p.name not in {"__init__.py", "__main__.py"}]
    assert len(modules) <= MAX_MODULES_PER_FOLDER, (
        f"{folder.relative_to(ROOT)} holds {len(modules)} modules; give a concept its own package"
    )


def test_no_module_outgrows_the_limit():
    long = {
        str(p.relative_to(ROOT)): n
        for p in FILES.values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}; move out what belongs elsewhere"


def test_the_layer_test_sees_the_imports():
    """The graph is read right: known arrows are there (a broken reader passes vacuously)."""
    assert "mlx_integrations.engine.base" in GRAPH["mlx_integrations.engine.mlx_engine"]
    assert "mlx_integrations.engine.mlx_engine" in GRAPH["mlx_integrations.engine.serial"]
    assert "mlx_integrations.runtime.owner" in GRAPH["mlx_integrations.embeddings.encoder_engine"]
    assert "mlx_integrations.engine.batched.solo" in GRAPH["mlx_integrations.engine.batched.engine"]
