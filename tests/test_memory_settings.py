"""The settings of residency as users write them: keep-alive durations (Ollama's forms)
and memory sizes (``MLXI_MAX_MEMORY``), refused at the boundary with what to write."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from mlx_integrations.runtime.memory import (
    FOREVER,
    device_memory_bytes,
    format_keep_alive,
    parse_keep_alive,
    parse_memory_size,
)


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        (300, 300.0),
        (2.5, 2.5),
        (0, 0.0),
        ("0", 0.0),
        ("300", 300.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("90s", 90.0),
        ("1m30s", 90.0),
        ("300ms", 0.3),
        ("1.5h", 5400.0),
        (" 5M ", 300.0),
        (-1, FOREVER),
        (-0.5, FOREVER),
        ("-1", FOREVER),
        ("-1m", FOREVER),
        ("forever", FOREVER),
        (math.inf, FOREVER),
    ],
)
def test_keep_alive_takes_seconds_and_durations(given, seconds):
    assert parse_keep_alive(given) == pytest.approx(seconds)


@pytest.mark.parametrize("given", ["5 minutes", "abc", "", "5x", "m5", "1h 30m", math.nan])
def test_a_keep_alive_that_is_no_duration_names_the_forms(given):
    with pytest.raises(ValueError, match=r"is not a duration; use seconds \(300\), a duration"):
        parse_keep_alive(given)


@pytest.mark.parametrize("given", [None, True, [5]])
def test_a_keep_alive_of_another_type_is_a_type_error(given):
    with pytest.raises(TypeError, match="keep_alive must be seconds or a duration string"):
        parse_keep_alive(given)


def test_keep_alive_reads_back_as_a_duration():
    assert [format_keep_alive(s) for s in (0, 2.5, 90, 300, 5400, FOREVER)] == [
        "0s",
        "2.5s",
        "1m30s",
        "5m",
        "1h30m",
        "forever",
    ]


@pytest.mark.parametrize(
    ("given", "nbytes"),
    [
        ("8GB", 8 * 10**9),
        ("8GiB", 8 * 2**30),
        ("8g", 8 * 2**30),
        ("512MiB", 512 * 2**20),
        ("512 MB", 512 * 10**6),
        ("1.5GiB", int(1.5 * 2**30)),
        ("1500000000B", 1_500_000_000),
        (1_000_000, 1_000_000),
        ("off", None),
        ("", None),
        (None, None),
    ],
)
def test_memory_sizes_with_a_unit(given, nbytes):
    assert parse_memory_size(given) == nbytes


def test_a_fraction_or_percentage_is_of_the_devices_memory():
    device = device_memory_bytes()
    assert device > 2**30  # the machine's RAM on the CPU backend, the GPU's memory else
    assert parse_memory_size("0.5") == int(0.5 * device)
    assert parse_memory_size("60%") == int(0.6 * device)
    assert parse_memory_size(0.25) == int(0.25 * device)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("8", r"MLXI_MAX_MEMORY='8': a number without a unit is a fraction .* say '8B' or '8GB'"),
        ("1.5", r"must be in \(0, 1\]"),
        ("8 bananas", r"MLXI_MAX_MEMORY='8 bananas' is not a size; give a size with a unit"),
        ("-1GB", "is not a size"),
        ("0GB", "is zero"),
        ("150%", r"a percentage must be in \(0, 100\]"),
    ],
)
def test_a_size_that_is_not_understood_says_what_to_write(given, message):
    with pytest.raises(ValueError, match=message):
        parse_memory_size(given)


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )


def test_the_environment_sets_the_budget_and_the_default_keep_alive():
    done = _python(
        "from mlx_integrations.engine import pool; "
        "print(pool.memory_budget(), pool.default_keep_alive())",
        MLXI_MAX_MEMORY="512MiB",
        MLXI_KEEP_ALIVE="5m",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(512 * 2**20), "300.0"]
    unset = _python(
        "import os; os.environ.pop('MLXI_MAX_MEMORY', None); os.environ.pop('MLXI_KEEP_ALIVE', "
        "None); from mlx_integrations.engine import pool; "
        "print(pool.memory_budget(), pool.default_keep_alive())"
    )
    assert unset.stdout.split() == ["None", "inf"]  # no budget, models stay loaded


def test_a_bad_environment_value_is_named_in_the_error():
    done = _python(
        "from mlx_integrations.engine import pool; pool.memory_budget()", MLXI_MAX_MEMORY="lots"
    )
    assert done.returncode == 1
    assert "ValueError: MLXI_MAX_MEMORY='lots' is not a size" in done.stderr
