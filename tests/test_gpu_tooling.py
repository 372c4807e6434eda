"""bench/gpu/: the bundles that carry wheels to the GPU machine, and the script run there.

What runs on the CPU: packing into bundles (anywhere, of a size that leaves room for the
working tree that travels with each call, every piece accounted for in SHA256SUMS), the
measure of that working tree, and the commands ``device.sh`` would run (``DRY_RUN``),
its arguments split as a shell splits them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import time
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
        "--out",
        str(tmp_path),
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


def test_the_step_tracer_splits_each_decode_step_and_gives_mlx_lm_back(tiny_qwen2):
    """bench/_gpu_steps.py: every decode step of a real batch is timed, its launch and
    GPU wait inside its wall time; removing the tracer leaves mlx-lm as it was."""
    import importlib
    import time

    from mlx_lm import batch_generate, load

    spec = importlib.util.spec_from_file_location("gpu_steps", ROOT / "bench" / "_gpu_steps.py")
    assert spec is not None and spec.loader is not None
    steps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(steps)
    g = importlib.import_module("mlx_lm.generate")
    before = (g.mx, g.PromptProcessingBatch.prompt, g.GenerationBatch._step)
    model, tokenizer = load(str(tiny_qwen2))
    tracer = steps.StepTracer()
    tracer.install()

    class Slowed:  # MLX, with its evals taking at least 20 ms (launch) and 5 ms (wait)
        def __init__(self, mx):
            self.mx = mx

        def async_eval(self, *args):
            time.sleep(0.02)
            return self.mx.async_eval(*args)

        def eval(self, *args):
            time.sleep(0.005)
            return self.mx.eval(*args)

        def __getattr__(self, name):
            return getattr(self.mx, name)

    try:
        assert g.mx is not before[0]
        g.mx._mx = Slowed(g.mx._mx)  # the tracer's timed evals call these
        response = batch_generate(
            model, tokenizer, [[1, 2, 3, 4], [5, 6]], max_tokens=6, return_token_ids=True
        )
        events = tracer.take()
    finally:
        tracer.remove()
    assert (g.mx, g.PromptProcessingBatch.prompt, g.GenerationBatch._step) == before
    decode = [e for e in events if e[0] == "decode" and e[1] > 0]
    assert len(decode) >= max(map(len, response.token_ids))
    for _, rows, _, ms, submit, wait, _cpu in decode:
        assert rows in (1, 2)
        # each in its own slot, both inside the step's wall time
        assert submit >= 20 and wait >= 5 and submit + wait <= ms
    assert sum(e[6] for e in decode) > 0  # the thread's CPU time, sleeps not counted
    assert sum(e[6] for e in decode) < sum(e[3] for e in decode)
    report = steps.split(1.0, events)
    assert report["steps"] == len(decode)
    parts = [report[f"{part}_ms_median"] for part in ("build", "submit", "wait")]
    assert all(p is not None and p >= 0 for p in parts)
    assert report["submit_ms_median"] <= report["step_ms_median"]


@pytest.mark.parametrize(
    ("probe", "shapes_on", "batch_on", "groups_on"),
    [
        ("warm_elsewhere", "warm-elsewhere", "mlxi-aside", "mlxi-aside"),
        ("warm_batch_on_owner", "owner", "owner", "owner"),
        ("warm_groups_on_owner", "owner", "mlxi-aside", "owner"),
        ("warm_growth_on_owner", "owner", "owner", "mlxi-aside"),
        (None, "owner", "mlxi-aside", "mlxi-aside"),
    ],
)
def test_the_warm_up_probes_move_the_load_s_warm_up_between_threads(
    tiny_qwen2, monkeypatch, probe, shapes_on, batch_on, groups_on, bench
):
    """bench_gpu.variant_engine's probes: ``warm_elsewhere`` runs the load's whole
    warm-up on a kept side thread of the bench's (its batch part then goes to the
    package's side thread, as in the default engine); ``warm_batch_on_owner`` runs both
    parts on the owner thread, as the package did before; ``warm_groups_on_owner`` meets
    the batch part's groups on the owner thread and the rest aside;
    ``warm_growth_on_owner`` the rest on the owner thread and the groups aside. Either way the
    warm-up is timed and the engine then serves on its owner thread."""
    import asyncio
    import threading

    from mlx_integrations.engine import mlx_engine
    from mlx_integrations.engine.batched import warmup

    bench_gpu = bench("bench_gpu")
    threads: dict[str, list[threading.Thread]] = {"shapes": [], "batch": [], "groups": []}
    # Each part's time, a part inside another counted once: the seconds warm_shapes and
    # warm_batch return, and the time of a warm_groups run on its own (which returns none;
    # the probe that runs it times it around this).
    seconds: list[float] = []
    inside: list[str] = []

    def recorded(part, real):
        def run(*args, **kwargs):
            threads[part].append(threading.current_thread())
            outer = not inside
            inside.append(part)
            began = time.perf_counter()
            try:
                result = real(*args, **kwargs)
            finally:
                inside.pop()
            if outer:
                seconds.append(time.perf_counter() - began if result is None else result)
            return result

        return run

    monkeypatch.setattr(mlx_engine, "warm_shapes", recorded("shapes", mlx_engine.warm_shapes))
    # The package's engine and the bench's probe both import it from its module.
    monkeypatch.setattr(warmup, "warm_batch", recorded("batch", warmup.warm_batch))
    monkeypatch.setattr(warmup, "warm_groups", recorded("groups", warmup.warm_groups))
    from mlx_integrations.engine.batched import engine as batched

    monkeypatch.setattr(batched, "warm_batch", warmup.warm_batch)
    options = {"warmup_shapes": True, "prefill_buckets": True}
    if probe:
        options[probe] = True
    engine = bench_gpu.variant_engine(tiny_qwen2, 2, options)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(engine.start())
        assert batched.warm_batch is warmup.warm_batch  # the package's own, given back
        reply = loop.run_until_complete(engine.generate("hello", max_tokens=3, temperature=0))
        owner = engine._executor.submit(threading.current_thread).result()
    finally:
        loop.run_until_complete(engine.stop())
        loop.close()

    def where(thread: threading.Thread) -> str:
        return "owner" if thread is owner else thread.name.rsplit("_", 1)[0]

    assert [where(t) for t in threads["shapes"]] == [shapes_on]
    assert [where(t) for t in threads["batch"]] == [batch_on]
    assert [where(t) for t in threads["groups"]] == [groups_on]  # met once, there
    assert engine.warmup_seconds is not None
    assert engine.warmup_seconds >= sum(seconds) - 1e-6 > 0  # every part it ran, timed
    assert reply.completion_tokens == 3


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


def test_every_trace_order_runs_its_sides_on_the_cpu(tmp_path):
    """bench/gpu/first_batch.py --probes trace: each order it accepts runs all four
    prompt sets on its sides (a tiny model on the CPU); an unknown one stops first."""
    import json

    spec = importlib.util.spec_from_file_location("first_batch", ROOT / "bench/gpu/first_batch.py")
    assert spec is not None and spec.loader is not None
    first_batch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(first_batch)
    orders = [*first_batch.TRACE_KINDS, "engine@8"]
    script = [sys.executable, str(ROOT / "bench/gpu/first_batch.py"), "--probes", "trace"]
    done = subprocess.run(
        [*script, "--shapes", "tiny", "--tokens", "3", "--orders", ",".join(orders)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        record = json.loads(line)
        assert "exit" not in record, record  # a child process failed
        if "run" in record:
            runs.setdefault(record["order"], []).append(record["run"])
    sets = ["a", "a-again", "new-lengths", "other-lengths"]
    sides = {"engine-first": ["engine", "raw"], "raw-first": ["raw", "engine"], "raw": ["raw"]}
    assert runs == {
        order: [f"{side} {s}" for s in sets for side in sides.get(order, ["engine"])]
        for order in orders
    }
    bad = subprocess.run(
        [*script, "--orders", "engine,engine-owner"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert bad.returncode != 0
    assert "unknown trace order 'engine-owner': use one of engine-first" in bad.stderr


def test_ttft_variants_are_more_sides_timed_against_the_default_engine(tmp_path):
    """bench_gpu.py --parts ttft --ttft-variants: each variant is one more SimpleEngine
    side (the warm-up probes among its options), timed in the same rotation, with its
    ratios against raw and against the default engine, and its greedy tokens checked."""
    import json

    options = {"warmup_shapes": True, "prefill_buckets": True}
    variants = {"elsewhere": {"warm_elsewhere": True}, "plain": {"warmup_shapes": False}}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench/bench_gpu.py"),
            "--quick",
            "--parts",
            "ttft",
            "--engine-options",
            json.dumps(options),
            "--ttft-variants",
            json.dumps(variants),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ttft = json.loads((tmp_path / "bench_gpu.json").read_text())["shapes"]["tiny"]["ttft"]
    assert "error" not in ttft, ttft["error"]
    assert "partial" not in ttft and ttft["reps_done"] == 2  # the last save is the whole part
    assert ttft["ours_elsewhere"]["warmup_s"] > 0  # the probe kept the warm-up, elsewhere
    assert ttft["ours_plain"]["warmup_s"] is None
    for row in ttft["lengths"].values():
        for name in variants:
            assert len(row[f"ours_{name}"]) == len(row["ours"]) == 2  # --quick: 2 reps
            for kind in ("cold", "repeat"):
                assert row[f"{kind}_{name}"]["ratio"] > 0  # against raw
                assert row[f"{kind}_{name}_vs_default"]["ratio"] > 0
    assert all(row["same"] and row["ours_elsewhere"] for row in ttft["same_greedy_tokens"])
    assert "elsewhere_vs_default cold" in done.stdout


def test_the_provenance_probe_times_a_batch_on_new_threads_after_each_history(tmp_path):
    """bench/gpu/first_batch.py --probes provenance: every scenario (what a new thread
    runs before the timed batch) is timed each repetition, on the CPU too."""
    import json

    script = [sys.executable, str(ROOT / "bench/gpu/first_batch.py"), "--probes", "provenance"]
    args = ["--shapes", "tiny", "--tokens", "4", "--host-reps", "2", "--provenance-c", "4"]
    done = subprocess.run(
        [*script, *args, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "first_batch.jsonl").open()]
    scenarios = ["fresh", "after-half", "after-warm-batch", "largest-first", "after-shapes"]
    scenarios += ["after-growth", "after-groups"]  # the batch warm-up's halves
    assert sorted((r["rep"], r["scenario"]) for r in records) == sorted(
        (rep, name) for rep in range(2) for name in scenarios
    )
    history = {
        "fresh": [],
        "after-half": ["batch of 2"],
        "after-warm-batch": ["warm_batch"],
        "largest-first": ["batch of 4", "warm_batch"],
        "after-shapes": ["warm_shapes"],
        "after-growth": ["warm_batch(groups=False)"],
        "after-groups": ["warm_groups"],
    }
    for r in records:
        assert r["probe"] == "provenance" and r["c"] == 4
        assert r["history"] == history[r["scenario"]]  # what the thread ran before
        assert r["steps"] >= 3 and r["step_ms_median"] > 0  # the timed batch's own steps
    picked = tmp_path / "picked"
    args += ["--provenance-scenarios", "fresh,after-groups", "--out", str(picked)]
    done = subprocess.run([*script, *args], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (picked / "first_batch.jsonl").open()]
    assert sorted(r["scenario"] for r in records) == ["after-groups"] * 2 + ["fresh"] * 2
    refused = {
        "fresh,after-everything": "unknown provenance scenario 'after-everything': use one of fresh",
        "fresh,after-half,fresh": "provenance scenario 'fresh' given twice: name each once",
    }
    for i, (names, message) in enumerate(refused.items()):
        bad_out = tmp_path / f"bad{i}"
        bad = subprocess.run(
            [*script, "--provenance-scenarios", names, "--out", str(bad_out)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=600,
        )
        assert bad.returncode != 0
        assert message in bad.stderr
        assert not (bad_out / "first_batch.jsonl").exists()  # refused before anything ran


@pytest.mark.parametrize(
    ("placement", "warm_up_on"), [("warm_batch_on_owner", "owner"), ("warm_elsewhere", "other")]
)
def test_largest_first_decodes_a_full_batch_on_the_owner_before_the_warm_up(
    tiny_qwen2, monkeypatch, placement, warm_up_on, bench
):
    """bench_gpu.variant_engine's ``largest_first`` probe: before the load's warm-up, the
    owner thread decodes one batch of ``max_num_seqs`` rows; the warm-up then runs where
    the probe it goes with puts it."""
    import asyncio
    import threading

    from mlx_lm.generate import BatchGenerator

    from mlx_integrations.engine import mlx_engine

    bench_gpu = bench("bench_gpu")
    events: list[tuple[str, threading.Thread, int]] = []
    real_next, real_shapes = BatchGenerator.next, mlx_engine.warm_shapes

    def next_recorded(self, *args, **kwargs):
        out = real_next(self, *args, **kwargs)
        events.append(("step", threading.current_thread(), len(out[1])))
        return out

    def shapes_recorded(*args, **kwargs):
        events.append(("shapes", threading.current_thread(), 0))
        return real_shapes(*args, **kwargs)

    monkeypatch.setattr(BatchGenerator, "next", next_recorded)
    monkeypatch.setattr(mlx_engine, "warm_shapes", shapes_recorded)
    options = {"warmup_shapes": True, placement: True, "largest_first": True}
    engine = bench_gpu.variant_engine(tiny_qwen2, 3, options)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(engine.start())
        owner = engine._executor.submit(threading.current_thread).result()
    finally:
        loop.run_until_complete(engine.stop())
        loop.close()
    first_shapes = next(i for i, e in enumerate(events) if e[0] == "shapes")
    before, after = events[:first_shapes], events[first_shapes:]
    assert before and all(thread is owner for _, thread, _ in before)
    assert max(rows for _, _, rows in before) == 3  # the full batch, decoded
    # then the warm-up (its shapes, and its batches of 1 to 3 rows), where it was put
    assert max(rows for _, _, rows in after) == 3
    assert {"owner" if thread is owner else "other" for _, thread, _ in after} == {warm_up_on}


def test_probes_that_cannot_apply_are_refused_before_an_engine_is_made(tiny_qwen2, bench):
    """Two placements of the warm-up, or a probe of BatchedEngine's warm-up on a
    SimpleEngine (where it would do nothing), stop the bench with the probes named; so
    does a ttft variant whose name its keys would share with other sides'."""

    from mlx_integrations.engine import BatchedEngine, SimpleEngine

    owners = bench("_gpu_owners")
    ttft = bench("_gpu_ttft")
    both = {"warm_elsewhere": True, "warm_groups_on_owner": True}
    with pytest.raises(ValueError, match="warm_elsewhere and warm_groups_on_owner are 2 probes"):
        owners.probed_engine(BatchedEngine, tiny_qwen2, both)
    for probe in (
        "warm_batch_on_owner",
        "warm_groups_on_owner",
        "warm_growth_on_owner",
        "largest_first",
    ):
        with pytest.raises(ValueError, match=f"{probe}: a probe of BatchedEngine's warm-up"):
            owners.probed_engine(SimpleEngine, tiny_qwen2, {probe: True})
    assert owners.probed_engine(SimpleEngine, tiny_qwen2, {"warm_elsewhere": True})
    for name in ("unpadded", "padded_vs_unpadded"):
        with pytest.raises(ValueError, match=f"ttft variant name '{name}'"):
            ttft.bench_ttft(tiny_qwen2, None, None, [32], 1, {}, "cpu", True, {name: {}})


