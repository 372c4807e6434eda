"""Owner threads outlive their engines: a stopped engine's thread serves the next one,
and no thread releases its MLX streams (which empties MLX's process-wide compile cache)
while the process runs; kept threads release them at exit."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from mlx_integrations.engine import SimpleEngine
from mlx_integrations.runtime import owner

MESSAGES = [{"role": "user", "content": "Hi"}]


def _thread_of(engine: SimpleEngine) -> threading.Thread:
    executor = engine._executor
    assert executor is not None
    return executor.submit(threading.current_thread).result()


async def test_a_stopped_engines_thread_serves_the_next_engine(tiny_llama: Path, monkeypatch):
    released: list[str] = []
    real = owner.release_thread_streams
    monkeypatch.setattr(
        owner,
        "release_thread_streams",
        lambda: (released.append(threading.current_thread().name), real()),
    )
    first = SimpleEngine(tiny_llama, cache_memory_mb=1)
    await first.start()
    thread = _thread_of(first)
    reply = (await first.chat(MESSAGES, max_tokens=4, temperature=0)).text
    await first.stop()
    second = SimpleEngine(tiny_llama, cache_memory_mb=2)
    try:
        await second.start()
        assert _thread_of(second) is thread and thread.is_alive()
        assert thread.name == f"mlxi-owner-{tiny_llama.name}_0"
        assert (await second.chat(MESSAGES, max_tokens=4, temperature=0)).text == reply
    finally:
        await second.stop()
    assert released == []  # no stream release while the process runs


EXIT_SCRIPT = """
import asyncio, sys
sys.path.insert(0, {root!r})
import mlx_integrations
from mlx_integrations.engine import SimpleEngine

async def main():
    engines = [SimpleEngine({path!r}, cache_memory_mb=n) for n in (1, 2, 3)]
    for engine in engines:
        await engine.start()
        await engine.chat([{{"role": "user", "content": "Hi"}}], max_tokens=2)
    await engines[0].stop()  # its thread is kept, then the next stop keeps another
    await engines[1].stop()
    # engines[2] is left running; the side thread made MLX streams too
    import mlx.core as mx
    from mlx_integrations.runtime.owner import run_aside
    assert run_aside(lambda: (mx.ones(3) + 1).tolist()) == [2.0, 2.0, 2.0]

asyncio.run(main())
print("done")
"""


def _ends_cleanly(template: str, model: Path) -> None:
    """Run ``template`` (given the repository root and the model) as a script: it must
    print "done" and exit with code 0 within 120 s."""
    root = str(Path(__file__).resolve().parents[2])
    script = template.format(root=root, path=str(model))
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the process did not exit: {exc.stderr!r}") from None
    assert proc.stdout.strip() == "done", proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_kept_threads_release_their_streams_and_end_at_exit(tiny_llama: Path):
    for _ in range(2):  # an abort at exit is intermittent
        _ends_cleanly(EXIT_SCRIPT, tiny_llama)


IN_FLIGHT_SCRIPT = """
import asyncio, sys
sys.path.insert(0, {root!r})
from mlx_integrations.engine import BatchedEngine

loop = asyncio.new_event_loop()
engine = BatchedEngine({path!r}, max_num_seqs=2, cache_memory_mb=0)
loop.run_until_complete(engine.start())

async def main():
    asyncio.ensure_future(engine.generate("hello " * 20, max_tokens=100000, temperature=0))
    while not engine._jobs:  # the request is in the engine
        await asyncio.sleep(0.01)
    raise RuntimeError("the script fails while a request runs")

try:
    loop.run_until_complete(main())
except RuntimeError:
    pass
