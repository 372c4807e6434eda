"""``mlxi doctor``: framework versions, the package's pinned ranges, and the Hub's
reachability (a loopback Hub, a closed loopback port, offline mode; never the internet)."""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import pytest
from mlx_integrations.cli.main import app
from typer.testing import CliRunner

from tests.support.fake_hub import FakeHub

# The frameworks doctor reports, in its order.
FRAMEWORKS = [
    "mlx",
    "mlx-lm",
    "mlx-vlm",
    "langchain-core",
    "langchain",
    "llama-index-core",
    "huggingface-hub",
    "transformers",
]


@pytest.fixture
def hub():
    with FakeHub() as server:
        yield server


def mlxi(*args: str):
    return CliRunner().invoke(app, list(args))


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fake_distribution(folder: Path, name: str, version: str, requires: Sequence[str] = ()) -> None:
    """An installed distribution as pip leaves one: ``NAME-VERSION.dist-info/METADATA``."""
    info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    extras = sorted({r.split('extra == "')[1].rstrip('"') for r in requires if "extra ==" in r})
    lines += [f"Provides-Extra: {e}" for e in extras]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


def test_a_reachable_hub_versions_and_ranges(env, hub):
    result = mlxi("doctor", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["hub"]["endpoint"] == hub.url and report["hub"]["status"] == "reachable"
    assert report["hub"]["http_status"] == 404  # it answered; the loopback Hub has no page
    assert [(r.method, r.path) for r in hub.requests] == [("HEAD", "/")]
    assert list(report["versions"]) == FRAMEWORKS
    assert report["versions"]["mlx-lm"] == metadata.version("mlx-lm")
    assert report["versions"]["huggingface-hub"] == metadata.version("huggingface-hub")
    assert report["requirements"] and all(r["ok"] for r in report["requirements"])
    assert {"mlx-lm", "langchain-core", "llama-index-core"} <= {
        r["name"] for r in report["requirements"]
    }
    assert report["store"] == env["MLXI_HOME"] and report["backend"] in {"cpu", "metal", "cuda"}
    text = mlxi("doctor")
    assert text.exit_code == 0, text.stderr
    n = len(report["requirements"])
    assert f"requirements     {n} of {n} satisfied" in text.stdout
    assert f"  mlx-lm             {metadata.version('mlx-lm')}\n" in text.stdout
    assert f"hub              {hub.url}: reachable (answered HTTP 404 in " in text.stdout


def test_an_unreachable_hub_is_reported_without_failing(env, monkeypatch):
    url = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", url)
    report = json.loads(mlxi("doctor", "--json").stdout)
    assert report["hub"]["status"] == "unreachable" and report["hub"]["http_status"] is None
    assert report["hub"]["error"]
    text = mlxi("doctor")
    assert text.exit_code == 0, text.stderr
    assert f"hub              {url}: unreachable (" in text.stdout
    assert "set HF_HUB_OFFLINE=1" in text.stdout


def test_offline_mode_asks_nothing(env, hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    report = json.loads(mlxi("doctor", "--json").stdout)
    assert report["hub"] == {
        "endpoint": hub.url,
        "status": "offline",
        "http_status": None,
        "seconds": None,
        "error": None,
    }
    assert hub.requests == []
    assert "offline mode (HF_HUB_OFFLINE is set; nothing was asked)" in mlxi("doctor").stdout


def test_a_version_outside_the_pinned_range_fails_naming_the_fix(env, tmp_path, monkeypatch):
    # An older jsonschema found first on the path, as a stale install would be.
    fake_distribution(tmp_path / "site", "jsonschema", "3.0.0")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    result = mlxi("doctor")
    assert result.exit_code == 1
    assert "  jsonschema>=4                  3.0.0 installed" in result.stdout
    assert (
        "Error: installed versions outside the ranges mlx-integrations needs: "
        "jsonschema 3.0.0 (needs jsonschema>=4)"
    ) in result.stderr
    assert 'Hint: pip install "jsonschema>=4"' in result.stderr
    report = json.loads(mlxi("doctor", "--json").stdout)
    [bad] = [r for r in report["requirements"] if not r["ok"]]
    assert bad == {
        "requirement": "jsonschema>=4",
        "name": "jsonschema",
        "extra": None,
        "installed": "3.0.0",
        "ok": False,
    }


def test_check_requirements_reads_base_extras_and_markers(tmp_path, monkeypatch):
    from mlx_integrations.runtime.environment import check_requirements

    site = tmp_path / "site"
    fake_distribution(
        site,
        "fake-app",
        "1.0",
        [
            f"mlx-lm>={metadata.version('mlx-lm')}",
            "no-such-dist-7f3a>=1",
            'mlx-vlm<0.1; extra == "vision"',
            'no-such-dist-9b2c>=1; extra == "cuda"',
            'pytest>=999; extra == "dev"',
            'mlx-lm>=999; sys_platform == "no-such-platform"',
        ],
    )
    monkeypatch.syspath_prepend(str(site))
    checks = {(c.name, c.extra): c for c in check_requirements("fake-app")}
    # A base requirement that is missing fails; an extra's is checked only when present;
    # development extras and other platforms are left out.
    assert set(checks) == {("mlx-lm", None), ("no-such-dist-7f3a", None), ("mlx-vlm", "vision")}
    assert checks[("mlx-lm", None)].ok
    assert not checks[("no-such-dist-7f3a", None)].ok
    assert checks[("no-such-dist-7f3a", None)].installed is None
    assert not checks[("mlx-vlm", "vision")].ok
    assert checks[("mlx-vlm", "vision")].installed == metadata.version("mlx-vlm")
