"""A GGUF file is imported into the store once per content, and says so when it is.

``ChatMLX(model="x.gguf")`` resolves through :func:`resolve_model`: an import of the
same file, or of a file with the same bytes under any store name, is reused; only a
new file is converted, with one line on stderr saying what is happening.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlx_integrations.cli.main import app
from typer.testing import CliRunner

from mlx_integrations.models import ModelStore, import_model, resolve_model
from tests.models.test_gguf_import import write_tiny_gguf
from tests.support.tiny_models import train_tokenizer

IMPORTING = "into the model store as"


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two tiny GGUF files of different bytes (another ``general.name``)."""
    folder = tmp_path_factory.mktemp("gguf")
    tokenizer = train_tokenizer()
    write_tiny_gguf(folder / "tiny.gguf", tokenizer)
    write_tiny_gguf(folder / "other.gguf", tokenizer, metadata_overrides={"general.name": "x"})
    return folder / "tiny.gguf", folder / "other.gguf"


def imports(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The import lines logged so far (then forgotten)."""
    lines = [r.getMessage() for r in caplog.records if IMPORTING in r.getMessage()]
    caplog.clear()
    return lines


def test_a_gguf_imported_by_name_is_what_its_path_resolves_to(tmp_path, ggufs, caplog):
    caplog.set_level(logging.WARNING)
    store = ModelStore(tmp_path / "mlxi")
    mine = import_model(ggufs[0], "mine", store=store)
    assert resolve_model(str(ggufs[0]), store=store) == mine.path
    # The same bytes under another path (a copy, a download of the same file).
    copy = tmp_path / "elsewhere" / "renamed.gguf"
    copy.parent.mkdir()
    shutil.copyfile(ggufs[0], copy)
    assert resolve_model(str(copy), store=store) == mine.path
    assert [m.name for m in store.list()] == ["mine"] and imports(caplog) == []


def test_a_new_gguf_is_imported_once_and_says_so(tmp_path, ggufs, caplog):
    caplog.set_level(logging.WARNING)
    store = ModelStore(tmp_path / "mlxi")
    first = resolve_model(str(ggufs[1]), store=store)
    (line,) = imports(caplog)
    size = ggufs[1].stat().st_size / 1e6
    assert line.startswith(f"Importing other.gguf ({size:.1f} MB) into the model store as ")
    assert f"as {first.name} (one time: about " in line and " MB of float32 weights) ..." in line
    assert resolve_model(str(ggufs[1]), store=store) == first
    assert imports(caplog) == []
    # `mlxi import` of a file already stored names it, with no second copy.
    again = import_model(ggufs[1], "named", store=store)
    assert again.path == first and "named" in again.aliases
    assert [m.name for m in store.list()] == [first.name]
    assert "nothing was copied" in caplog.text


def test_mlxi_list_shows_each_id_once(tmp_path, ggufs, tiny_llama, monkeypatch):
    store = ModelStore(tmp_path / "mlxi")
    import_model(ggufs[0], "gguf-a", store=store)
    import_model(ggufs[0], "gguf-b", store=store)  # becomes a name of gguf-a
    resolve_model(str(ggufs[0]), store=store)  # and the path resolves to it too
    import_model(tiny_llama, "copy-1", store=store)  # one folder copied twice:
    import_model(tiny_llama, "copy-2", store=store)  # the same files, the same ID
    monkeypatch.setenv("MLXI_HOME", str(store.home))
    result = CliRunner().invoke(app, ["list"])
    assert result.exit_code == 0, result.stderr
    ids = {m["id"] for m in json.loads(CliRunner().invoke(app, ["list", "--json"]).stdout)}
    assert len(ids) == 2 and all(result.stdout.count(i) == 1 for i in ids)
    assert len(result.stdout.splitlines()) == 3  # the header and one row per ID
    assert "copy-1, copy-2" in result.stdout and "gguf-a (gguf-b)" in result.stdout
    listed = CliRunner().invoke(app, ["list", "-q"]).stdout.split()
    assert listed == ["copy-1", "copy-2", "gguf-a"]


def test_the_import_line_is_on_stderr_once(tmp_path, ggufs):
    env = {**os.environ, "MLXI_HOME": str(tmp_path / "mlxi")}
    code = (
        "import sys; from mlx_integrations.models import resolve_model; resolve_model(sys.argv[1])"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code, str(ggufs[1])],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        for _ in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr
    assert runs[0].stderr.count(IMPORTING) == 1 and runs[0].stderr.startswith("Importing ")
    assert runs[1].stderr == ""