loop.close()  # neither the request nor the engine is stopped
print("done", flush=True)
"""


def test_a_process_ending_with_a_request_in_flight_exits(tiny_llama: Path):
    """A script that closes its loop while a request runs, without stopping the engine:
    the request's task is collected at interpreter exit, and the model's use ending then
    must not wait for a new residency thread (none can start at exit)."""
    _ends_cleanly(IN_FLIGHT_SCRIPT, tiny_llama)


def test_threads_release_their_streams_one_at_a_time(monkeypatch):
    """Kept threads all release at exit: a second release waits for the first, and the
    collector stays off for the whole of each (the release that turned it off must not
    turn it back on while another still runs)."""
    import gc
    import time

    import mlx.core as mx

    second_entered = threading.Event()  # only without the lock, while the first runs
    first_returned = threading.Event()
    inside = 0
    seen: list[tuple[str, int, bool]] = []  # (thread, releases running, collector on)
    count = threading.Lock()

    def clear_streams() -> None:
        nonlocal inside
        name = threading.current_thread().name
        with count:
            inside += 1
        if name == "first":
            second_entered.wait(1)  # unserialized, the second release is inside now
        else:
            second_entered.set()
            first_returned.wait(1)  # unserialized, the first has turned the collector on
        with count:
            seen.append((name, inside, gc.isenabled()))
            inside -= 1

    monkeypatch.setattr(mx, "clear_streams", clear_streams, raising=False)

    def first() -> None:
        owner.release_thread_streams()
        first_returned.set()

    threads = [
        threading.Thread(target=first, name="first"),
        threading.Thread(target=owner.release_thread_streams, name="second"),
    ]
    was_collecting = gc.isenabled()
    threads[0].start()
    deadline = time.monotonic() + 30
    while not (seen or inside) and time.monotonic() < deadline:  # the first is in
        time.sleep(0.01)
    threads[1].start()
    for thread in threads:
        thread.join(30)
    assert seen == [("first", 1, False), ("second", 1, False)]
    assert gc.isenabled() == was_collecting


async def test_the_side_thread_is_one_for_the_process_and_never_an_owner(tiny_llama: Path):
    def boom() -> None:
        raise ValueError("raised aside")

    caller = threading.current_thread()
    side = owner.run_aside(threading.current_thread)
    assert side is not caller and side.name.startswith(owner.ASIDE_NAME)
    assert owner.run_aside(threading.current_thread) is side  # the same thread each time
    try:
        owner.run_aside(boom)
    except ValueError as exc:  # the caller gets fn's own error
        assert str(exc) == "raised aside"
    else:
        raise AssertionError("run_aside swallowed the error")
    assert owner.run_aside(lambda: 6 * 7) == 42  # and the thread goes on
    # A call from the side thread itself runs there at once (queued, it would wait for
    # the call it is part of).
    nested: list[threading.Thread] = []
    outer = threading.Thread(
        target=lambda: nested.append(
            owner.run_aside(lambda: owner.run_aside(threading.current_thread))
        ),
        daemon=True,  # a regression fails here rather than hold the process
    )
    outer.start()
    outer.join(60)
    assert not outer.is_alive(), "a call from the side thread waited for itself"
    assert nested == [side]
    first = SimpleEngine(tiny_llama, cache_memory_mb=4)
    await first.start()
    await first.stop()  # its thread is kept for the next owner; the side thread never is
    second = SimpleEngine(tiny_llama, cache_memory_mb=5)
    try:
        await second.start()
        assert _thread_of(second) is not side
    finally:
        await second.stop()


def test_the_side_thread_releases_its_streams_at_exit_and_later_calls_run_inline(
    monkeypatch,
):
    """At interpreter exit the side thread, like the kept owner threads, releases its
    MLX streams as its last job and ends; a call after that runs on the caller."""
    # A side thread of this test's own, and no kept owner threads to end.
    monkeypatch.setattr(owner, "_aside", None)
    monkeypatch.setattr(owner, "_idle", [])
    monkeypatch.setattr(owner, "_exiting", False)
    released: list[str] = []
    monkeypatch.setattr(
        owner, "release_thread_streams", lambda: released.append(threading.current_thread().name)
    )
    side = owner.run_aside(threading.current_thread)
    owner._end_idle_threads()
    side.join(60)
    assert not side.is_alive()
    assert released == [side.name]
    assert owner.run_aside(threading.current_thread) is threading.current_thread()