@pytest.mark.parametrize("probe", ["warm_groups_on_owner", "warm_growth_on_owner"])
def test_the_split_probes_give_the_batch_warm_up_back_when_the_load_fails(
    tiny_qwen2, monkeypatch, probe, bench
):
    """``warm_groups_on_owner`` and ``warm_growth_on_owner`` swap the package's
    ``warm_batch`` for the load's warm-up; a warm-up that fails leaves the package's own
    in place."""
    import asyncio

    from mlx_integrations.engine import mlx_engine
    from mlx_integrations.engine.batched import engine as batched

    bench_gpu = bench("bench_gpu")
    own = batched.warm_batch

    def broken(*args, **kwargs):
        raise RuntimeError("a warm-up that fails")

    monkeypatch.setattr(mlx_engine, "warm_shapes", broken)
    options = {"warmup_shapes": True, probe: True}
    engine = bench_gpu.variant_engine(tiny_qwen2, 2, options)
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(RuntimeError, match="a warm-up that fails"):
            loop.run_until_complete(engine.start())
        assert batched.warm_batch is own
    finally:
        loop.run_until_complete(engine.stop())
        loop.close()


def test_the_ttft_part_saves_its_results_after_each_repetition(tiny_qwen2, bench):
    """A ttft part stopped by its deadline keeps the repetitions it finished: each one
    hands the summary so far (every side's timings, ratios per length) to ``save``, and
    the log line gives them beside the error."""
    import json

    from mlx_lm import load

    ttft = bench("_gpu_ttft")
    report = bench("_gpu_report")
    model, tokenizer = load(str(tiny_qwen2))
    saved: list[dict] = []
    final = ttft.bench_ttft(
        tiny_qwen2, model, tokenizer, [12, 30], 2, {}, "cpu", True, None,
        lambda r: saved.append(json.loads(json.dumps(r))),
    )  # fmt: skip
    assert [s["reps_done"] for s in saved] == [1, 2]
    for s in saved:
        assert set(s["lengths"]) == {"12", "30"}
        for row in s["lengths"].values():
            for side in ("raw", "ours", "ours_unpadded", "raw_new_thread"):
                assert len(row[side]) == s["reps_done"]
            assert row["cold"]["ratio"] > 0 and row["cold_padded_vs_unpadded"]["ratio"] > 0
    assert final["reps_done"] == 2 and "same greedy tokens" not in report.brief("ttft", saved[0])
    assert len(final["same_greedy_tokens"]) == 2  # checked after the timing, per length
    assert all(row["same"] for row in final["same_greedy_tokens"])
    assert final["lengths"]["30"]["cold"] == saved[-1]["lengths"]["30"]["cold"]
    line = report.brief("ttft", saved[0] | {"error": "timed out"})
    assert line.startswith("ERROR timed out; after 1 repetition(s): [cpu] load")
    assert "30: cold" in line
    assert report.brief("ttft", {"error": "timed out"}) == "ERROR timed out"
    # The README's table says which cells come from a part stopped early.
    stopped = saved[0] | {"error": "timed out"}
    table = report.table({"shapes": {"tiny": {"ttft": stopped}}, "concurrency": []})
    assert "(stopped after 1 of 2 repetitions)" in table
    assert "stopped" not in report.table({"shapes": {"tiny": {"ttft": final}}, "concurrency": []})


def test_a_run_without_a_batched_part_draws_no_plot(tmp_path, bench):
    """The plot is of batched tokens/s: a ttft-only run (this one, from an H100) leaves
    no empty figure behind."""
    import json

    ttft_only = json.loads((GPU / "h100-2026-12-07-0803-ttft-0.5b.json").read_text())
    assert not bench("_gpu_report").plot(ttft_only, tmp_path / "ttft.png")
    assert not (tmp_path / "ttft.png").exists()


def test_a_batched_run_is_plotted(tmp_path, bench):
    import json

    pytest.importorskip("matplotlib")
    batched = json.loads((GPU / "h100-2026-12-07-0800-batched-1.5b.json").read_text())
    assert bench("_gpu_report").plot(batched, tmp_path / "batched.png")
    assert (tmp_path / "batched.png").stat().st_size > 0
