"""bench/: the harness every benchmark shares, and the tooling that runs them on a GPU.

The harness (bench/harness.py): sides alternate with the first rotating, ratios are paired
round by round, and ``--json`` records the date, commit, command and machine beside the
figures. Every benchmark script takes ``--rounds`` and ``--json``, and the GPU benchmark
runs end to end on the CPU (``--quick``).

bench/gpu/ (what runs on the CPU): packing wheels into bundles (anywhere, of a size that
leaves room for the working tree that travels with each call, every piece accounted for
in SHA256SUMS), the measure of that working tree, and the commands ``device.sh`` would
run (``DRY_RUN``), its arguments split as a shell splits them.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "bench" / "gpu"
MIB = 1 << 20


@pytest.fixture(scope="module")
def pack() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_pack", GPU / "pack.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def bench(monkeypatch) -> Callable[[str], ModuleType]:
    """bench/'s modules by name, imported as its scripts import one another (bench/ on
    ``sys.path`` for the test)."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    return importlib.import_module


def fake_wheels(folder: Path) -> dict[str, bytes]:
    """Wheels of made-up bytes: a large MLX CUDA one (cut in pieces) and small ones."""
    folder.mkdir(parents=True)
    sizes = {
        "mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl": 700_000,
        "mlx-0.32.4-cp312-cp312-manylinux_2_35_x86_64.whl": 200_000,
        "mlx_lm-0.32.2-py3-none-any.whl": 90_000,
        "pydantic-2.14.4-py3-none-any.whl": 150_000,
        "tinytag-2.3.2-py3-none-any.whl": 40_000,
    }
    made = {}
    for i, (name, size) in enumerate(sizes.items()):
        made[name] = hashlib.sha256(str(i).encode()).digest() * (size // 32)
        (folder / name).write_bytes(made[name])
    return made


def run_pack(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GPU / "pack.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_pack_writes_bundles_outside_the_repository(tmp_path):
    wheels = fake_wheels(tmp_path / "wheels")
    out = tmp_path / "bundles"
    done = run_pack(
        "--out",
        str(out),
        "--wheels",
        str(tmp_path / "wheels"),
        "--no-models",
        "--bundle-mib",
        "0.25",
    )
    assert done.returncode == 0, done.stderr
    bundles = sorted((p for p in out.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    assert len(bundles) >= 5
    # Every bundle is named on a line of its own, by its absolute path, and has its sums.
    for folder in bundles:
        assert f"{folder}  " in done.stdout
        assert (folder / "SHA256SUMS").is_file()
        assert sum(p.stat().st_size for p in folder.iterdir() if p.name != "SHA256SUMS") <= (
            0.25 * MIB
        )
    assert f"{len(bundles)} calls carry it all" in done.stdout
    assert "outside the repository" in done.stdout
    # MLX's CUDA wheel comes first, cut in pieces; joined, each wheel is whole again.
    assert any(p.name.startswith("mlx_cuda_13") for p in bundles[0].iterdir())
    sums = dict(
        reversed(line.split("  ")) for line in (bundles[-1] / "SHA256SUMS").read_text().splitlines()
    )
    for name, data in wheels.items():
        pieces = sorted(p for b in bundles for p in b.iterdir() if p.name.startswith(name))
        joined = b"".join(p.read_bytes() for p in pieces)
        assert joined == data
        assert sums[name] == hashlib.sha256(data).hexdigest()


def small_bundles(tmp_path: Path) -> tuple[dict[str, bytes], list[Path]]:
    """Fake wheels packed into bundles of 0.3 MiB (wheels only): the wheels, the bundles
    in order."""
    wheels = fake_wheels(tmp_path / "wheels")
    out = tmp_path / "bundles"
    done = run_pack(
        "--out",
        str(out),
        "--wheels",
        str(tmp_path / "wheels"),
        "--no-models",
        "--bundle-mib",
        "0.3",
    )
    assert done.returncode == 0, done.stderr
    return wheels, sorted((p for p in out.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_wheel_is_ready_on_the_device_only_once_all_its_pieces_came(tmp_path):
    wheels, bundles = small_bundles(tmp_path)
    work = tmp_path / "work"
    assert len(bundles) >= 3
    cuda = next(name for name in wheels if name.startswith("mlx_cuda"))
    for i, folder in enumerate(bundles):
        done = device(tmp_path, "stash", str(folder), "ready", GPU_WORK=str(work))
        assert done.returncode == 0, done.stderr
        ready = {
            line.split(": ")[1] for line in done.stdout.splitlines() if line.startswith("ready:")
        }
        waiting = {
            line.split(": ")[1]
            for line in done.stdout.splitlines()
            if line.startswith("not here yet")
        }
        assert ready | waiting == set(wheels)
        if i == 0:  # MLX's CUDA wheel, larger than a bundle, is not whole yet
            assert cuda in waiting
    assert waiting == set()
    for name, data in wheels.items():
        assert (work / name).read_bytes() == data


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_each_install_adds_the_wheels_that_came_since_the_last(tmp_path):
    wheels, bundles = small_bundles(tmp_path)
    # A stand-in for Python that logs the wheels pip is asked to install.
    log = tmp_path / "calls.log"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    python.chmod(0o755)
    installed: list[str] = []
    for folder in bundles:
        log.write_text("")
        env = {"GPU_WORK": str(tmp_path / "work"), "PYTHON": str(python)}
        done = device(tmp_path, "stash", str(folder), "install", **env)
        assert done.returncode == 0, done.stderr
        pip = [line for line in log.read_text().splitlines() if "--target" in line]
        now = [w.rsplit("/", 1)[-1] for line in pip for w in line.split() if w.endswith(".whl")]
        assert not set(now) & set(installed)  # none twice
        installed += now
    assert sorted(installed) == sorted(wheels)


def test_the_default_bundle_leaves_room_for_the_working_tree(pack, tmp_path):
    tree = pack.travelling_bytes()
    headroom = 2 * MIB
    capacity = pack.bundle_capacity(tree, headroom)
    assert capacity + tree + headroom == 64 * MIB
    with pytest.raises(SystemExit, match=r"working tree that travels is 60\.0 MiB"):
        pack.bundle_capacity(60 * MIB, headroom)
    fake_wheels(tmp_path / "wheels")
    done = run_pack(
        "--out", str(tmp_path / "b"), "--wheels", str(tmp_path / "wheels"), "--no-models"
    )
    assert done.returncode == 0, done.stderr
    largest = max(
        sum(p.stat().st_size for p in folder.iterdir())
        for folder in (tmp_path / "b").iterdir()
        if folder.name.isdigit()
    )
    assert largest + tree <= 62 * MIB
    assert largest > 1 * MIB  # the wheels fill one bundle, and one call
    checked = run_pack("--out", str(tmp_path / "b"), "--check")
    assert checked.returncode == 0, checked.stderr
    assert "MiB left" in checked.stdout


def test_the_travelling_tree_counts_tracked_and_unignored_files_only(pack, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)

    git("init", "-q")
    (repo / ".gitignore").write_text("/ignored/\n")
    (repo / "tracked.txt").write_bytes(b"t" * 1000)
    git("add", ".gitignore", "tracked.txt")
    (repo / "untracked.txt").write_bytes(b"u" * 300)
    (repo / "ignored").mkdir()
    (repo / "ignored" / "big.bin").write_bytes(b"i" * 50_000)
    (repo / "shared").mkdir()
    (repo / "shared" / "notes.md").write_bytes(b"s" * 20)
    expected = 1000 + 300 + len("/ignored/\n") + 20
    assert pack.travelling_bytes(repo) == expected


def test_pack_refuses_a_wheel_folder_without_mlx(tmp_path):
    (tmp_path / "wheels").mkdir()
    done = run_pack("--out", str(tmp_path), "--wheels", str(tmp_path / "wheels"), "--no-models")
    assert done.returncode != 0
    assert "no mlx-cuda wheel in" in done.stderr and "download.sh" in done.stderr


def device(tmp_path: Path, *steps: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(GPU / "device.sh"), *steps],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        # Without the caller's own PYTEST_ARGS or BENCH_ARGS (a run of the suite there).
        env={k: v for k, v in os.environ.items() if k not in ("PYTEST_ARGS", "BENCH_ARGS")}
        | {"OUT": str(tmp_path), "DRY_RUN": "1"}
        | env,
    )


def commands(stdout: str) -> list[list[str]]:
    """The argument lists a dry run printed, one argument a line under 'command:'."""
    out: list[list[str]] = []
    for line in stdout.splitlines():
        if line == "command:":
            out.append([])
        elif line.startswith("  ") and out:
            out[-1].append(line[2:])
    return out


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_device_script_parses():
    done = subprocess.run(["bash", "-n", str(GPU / "device.sh")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    done = subprocess.run(["bash", "-n", str(GPU / "download.sh")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_quoted_pytest_and_bench_arguments_reach_their_commands_whole(tmp_path):
    done = device(
        tmp_path,
        "test",
        "bench",
        PYTEST_ARGS='-m "not smollm" tests/engine tests/chat -k "batch and not draft"',
        BENCH_ARGS="""--parts ttft --engine-options '{"prefill_buckets": false}'""",
        TEST_WORKERS="14",
    )
    assert done.returncode == 0, done.stderr
    pytest_cmd, bench_cmd = commands(done.stdout)
    assert pytest_cmd[-6:] == [
        "-m",
        "not smollm",
        "tests/engine",
        "tests/chat",
        "-k",
        "batch and not draft",
    ]
    assert pytest_cmd[pytest_cmd.index("-n") + 1] == "14"
    assert f"--junitxml={tmp_path}/junit.xml" in pytest_cmd
    assert bench_cmd[1:] == [
        "bench/bench_gpu.py",
        "--json",
        f"{tmp_path}/bench_gpu.json",
        "--parts",
        "ttft",
        "--engine-options",
        '{"prefill_buckets": false}',
    ]
    # What a shell would make of the printed words is the same list.
    assert shlex.split(shlex.join(pytest_cmd)) == pytest_cmd


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_no_pytest_arguments_run_the_whole_suite(tmp_path):
    done = device(tmp_path, "test")
    assert done.returncode == 0, done.stderr
    (cmd,) = commands(done.stdout)
    assert cmd[-1] == f"--junitxml={tmp_path}/junit.xml"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_download_takes_any_python_and_names_one_without_pip(tmp_path):
    done = subprocess.run(
        ["bash", str(GPU / "download.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=os.environ | {"PYTHON": str(tmp_path / "no-python")},
    )
    assert done.returncode == 1
    assert f"{tmp_path / 'no-python'} has no pip" in done.stderr
    assert "Hint: PYTHON=" in done.stderr


BENCHMARKS = sorted(p.name for p in (ROOT / "bench").glob("bench_*.py"))


def test_alternate_rotates_which_side_goes_first(bench):
    harness = bench("harness")
    order: list[str] = []
    sides = {name: (lambda name=name: order.append(name) or len(order)) for name in "abc"}
    runs = harness.alternate(sides, 4)
    assert order == list("abcbcacababc")
    assert runs == {"a": [1, 6, 8, 10], "b": [2, 4, 9, 11], "c": [3, 5, 7, 12]}


async def test_alternate_async_awaits_the_sides_in_the_same_order(bench):
    harness = bench("harness")
    order: list[str] = []

    def side(name: str):
        async def run() -> str:
            order.append(name)
            return name

        return run

    runs = await harness.alternate_async({"x": side("x"), "y": side("y")}, 3)
    assert order == list("xyyxxy") and runs == {"x": ["x"] * 3, "y": ["y"] * 3}


def test_a_ratio_is_paired_round_by_round(bench):
    harness = bench("harness")
    # Medians of each side would give 2.0 / 2.0 = 1.0; the rounds' own ratios do not.
    spread = harness.ratio([1.0, 4.0, 2.0], [2.0, 2.0, 1.0])
    assert (spread.median, spread.low, spread.high, spread.n) == (2.0, 0.5, 2.0, 3)
    assert str(spread) == "2.000 (0.500 to 2.000)"
    with pytest.raises(ValueError, match="round by round"):
        harness.ratio([1.0, 2.0], [1.0])
    figures = harness.compare([3.0, 1.0], [1.0, 1.0])
    assert figures["ours_median"] == 2.0 and figures["ratio"]["median"] == 2.0
    assert harness.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert harness.percentile([7.0], 99) == 7.0


def test_a_run_records_what_reproduces_it(bench, tmp_path, monkeypatch):
    harness = bench("harness")
    monkeypatch.setattr(sys, "argv", ["bench/bench_engine.py", "--rounds", "3"])
    path = tmp_path / "out" / "bench_engine.json"
    harness.save(path, "bench_engine", {"decode": {"ratio": 1.02}})
    record = json.loads(path.read_text())
    assert record["benchmark"] == "bench_engine"
    assert record["figures"] == {"decode": {"ratio": 1.02}}
    assert record["command"].endswith("bench/bench_engine.py --rounds 3")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", record["date"])
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    assert record["commit"].startswith(sha)
    assert record["machine"]["cpus"] == os.cpu_count()
    assert [p.name for p in path.parent.iterdir()] == ["bench_engine.json"]  # no .tmp left


@pytest.mark.parametrize("script", BENCHMARKS)
def test_every_benchmark_takes_rounds_and_json(script):
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--rounds" in done.stdout and "--json" in done.stdout


def test_the_gpu_benchmark_runs_every_part_on_the_cpu(tmp_path):
    out = tmp_path / "bench_gpu.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "bench_gpu.py"),
            "--quick",
            "--models",
            str(tmp_path / "models"),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())["figures"]
    tiny = figures["shapes"]["tiny"]
    assert [p for p in ("ttft", "single", "batched", "equality") if "error" in tiny[p]] == [], tiny
    assert tiny["ttft"]["same_greedy_tokens"] == [True, True]  # lengths 32 and 200
    assert tiny["ttft"]["lengths"]["200"]["cold"]["ratio"]["n"] == 2
    assert tiny["ttft"]["mlx_lm_load_s"] > 0 and tiny["ttft"]["load_s"] > 0
    assert tiny["single"]["same_tokens"] is True
    batched = tiny["batched"]["concurrency"]["4"]
    assert batched["ratio"]["n"] == 1 and batched["first"]["ours_tps"] > 0
    # On the CPU both engines give raw generate_step's greedy tokens, padded or not.
    equality = tiny["equality"]["engines"]
    assert sorted(equality) == [
        f"{kind} prefill_buckets={on}" for kind in ("batched", "simple") for on in (False, True)
    ]
    assert {(e["identical"], e["prompts"]) for e in equality.values()} == {(5, 5)}
    assert max(tiny["equality"]["prompt_tokens"]) > 256


def test_a_divergence_is_told_from_a_tie_in_bfloat16_steps(bench):
    """The equality part names, for each reply that leaves raw's, the first step apart,
    how far raw's two best logits were there in bfloat16 steps, and whether the engine
    took the other of the two."""

    bench_gpu = bench("bench_gpu")
    assert bench_gpu.bf16_steps(3.0, 3.0) == 0
    assert bench_gpu.bf16_steps(1.0, 1.0078125) == 1  # 2**-7 apart at 1.0
    assert bench_gpu.bf16_steps(-2.5, -2.46875) == 2
    raw = [
        {
            "tokens": [1, 2, 3],
            "top2": [([1, 9], [1.0, 0.5]), ([2, 7], [4.0, 4.0]), ([3, 5], [1.0, 0.0])],
        },
        {"tokens": [4, 4], "top2": [([4, 6], [2.0, 1.0]), ([4, 1], [1.0, 0.0])]},
        {"tokens": [5, 5], "top2": [([5, 6], [2.0, 2.0]), ([5, 1], [1.0, 0.0])]},
    ]
    got = bench_gpu.agreement(raw, [[1, 7, 3], [6, 4], [5, 5]])
    assert (got["identical"], got["prompts"], got["diverged_near_ties"]) == (1, 3, 1)
    assert got["divergences"] == [
        {"prompt": 0, "step": 1, "top2_bf16_steps": 0.0, "ours_among_top2": True},
        {"prompt": 1, "step": 0, "top2_bf16_steps": 64.0, "ours_among_top2": True},
    ]
    assert bench_gpu.equality_lengths(40, 3000)[::13] == [8, 58, 416, 3000]


def test_a_part_saves_whole_and_a_broken_save_reads_as_nothing(tmp_path, bench):
    """bench_gpu keeps what a part saved before it failed or timed out: saves replace the
    file whole (no half-written JSON for the next read), and a file that is not JSON
    reads as nothing saved instead of ending the run."""

    bench_gpu = bench("bench_gpu")
    path = tmp_path / "part.json"
    assert bench_gpu.read_part(path) == {}
    bench_gpu.save_part(path, {"8": {"ratio": 1.0}, "partial": True})
    bench_gpu.save_part(path, {"8": {"ratio": 1.0}, "64": {"ratio": 0.9}, "partial": True})
    assert bench_gpu.read_part(path) == {"8": {"ratio": 1.0}, "64": {"ratio": 0.9}, "partial": True}
    assert [p.name for p in tmp_path.iterdir()] == ["part.json"]
    path.write_text('{"8": {"ratio": 1.')  # killed mid-write by an older writer
    assert bench_gpu.read_part(path) == {}
