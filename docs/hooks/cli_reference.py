"""MkDocs hook: the `mlxi` command reference, generated from the Typer app at build time.

A page holding the line ``<!-- mlxi reference -->`` gets it replaced by every command's
usage, arguments and options, so the reference cannot drift from the code.
"""

from __future__ import annotations

from typing import Any

MARKER = "<!-- mlxi reference -->"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    import typer
    from typer.cli import get_docs_for_click

    from mlx_integrations.cli.main import app

    command = typer.main.get_command(app)
    ctx = typer.Context(command, info_name="mlxi")
    reference = get_docs_for_click(obj=command, ctx=ctx, name="mlxi", title="`mlxi` reference")
    # One level down: the page has its own title.
    reference = reference.replace("\n## `", "\n### `")
    if reference.startswith("# "):
        reference = "#" + reference
    return markdown.replace(MARKER, reference)
