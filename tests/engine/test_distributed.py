"""DistributedEngine over local ranks on 127.0.0.1, started by ``mlxi launch``.

Each launch starts real processes (rank 0 runs tests/support/distributed_rank0.py, the
others follow it), so the launches are few and shared by several tests; everything is
bounded by generous timeouts, never by speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mlx_integrations.engine.distributed.launch import (
    Host,
    launch,
    rank_commands,
    read_hostfile,
    share_cores,
)
from mlx_integrations.engine.distributed.ranks import check_tensor_split
from tests.support.tiny_models import build_tiny_model

RANK0 = str(Path(__file__).resolve().parents[1] / "support" / "distributed_rank0.py")
MLXI = [sys.executable, "-c", "from mlx_integrations.cli.main import main; main()"]


def mlxi_launch(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``mlxi launch ARGS`` in a subprocess (its ranks die with it on a timeout)."""
    return subprocess.run([*MLXI, "launch", *args], capture_output=True, text=True, timeout=timeout)


def last_json(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"rank 0 printed no result:\nstdout: {done.stdout}\nstderr: {done.stderr}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


@pytest.fixture(scope="module")
def tiny_split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama-shaped model whose 4 heads, 2 KV heads and FFN of 128 divide by 2.

    Its own output head gives varied greedy replies (a tied one repeats a token).
    """
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny-split"),
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        tie_word_embeddings=False,
    )


@pytest.fixture(scope="module")
def served(tiny_split: Path) -> dict[str, Any]:
    """One launch of 2 ranks running the ``serve`` scenario."""
    done = mlxi_launch("-n", "2", "--rank-timeout", "20", RANK0, "serve", str(tiny_split))
    assert done.returncode == 0, done.stderr
    return last_json(done)


@pytest.mark.timeout(300)
def test_tensor_parallel_over_two_ranks_matches_one_process(served: dict[str, Any]) -> None:
    sharded, single = served["distributed"], served["single"]
    assert len(single["tokens"]) > 3
    assert sharded["tokens"] == single["tokens"]
    assert sharded["text"] == single["text"]
    assert served["llama_index"] == served["llama_index_single"] == single["text"]


@pytest.mark.timeout(300)
def test_cancelled_stream_frees_every_rank(served: dict[str, Any]) -> None:
    assert served["cancelled_chunks"] == 2
    # The next request runs on every rank and answers as before.
    assert served["after_cancel"] == served["single"]["text"]
    assert served["abort"] == "abort"
    stats = served["stats"]
    assert stats["aborted"] == 2 and stats["running"] == 0
    # Every rank followed every step rank 0 took, the cancelled requests' included.
    steps = {r["steps"] for r in stats["ranks"]}
    assert len(steps) == 1 and steps.pop() > 0


@pytest.mark.timeout(300)
def test_stats_and_cache_clear_cover_every_rank(served: dict[str, Any]) -> None:
    stats = served["stats"]
    assert stats["world_size"] == 2 and stats["state"] == "serving"
    assert [r["rank"] for r in stats["ranks"]] == [0, 1]
    assert all(r["alive"] for r in stats["ranks"])
    assert [r["rank"] for r in served["clear"]] == [0, 1]
    assert served["stopped_state"] == "stopped" and served["stopped_loaded"] is False


@pytest.mark.timeout(300)
def test_killed_rank_is_an_error_on_rank_zero_and_launch_fails(
    tiny_split: Path, tmp_path: Path
) -> None:
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps(["127.0.0.1", "127.0.0.1"]))
    done = mlxi_launch(
        "--hostfile", str(hosts), "--rank-timeout", "10", RANK0, "kill", str(tiny_split)
    )
    assert done.returncode != 0
    result = last_json(done)
    assert "rank 1 of 2" in result["error"], result
    assert result["state"] == "failed"
    assert result["seconds"] is not None and result["seconds"] < 60  # rank_timeout is 10
    assert "Error: rank 1 (127.0.0.1) was killed by SIGKILL" in done.stderr


@pytest.mark.timeout(300)
def test_hung_rank_is_an_error_after_rank_timeout_and_launch_fails(tiny_split: Path) -> None:
    done = mlxi_launch("-n", "2", "--rank-timeout", "3", RANK0, "hang", str(tiny_split))
    assert done.returncode != 0
    result = last_json(done)
    assert "rank 1 of 2 sent no heartbeat" in result["error"], result
    assert result["state"] == "failed"
    assert "Error: rank" in done.stderr


@pytest.mark.timeout(300)
def test_mlxi_run_on_launched_ranks_answers_as_one_process(tiny_split: Path) -> None:
    run = ["run", str(tiny_split), "Hello there", "-t", "0", "-m", "8"]
    single = subprocess.run([*MLXI, *run], capture_output=True, text=True, timeout=120)
    assert single.returncode == 0, single.stderr
    sharded = mlxi_launch("-n", "2", "--", *MLXI, *run)
    assert sharded.returncode == 0, sharded.stderr
    assert sharded.stdout == single.stdout and single.stdout.strip()


@pytest.mark.timeout(300)
def test_pipeline_over_two_ranks_matches_one_process(tmp_path: Path) -> None:
    # mlx-lm splits ministral3 by layers (llama has no pipeline split).
    model = build_tiny_model(
        tmp_path / "tiny-pipeline",
        arch="ministral3",
        num_hidden_layers=4,
        tie_word_embeddings=False,
        seed=3,  # a seed whose greedy reply is not one token repeated
    )
    done = mlxi_launch("-n", "2", RANK0, "match", str(model), "12", "pipeline")
    assert done.returncode == 0, done.stderr
    result = last_json(done)
    assert result["layers_on_rank0"] == 2  # of 4: rank 1 runs the other two
    assert len(set(result["single"]["tokens"])) > 1
    assert result["distributed"]["tokens"] == result["single"]["tokens"]


@pytest.mark.timeout(300)
def test_same_program_started_by_hand_on_every_rank(tiny_split: Path, tmp_path: Path) -> None:
    """MLX's own variables, no launcher: rank 1's engine follows rank 0, then exits."""
    from mlx_integrations.engine.distributed.launch import free_ports

    hostfile = tmp_path / "ring.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(2)]))
    procs = [
        subprocess.Popen(
            [sys.executable, RANK0, "match", str(tiny_split), "8"],
            env={**os.environ, "MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    lines = [line for line in outs[0][0].splitlines() if line.startswith("{")]
    result = json.loads(lines[-1])
    assert result["world_size"] == 2
    assert result["distributed"]["tokens"] == result["single"]["tokens"]
    assert outs[1][0] == ""  # rank 1 printed nothing: it followed, then exited


@pytest.mark.timeout(300)
def test_rank_that_cannot_join_within_start_timeout_fails_the_launch() -> None:
    # Rank 0's program never makes a DistributedEngine: rank 1 gives up, the launch fails.
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    done = mlxi_launch("-n", "2", "--start-timeout", "3", "--rank-timeout", "2", "--", *sleeper)
    assert done.returncode != 0
    assert "rank 1: rank 0 did not open its control port" in done.stderr
    assert "within 3s" in done.stderr
    assert "Error: rank 1 (127.0.0.1) exited with status 1" in done.stderr


def test_mpi_backend_needs_mpirun() -> None:
    import shutil

    if shutil.which("mpirun") is not None:
        pytest.skip("mpirun is installed here")
    with pytest.raises(ValueError, match="needs mpirun"):
        launch(["chat.py"], num_ranks=2, backend="mpi")


def test_mlxi_launch_without_ranks_is_a_usage_error() -> None:
    from mlx_integrations.cli.main import app
    from typer.testing import CliRunner

    done = CliRunner().invoke(app, ["launch", "chat.py"])
    assert done.exit_code == 2
    assert "pass the number of local ranks (-n N" in done.stderr


@pytest.mark.smollm
@pytest.mark.timeout(600)
def test_smollm_over_three_ranks_matches_one_process(smollm2_path: Path) -> None:
    done = mlxi_launch(
        "-n", "3", "--rank-timeout", "60", RANK0, "match", str(smollm2_path), "6", timeout=540
    )
    assert done.returncode == 0, done.stderr
    result = last_json(done)
    assert result["world_size"] == 3
    assert result["distributed"]["tokens"] == result["single"]["tokens"]
    assert result["distributed"]["text"] == result["single"]["text"]


@pytest.mark.smollm
@pytest.mark.timeout(300)
def test_smollm_over_two_ranks_is_refused_naming_its_heads(smollm2_path: Path) -> None:
    done = mlxi_launch("-n", "2", RANK0, "refuse", str(smollm2_path))
    result = last_json(done)
    assert result["type"] == "ValueError"
    assert "9 attention heads" in result["error"] and "over 2 ranks" in result["error"]
    assert "(3)" in result["error"]  # the rank count that fits
    assert done.returncode != 0  # the other rank was told to exit, with a failure


# ------------------------------------------------------------ no processes


def test_tensor_split_check_names_the_sizes() -> None:
    config = {"num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536}
    check_tensor_split(config, 3, "m")
    with pytest.raises(ValueError, match=r"9 attention heads, 3 KV heads.*\(3\)"):
        check_tensor_split(config, 2, "m")
    with pytest.raises(ValueError, match="FFN width"):
        check_tensor_split({"num_attention_heads": 4, "intermediate_size": 6}, 4, "m")


def test_engine_options_are_checked_before_any_rank_starts(tiny_split: Path) -> None:
    from mlx_integrations.engine import DistributedEngine

    with pytest.raises(ValueError, match="parallel must be 'tensor' or 'pipeline'"):
        DistributedEngine(tiny_split, parallel="data")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rank_timeout must be a positive"):
        DistributedEngine(tiny_split, rank_timeout=0)
    with pytest.raises(ValueError, match="does not take draft_model, prompt_lookup or kv_bits"):
        DistributedEngine(tiny_split, kv_bits=8)


def test_launch_refuses_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nothing to launch"):
        launch([], num_ranks=2)
    with pytest.raises(ValueError, match="number of local ranks"):
        launch(["x.py"])
    with pytest.raises(ValueError, match="backend must be 'ring' or 'mpi'"):
        launch(["x.py"], num_ranks=2, backend="tcp")  # type: ignore[arg-type]
    bad = tmp_path / "hosts.json"
    bad.write_text('{"ssh": "a"}')
    with pytest.raises(ValueError, match="JSON list of hosts"):
        read_hostfile(bad)


def test_remote_ranks_start_over_ssh_with_the_ring_hostfile() -> None:
    hosts = [Host("mac1", "10.0.0.1"), Host("mac2", "10.0.0.2")]
    commands = rank_commands(
        ["chat.py", "--fast"],
        hosts,
        ring_ports=[5001, 5002],
        control_port=5003,
        hostfile_path="/tmp/h.json",
        python="/opt/py/bin/python",
        cwd="/work",
        rank_timeout=30,
        start_timeout=120,
    )
    first, second = commands
    assert first.argv[:2] == ["ssh", "mac1"] and second.argv[:2] == ["ssh", "mac2"]
    assert "/opt/py/bin/python chat.py --fast" in first.argv[2]
    assert "-m mlx_integrations.engine.distributed.ranks" in second.argv[2]
    assert '[["10.0.0.1:5001"], ["10.0.0.2:5002"]]' in second.argv[2]
    assert second.env["MLX_RANK"] == "1" and second.env["MLXI_CONTROL"] == "10.0.0.1:5003"


def test_adapters_make_a_distributed_engine_through_the_pool(tiny_split: Path) -> None:
    from mlx_integrations.engine import DistributedEngine, pool
    from mlx_integrations.langchain import ChatMLX

    chat = ChatMLX(
        model=str(tiny_split), engine_type="distributed", engine_options={"parallel": "pipeline"}
    )
    try:
        assert isinstance(chat.engine, DistributedEngine)
        assert chat.engine.parallel == "pipeline" and chat.engine.world_size == 1
        assert chat.get_stats()["state"] == "idle"  # nothing loads before the first call
    finally:
        del chat
        pool.unload_idle()


def test_local_ranks_share_the_cores_for_blas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    # The cores this process may use: 8 of the machine's 16.
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    hosts = [
        Host("127.0.0.1", "127.0.0.1"),
        Host("localhost", "127.0.0.1"),
        Host("mac2", "10.0.0.2"),
    ]
    commands = rank_commands(
        ["chat.py"],
        hosts,
        ring_ports=[1, 2, 3],
        control_port=4,
        hostfile_path="/tmp/h.json",
        python="python",
        cwd="/work",
        rank_timeout=30,
        start_timeout=120,
    )
    share_cores(commands)
    assert [c.env.get("OPENBLAS_NUM_THREADS") for c in commands] == ["4", "4", None]
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")  # the user's choice stands
    fresh = rank_commands(
        ["chat.py"],
        hosts[:2],
        ring_ports=[1, 2],
        control_port=4,
        hostfile_path="/tmp/h.json",
        python="python",
        cwd="/work",
        rank_timeout=30,
        start_timeout=120,
    )
    share_cores(fresh)
    assert all("OPENBLAS_NUM_THREADS" not in c.env for c in fresh)


class _ScriptedGroup:
    """rank 1 of 2 as follow() sees it: rank 0's messages come from a script."""

    rank, size = 1, 2

    def __init__(self, *messages: dict[str, Any]) -> None:
        self.messages = list(messages)
        self.gathered: list[list[float]] = []
        self.group = None
        self.client = self
        self.said: list[dict[str, Any]] = []

    def share(self, message: None) -> dict[str, Any]:
        return self.messages.pop(0)

    def gather(self, values: list[float]) -> list[list[float]]:
        self.gathered.append(values)
        return [[0.0], values]

    def send(self, message: dict[str, Any]) -> None:
        self.said.append(message)


def test_a_follower_whose_load_failed_waits_for_rank_zeros_exit_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Leaving on its own right after the gather raced rank 0: its closed connection
    # could be read as a lost rank before rank 0 knew of the failure, and the other
    # ranks were told that instead of the cause.
    from mlx_integrations.engine.distributed import ranks

    def no_model(*_: object) -> None:
        raise FileNotFoundError("no such folder")

    monkeypatch.setattr(ranks, "load_shard", no_model)
    group = _ScriptedGroup(
        {"op": "load", "path": "/m", "parallel": "tensor"},
        {"op": "exit", "code": 1, "reason": "the model did not load on every rank"},
    )
    assert ranks.follow(group) == 1  # type: ignore[arg-type]
    assert group.said == [{"error": "could not load the model: no such folder"}]
    assert group.gathered == [[1.0]] and group.messages == []


class _Ended:
    def __init__(self, code: int) -> None:
        self.pid, self.returncode = 0, code

    def poll(self) -> int:
        return self.returncode


def test_launch_names_the_killed_rank_when_ranks_end_between_two_polls() -> None:
    # Rank 1 is killed, rank 0 reports it and exits 3, all before the launcher's next
    # poll: it sees both at once, in rank order; the killed rank is the cause.
    from mlx_integrations.engine.distributed.launch import _watch

    result = _watch([_Ended(3), _Ended(-9)], ["127.0.0.1", "127.0.0.1"], grace=60)  # type: ignore[list-item]
    assert result.failure == "rank 1 (127.0.0.1) was killed by SIGKILL"
    assert result.exit_code == 128 + 9
    result = _watch([_Ended(0), _Ended(1), _Ended(2)], ["a", "b", "c"], grace=60)  # type: ignore[list-item]
    assert result.failure == "rank 1 (b) exited with status 1" and result.exit_code == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_rank_whose_launcher_died_before_its_death_signal_was_set_ends() -> None:
    hook = (
        "from mlx_integrations.engine.distributed.launch import _die_with_parent as d; import os; "
    )
    orphan = subprocess.run([sys.executable, "-c", hook + "d(os.getpid())()"], timeout=120)
    assert orphan.returncode == -9  # its parent is not the launcher it was started by
    child = subprocess.run([sys.executable, "-c", hook + "d(os.getppid())()"], timeout=120)
    assert child.returncode == 0
