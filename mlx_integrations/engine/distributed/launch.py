"""Starting the ranks of a distributed program, watching them, and a real exit code.

Rank 0 runs the given program (a Python script, or any command such as ``mlxi run``);
ranks 1 and above run :mod:`mlx_integrations.engine.distributed.ranks`, which loads the model that
rank 0's :class:`~mlx_integrations.engine.distributed.engine.DistributedEngine` names and
follows it. Local ranks are processes on 127.0.0.1; a hostfile names machines, reached
over ssh. The launcher returns non-zero when any rank fails, and stops the others.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from mlx_integrations.engine.distributed.ranks import (
    DEFAULT_RANK_TIMEOUT,
    DEFAULT_START_TIMEOUT,
    ENV_BACKEND,
    ENV_CONTROL,
    ENV_RANK_TIMEOUT,
    ENV_START_TIMEOUT,
    ENV_WORLD_SIZE,
    positive_seconds,
)

Backend = Literal["ring", "mpi"]
LOCAL_HOSTS = frozenset({"", "localhost", "127.0.0.1", "::1"})
FOLLOWER_MODULE = "mlx_integrations.engine.distributed.ranks"


@dataclass(frozen=True)
class Host:
    """A machine of a hostfile: how to reach it (ssh) and its address for the ring."""

    ssh: str
    ip: str

    @property
    def is_local(self) -> bool:
        return self.ssh in LOCAL_HOSTS


@dataclass(frozen=True)
class RankCommand:
    """How one rank is started."""

    rank: int
    host: Host
    argv: list[str]
    env: dict[str, str]
    """Variables set for the rank (on top of the launcher's environment, when local)."""


@dataclass
class RankExit:
    rank: int
    host: str
    returncode: int | None
    """The exit status (negative: killed by that signal); None if it never ended."""
    stopped: bool = False
    """The launcher stopped it (after another rank failed, or at SIGTERM)."""


@dataclass
class LaunchResult:
    exit_code: int
    """0 when every rank exited 0; otherwise non-zero (128 + signal for a killed rank)."""
    ranks: list[RankExit] = field(default_factory=list)
    failure: str | None = None
    """What went wrong, in one sentence."""


def read_hostfile(path: str | Path) -> list[Host]:
    """Read a hostfile: a JSON list of ``{"ssh": name, "ips": [address]}`` (as
    ``mlx.launch`` writes) or of host names.

    Raises:
        ValueError: Not such a list, or an entry without a host.
    """
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read hostfile {path}: {exc}") from exc
    if not isinstance(entries, list) or not entries:
        raise ValueError(
            f"hostfile {path} must hold a JSON list of hosts, e.g. "
            '[{"ssh": "mac1", "ips": ["10.0.0.1"]}, {"ssh": "mac2", "ips": ["10.0.0.2"]}]'
        )
    hosts = []
    for entry in entries:
        if isinstance(entry, str) and entry:
            hosts.append(Host(entry, entry))
        elif isinstance(entry, dict) and isinstance(entry.get("ssh"), str):
            ips = entry.get("ips") or [entry["ssh"]]
            hosts.append(Host(entry["ssh"], str(ips[0])))
        else:
            raise ValueError(f"hostfile {path}: entry {entry!r} has no 'ssh' host name")
    return hosts


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports that are free on ``host`` right now."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def rank_commands(
    command: Sequence[str],
    hosts: Sequence[Host],
    *,
    ring_ports: Sequence[int],
    control_port: int,
    hostfile_path: str,
    python: str,
    cwd: str,
    rank_timeout: float,
    start_timeout: float,
) -> list[RankCommand]:
    """The command line and variables of every rank of a ring group (ssh for remote hosts)."""
    ring = [[f"{host.ip}:{port}"] for host, port in zip(hosts, ring_ports, strict=True)]
    program = [python, *command] if command[0].endswith(".py") else list(command)
    out = []
    for rank, host in enumerate(hosts):
        env = {
            "MLX_RANK": str(rank),
            "MLX_HOSTFILE": hostfile_path,
            ENV_WORLD_SIZE: str(len(hosts)),
            ENV_BACKEND: "ring",
            ENV_CONTROL: f"{hosts[0].ip}:{control_port}",
            ENV_RANK_TIMEOUT: f"{rank_timeout:g}",
            ENV_START_TIMEOUT: f"{start_timeout:g}",
        }
        argv = program if rank == 0 else [python, "-m", FOLLOWER_MODULE]
        if not host.is_local:  # write the ring's hostfile there, then run the rank
            script = (
                f"cd {shlex.quote(cwd)} && printf %s {shlex.quote(json.dumps(ring))} > "
                f"{shlex.quote(hostfile_path)} && env "
                + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
                + " "
                + shlex.join(argv)
            )
            argv = ["ssh", host.ssh, script]
        out.append(RankCommand(rank, host, argv, env))
    return out


