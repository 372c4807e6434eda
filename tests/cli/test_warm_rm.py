"""``mlxi warm --rm NAME`` / ``--rm-all`` and ``remove_warm_cache``: stored warm caches
are removed as ``mlxi rm`` removes models (real caches of the tiny Llama)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlx_integrations.cli.main import app
from typer.testing import CliRunner

from mlx_integrations.models import ModelStore
from tests.cli.test_run import Terminal


def mlxi(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def warmed(home: Path) -> Path:
    """The store's ``tiny`` with the warm caches ``default`` and ``agent``; its warm folder."""
    for name in ("default", "agent"):
        result = mlxi("warm", "tiny", "--no-weights", "--system", f"You are {name}.", "-n", name)
        assert result.exit_code == 0, result.stderr
    return home / "models" / "tiny" / "warm"


def caches() -> list[str]:
    return json.loads(mlxi("show", "tiny", "--json").stdout)["warm_caches"]


def test_rm_removes_one_cache_and_says_how_much(warmed):
    size = (warmed / "agent.safetensors").stat().st_size
    result = mlxi("warm", "tiny", "--rm", "agent")
    assert result.exit_code == 0, result.stderr
    kb = f"{size / 1000:.1f} KB"
    assert result.stdout == f"deleted warm cache 'agent' of tiny ({kb})\n"
    assert caches() == ["default"]


def test_rm_all_json_then_nothing_left(warmed):
    sizes = sum(p.stat().st_size for p in warmed.iterdir())
    result = mlxi("warm", "tiny", "--rm-all", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["dry_run"] is False and data["freed_bytes"] == sizes
    assert [c["name"] for c in data["removed"]] == ["agent", "default"]
    assert caches() == [] and not warmed.exists()
    again = mlxi("warm", "tiny", "--rm-all")
    assert again.exit_code == 0 and again.stdout == "tiny has no warm caches\n"


def test_dry_run_deletes_nothing(warmed):
    result = mlxi("warm", "tiny", "--rm", "agent", "--rm", "default", "--dry-run", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["dry_run"] is True and len(data["removed"]) == 2
    assert caches() == ["agent", "default"]


def test_an_unknown_name_removes_nothing_and_names_what_is_there(warmed):
    result = mlxi("warm", "tiny", "--rm", "agent", "--rm", "nope")
    assert result.exit_code == 1
    assert "tiny has no warm cache 'nope' (it has: agent, default)" in result.stderr
    assert "mlxi show tiny" in result.stderr
    assert caches() == ["agent", "default"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rm", "agent", "--system", "Hi"], "--system makes a cache"),
        (["--rm", "agent", "--name", "agent"], "--name makes a cache"),
        (["--rm", "agent", "--rm-all"], "not both"),
        (["--dry-run", "--system", "Hi"], "add --rm NAME or --rm-all"),
        (["--rm", "../x"], "warm cache name"),
    ],
)
def test_bad_removals_are_usage_errors(warmed, args, message):
    result = mlxi("warm", "tiny", *args)
    assert result.exit_code == 2 and message in result.stderr
    assert caches() == ["agent", "default"]


def test_a_person_at_a_terminal_is_asked(warmed):
    with Terminal(["warm", "tiny", "--rm-all"]) as term:
        term.read_until("Remove warm caches 'agent', 'default' of tiny? [y/N]: ")
        term.send("n")
        term.read_until("Nothing removed.")
        assert term.close() == 1
    assert caches() == ["agent", "default"]


def test_remove_warm_cache_from_python(warmed, home):
    from mlx_integrations.models import remove_warm_cache

    store = ModelStore(home)
    (warmed / ".agent.1234abcd.safetensors").write_bytes(b"x" * 10)  # an interrupted warm
    one = remove_warm_cache("tiny", "agent", store=store)
    assert [c.name for c in one.removed] == ["agent"] and one.freed_bytes > 10
    assert (warmed / ".agent.1234abcd.safetensors").exists()
    rest = remove_warm_cache("tiny", store=store)
    assert [c.name for c in rest.removed] == ["default"]
    assert rest.freed_bytes == rest.removed[0].size + 10  # the leftover goes with all
    assert not warmed.exists()