def share_cores(commands: Sequence[RankCommand]) -> None:
    """Give the local ranks an equal share of the cores this process may use, for OpenBLAS.

    Ranks on one machine each start a BLAS thread per core by default, and MLX's ring
    spins while a rank waits for the others: oversubscribed, three ranks on two cores
    decoded 0.55 tokens/s against 0.74 with one thread each. Set
    ``OPENBLAS_NUM_THREADS`` to choose otherwise.
    """
    local = [c for c in commands if c.host.is_local]
    if not local or "OPENBLAS_NUM_THREADS" in os.environ:
        return
    for command in local:
        command.env["OPENBLAS_NUM_THREADS"] = blas_share(len(local))


def blas_share(ranks: int) -> str:
    """OpenBLAS threads for each of ``ranks`` processes on this machine: an equal share
    of the cores this process may use (all of them where the OS cannot say), at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return str(max(1, (cores or 1) // ranks))


def mpi_command(
    command: Sequence[str],
    num_ranks: int,
    *,
    control_port: int,
    python: str,
    rank_timeout: float,
    start_timeout: float,
) -> tuple[list[str], dict[str, str]]:
    """``mpirun`` running the program as rank 0 and the followers as the rest (local)."""
    env = {
        "MLX_MPI_LIBNAME": os.environ.get("MLX_MPI_LIBNAME", "libmpi.so.40"),
        ENV_WORLD_SIZE: str(num_ranks),
        ENV_BACKEND: "mpi",
        ENV_CONTROL: f"127.0.0.1:{control_port}",
        ENV_RANK_TIMEOUT: f"{rank_timeout:g}",
        ENV_START_TIMEOUT: f"{start_timeout:g}",
    }
    if "OPENBLAS_NUM_THREADS" not in os.environ:  # see share_cores
        env["OPENBLAS_NUM_THREADS"] = blas_share(num_ranks)
    exports = [arg for name in env for arg in ("-x", name)]
    program = [python, *command] if command[0].endswith(".py") else list(command)
    argv = ["mpirun", "-np", "1", *exports, *program]
    if num_ranks > 1:
        argv += [":", "-np", str(num_ranks - 1), *exports, python, "-m", FOLLOWER_MODULE]
    return argv, env


def launch(
    command: Sequence[str],
    *,
    num_ranks: int | None = None,
    hostfile: str | Path | None = None,
    backend: Backend = "ring",
    start_timeout: float = DEFAULT_START_TIMEOUT,
    rank_timeout: float = DEFAULT_RANK_TIMEOUT,
    grace: float | None = None,
    python: str | None = None,
    on_start: Callable[[list[int]], None] | None = None,
) -> LaunchResult:
    """Start every rank, wait for them, and report how they ended.

    Args:
        command: Rank 0's program: a ``.py`` script and its arguments (run with
            ``python``), or any command (``["mlxi", "run", "model", "Hi"]``).
        num_ranks: Local ranks on 127.0.0.1 (or how many hosts of ``hostfile``).
        hostfile: Machines, one rank each (see :func:`read_hostfile`).
        backend: ``"ring"`` (MLX's TCP ring), or ``"mpi"`` (local ranks, ``mpirun``).
        start_timeout: Seconds every rank has to join rank 0.
        rank_timeout: Seconds of silence after which a rank counts as lost.
        grace: Seconds the other ranks have to exit on their own once one has ended
            (default ``rank_timeout + 5``: rank 0 reports a lost rank within
            ``rank_timeout``); those still running then are stopped.
        python: The interpreter of the ranks (default: this one).
        on_start: Called with the process ids once every rank has started.

    Raises:
        ValueError: No ranks, both or neither of ``num_ranks`` and ``hostfile``, an
            unknown backend, or ``mpirun`` missing for ``backend="mpi"``.
    """
    if not command:
        raise ValueError("nothing to launch: pass rank 0's program (a script or a command)")
    if backend not in ("ring", "mpi"):
        raise ValueError(f"backend must be 'ring' or 'mpi', got {backend!r}")
    for name, value in (("start_timeout", start_timeout), ("rank_timeout", rank_timeout)):
        positive_seconds(name, value)
    if hostfile is not None:
        hosts = read_hostfile(hostfile)
        if num_ranks is not None and num_ranks != len(hosts):
            raise ValueError(f"-n {num_ranks} does not match the {len(hosts)} hosts of {hostfile}")
    elif num_ranks is None or num_ranks < 1:
        raise ValueError(
            f"pass the number of local ranks (-n N, N >= 1) or a hostfile, got {num_ranks!r}"
        )
    else:
        hosts = [Host("127.0.0.1", "127.0.0.1")] * num_ranks
    python = python or sys.executable
    wait = rank_timeout + 5 if grace is None else grace
    if backend == "mpi":
        return _launch_mpi(command, hosts, python, rank_timeout, start_timeout, wait)
    local = all(h.is_local for h in hosts)
    ports = free_ports(len(hosts) + 1)
    if not local:  # remote ports cannot be probed from here: a fixed range
        ports = [32323 + r for r in range(len(hosts) + 1)]
    with tempfile.TemporaryDirectory(prefix="mlxi-launch-") as tmp:
        hostfile_path = os.path.join(tmp, "ring-hosts.json")
        ring = [[f"{h.ip}:{p}"] for h, p in zip(hosts, ports[: len(hosts)], strict=True)]
        Path(hostfile_path).write_text(json.dumps(ring))
        commands = rank_commands(
            command,
            hosts,
            ring_ports=ports[:-1],
            control_port=ports[-1],
            hostfile_path=hostfile_path,
            python=python,
            cwd=os.getcwd(),
            rank_timeout=rank_timeout,
            start_timeout=start_timeout,
        )
        share_cores(commands)
        procs = [
            subprocess.Popen(
                c.argv,
                env={**os.environ, **c.env},
                start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid()),
            )
            for c in commands
        ]
        if on_start is not None:
            on_start([p.pid for p in procs])
        return _watch(procs, [c.host.ssh for c in commands], wait)


def _launch_mpi(
    command: Sequence[str],
    hosts: list[Host],
    python: str,
    rank_timeout: float,
    start_timeout: float,
    grace: float,
) -> LaunchResult:
    import shutil

    if not all(h.is_local for h in hosts):
        raise ValueError(
            "backend='mpi' starts local ranks only; use the ring backend for a hostfile"
        )
    if shutil.which("mpirun") is None:
        raise ValueError(
            "backend='mpi' needs mpirun (Open MPI) on PATH; install it, or use the ring backend"
        )
    argv, env = mpi_command(
        command,
        len(hosts),
        control_port=free_ports(1)[0],
        python=python,
        rank_timeout=rank_timeout,
        start_timeout=start_timeout,
    )
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **env},
        start_new_session=True,
        preexec_fn=_die_with_parent(os.getpid()),
    )
    # One process (mpirun): grace counts only after a SIGTERM, which mpirun passes on.
    return _watch([proc], ["127.0.0.1"], grace)


def _watch(procs: list[subprocess.Popen[bytes]], hosts: list[str], grace: float) -> LaunchResult:
    """Wait for the ranks. Once one has failed (or rank 0 has ended), the others have
    ``grace`` seconds to exit on their own (rank 0 reports the loss first); then they
    are stopped.

    SIGTERM to the launcher (watching from the main thread) goes on to rank 0's process
    (local, or the ssh of a remote one), as a server or program is stopped: rank 0
    finishes what it is doing and tells the others to exit, and the ranks have
    ``grace`` seconds from then to end; where rank 0 has already ended, or at a second
    SIGTERM, the ranks still running are stopped at once. Ctrl-C stops them at once.
    """
    sigterms: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: sigterms.append(1)) if main else None
    try:
        return _wait(procs, hosts, grace, sigterms)
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _wait(
    procs: list[subprocess.Popen[bytes]], hosts: list[str], grace: float, sigterms: list[int]
) -> LaunchResult:
    codes: list[int | None] = [None] * len(procs)
    failure: str | None = None
    failed: int | None = None  # the rank that failure names
    since: float | None = None  # when the first failure, rank 0's exit or SIGTERM was seen
    forwarded = False  # the first SIGTERM went on to rank 0
    try:
        while not all(c is not None for c in codes):
            ended = []
            for rank, proc in enumerate(procs):
                if codes[rank] is None and (code := proc.poll()) is not None:
                    codes[rank] = code
                    ended.append(rank)
            if failure is None and (cause := _first_failure(ended, codes)) is not None:
                failed = cause
                failure = f"rank {cause} ({hosts[cause]}) {_describe(codes[cause] or 0)}"
            if sigterms and not forwarded:
                forwarded = True
                if codes[0] is not None:
                    break  # rank 0 is gone and cannot tell the others: stop them now
                since = time.monotonic()
                _signal(procs[0], signal.SIGTERM)
            if len(sigterms) > 1:
                failure = failure or "stopped by a second SIGTERM"
                break
            if since is None and (failure is not None or codes[0] is not None):
                since = time.monotonic()
            if since is not None and time.monotonic() - since > grace:
                if failure is None:
                    late = [r for r, c in enumerate(codes) if c is None]
                    after = "SIGTERM" if forwarded else "rank 0 exited"
                    failure = f"rank(s) {late} still ran {grace:g}s after {after}"
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        failure = "interrupted"
    stopped = _stop(procs, codes)
    ranks = [
        RankExit(r, hosts[r], codes[r] if codes[r] is not None else p.returncode, r in stopped)
        for r, p in enumerate(procs)
    ]
    if failure is None:
        return LaunchResult(0, ranks)
    if failure == "interrupted":
        return LaunchResult(130, ranks, "interrupted")
    first = codes[failed] if failed is not None else 1
    assert first is not None
    return LaunchResult(128 - first if first < 0 else first, ranks, failure)


def _first_failure(ended: list[int], codes: list[int | None]) -> int | None:
    """Which of the ranks seen ended in one poll failed first, as far as can be told.

    Ranks that end between two polls come in rank order, not in the order they ended:
    a rank killed by a signal (the cause, mostly: ranks that notice a lost rank exit
    with a status) goes before one that exited with a status, then the lowest rank.
    """
    bad = [r for r in ended if codes[r]]
    signalled = [r for r in bad if (codes[r] or 0) < 0]
    first = signalled or bad
    return first[0] if first else None


def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Send ``sig`` to a rank's process group (it may have ended meanwhile)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _stop(procs: list[subprocess.Popen[bytes]], codes: list[int | None]) -> set[int]:
    """SIGTERM the ranks still running (their process groups), SIGKILL after 5 s."""
    running = {r for r, c in enumerate(codes) if c is None}
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        alive = [r for r in running if procs[r].poll() is None]
        if not alive:
            break
        for r in alive:
            _signal(procs[r], sig)
        deadline = time.monotonic() + wait
        for r in alive:
            try:
                procs[r].wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    return running


def _die_with_parent(launcher: int) -> Callable[[], None]:
    """The hook a rank's process runs before its program: end it when the launcher
    (process ``launcher``) dies (Linux).

    The death signal covers only a parent that dies after it is set; a launcher that
    died between the fork and the hook has left the rank to another parent already,
    and the rank ends at once.
    """

    def hook() -> None:
        if sys.platform.startswith("linux"):
            import ctypes

            PR_SET_PDEATHSIG = 1
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != launcher:
                os.kill(os.getpid(), signal.SIGKILL)

    return hook


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"
