"""The engine contract matches the reference (vllm_mlx.engine.base) name for name."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import threading
import time

import pytest

from mlx_integrations.engine import base
from mlx_integrations.engine.base import (
    BaseEngine,
    EngineBusy,
    GenerationOutput,
    cleanup_startup_cancellation,
    run_blocking_startup_work,
    suspend_cancellation,
)


def test_generation_output_fields_and_defaults():
    fields = {f.name: f for f in dataclasses.fields(GenerationOutput)}
    assert list(fields) == [
        "text",
        "tokens",
        "prompt_tokens",
        "completion_tokens",
        "finish_reason",
        "mtp_drafts",
        "mtp_accepted",
        "new_text",
        "finished",
    ]
    out = GenerationOutput(text="x")
    assert out.tokens == [] and out.tokens is not GenerationOutput(text="y").tokens
    assert (out.prompt_tokens, out.completion_tokens) == (0, 0)
    assert out.finish_reason == "stop"
    assert (out.mtp_drafts, out.mtp_accepted) == (0, 0)
    assert out.new_text == "" and out.finished is True


def test_engine_busy():
    assert issubclass(EngineBusy, RuntimeError)
    assert EngineBusy.code == "text_generation_busy"


def test_abstract_members():
    assert BaseEngine.__abstractmethods__ == frozenset(
        {
            "model_name",
            "is_mllm",
            "tokenizer",
            "start",
            "stop",
            "generate",
            "stream_generate",
            "chat",
            "stream_chat",
        }
    )


EXPECTED_SIGNATURES = {
    "generate": "(self, prompt: 'str', max_tokens: 'int' = 256, temperature: 'float' = 0.7, "
    "top_p: 'float' = 0.9, stop: 'list[str] | None' = None, **kwargs: 'Any') -> 'GenerationOutput'",
    "stream_generate": "(self, prompt: 'str', max_tokens: 'int' = 256, temperature: 'float' = 0.7, "
    "top_p: 'float' = 0.9, stop: 'list[str] | None' = None, **kwargs: 'Any') "
    "-> 'AsyncIterator[GenerationOutput]'",
    "chat": "(self, messages: 'list[dict[str, Any]]', max_tokens: 'int' = 256, "
    "temperature: 'float' = 0.7, top_p: 'float' = 0.9, tools: 'list[dict] | None' = None, "
    "images: 'list[str] | None' = None, videos: 'list[str] | None' = None, **kwargs: 'Any') "
    "-> 'GenerationOutput'",
    "stream_chat": "(self, messages: 'list[dict[str, Any]]', max_tokens: 'int' = 256, "
    "temperature: 'float' = 0.7, top_p: 'float' = 0.9, tools: 'list[dict] | None' = None, "
    "images: 'list[str] | None' = None, videos: 'list[str] | None' = None, **kwargs: 'Any') "
    "-> 'AsyncIterator[GenerationOutput]'",
    "get_stats": "(self) -> 'dict[str, Any]'",
    "get_cache_stats": "(self) -> 'dict[str, Any] | None'",
    "clear_runtime_caches": "(self) -> 'dict[str, Any] | None'",
    "abort_request": "(self, request_id: 'str') -> 'bool'",
    "prepare_for_start": "(self) -> 'None'",
    "start": "(self) -> 'None'",
    "stop": "(self) -> 'None'",
}


@pytest.mark.parametrize("name", sorted(EXPECTED_SIGNATURES))
def test_method_signatures(name):
    assert str(inspect.signature(getattr(BaseEngine, name))) == EXPECTED_SIGNATURES[name]


@pytest.mark.parametrize(
    "name", ["start", "stop", "generate", "stream_generate", "chat", "stream_chat", "abort_request"]
)
def test_async_members(name):
    assert inspect.iscoroutinefunction(getattr(BaseEngine, name))


def test_helper_signatures():
    assert str(inspect.signature(run_blocking_startup_work)) == (
        "(work: 'Callable[[], Any]') -> 'None'"
    )
    assert str(inspect.signature(cleanup_startup_cancellation)) == (
        "(cleanup: 'Callable[[], Awaitable[None]]') -> 'None'"
    )
    assert inspect.iscoroutinefunction(run_blocking_startup_work)
    assert inspect.iscoroutinefunction(cleanup_startup_cancellation)
    assert isinstance(base.logger, logging.Logger) and base.logger.name == base.__name__


class _Minimal(BaseEngine):
    """The smallest engine the contract allows: only the abstract members."""

    model_name = "m"
    is_mllm = False
    tokenizer = None

    async def start(self): ...
    async def stop(self): ...
    async def generate(self, prompt, max_tokens=256, temperature=0.7, top_p=0.9, stop=None, **kw):
        return GenerationOutput(text=prompt)

    async def stream_generate(
        self, prompt, max_tokens=256, temperature=0.7, top_p=0.9, stop=None, **kw
    ):
        yield GenerationOutput(text=prompt)

    async def chat(
        self,
        messages,
        max_tokens=256,
        temperature=0.7,
        top_p=0.9,
        tools=None,
        images=None,
        videos=None,
        **kw,
    ):
        return GenerationOutput(text="")

    async def stream_chat(
        self,
        messages,
        max_tokens=256,
        temperature=0.7,
        top_p=0.9,
        tools=None,
        images=None,
        videos=None,
        **kw,
    ):
        yield GenerationOutput(text="")


async def test_defaults_of_concrete_members():
    engine = _Minimal()
    assert engine.preserve_native_tool_format is False
    engine.preserve_native_tool_format = True
    assert engine.preserve_native_tool_format is True
    assert engine._preserve_native_tool_format is True
    assert engine.prepare_for_start() is None
    assert engine.get_stats() == {}
    assert engine.get_cache_stats() is None
    assert engine.clear_runtime_caches() is None
    assert await engine.abort_request("x") is False


# --- cancellation helpers -----------------------------------------------------------------


async def test_cancelled_caller_waits_for_startup_work_then_sees_cancellation():
    started, release = threading.Event(), threading.Event()
    finished = []

    def work():
        started.set()
        release.wait(5)
        finished.append(time.monotonic())

    task = asyncio.create_task(run_blocking_startup_work(work))
    await asyncio.to_thread(started.wait, 5)
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done(), "returned before the blocking work finished"
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished, "the work must have finished before the cancellation surfaced"


async def test_cancelled_twice_still_waits():
    release = threading.Event()
    done = []
    task = asyncio.create_task(run_blocking_startup_work(lambda: (release.wait(5), done.append(1))))
    await asyncio.sleep(0.02)
    task.cancel()
    await asyncio.sleep(0.02)
    task.cancel()
    await asyncio.sleep(0.02)
    assert not task.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert done == [1]


async def test_startup_work_result_and_error_pass_through():
    ran = []
    await run_blocking_startup_work(lambda: ran.append(threading.current_thread().name))
    assert ran and ran[0] != threading.current_thread().name  # ran off the loop's thread

    def boom():
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        await run_blocking_startup_work(boom)


async def test_failing_cleanup_is_logged_and_cancellation_preserved(caplog):
    async def cleanup():
        await asyncio.sleep(0)
        raise RuntimeError("cleanup exploded")

    async def starter():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await cleanup_startup_cancellation(cleanup)
            raise

    task = asyncio.create_task(starter())
    await asyncio.sleep(0.01)
    task.cancel()
    with caplog.at_level(logging.ERROR, logger=base.__name__):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert "Engine startup cleanup failed while preserving cancellation" in caplog.text
    assert "cleanup exploded" in caplog.text


async def test_cleanup_runs_to_completion_after_cancellation_was_delivered():
    steps = []

    async def cleanup():
        await asyncio.sleep(0.01)  # would raise CancelledError without suspension
        steps.append("done")

    async def starter():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await cleanup_startup_cancellation(cleanup)
            steps.append("after")
            raise

    task = asyncio.create_task(starter())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps == ["done", "after"]
    assert task.cancelled()


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
async def test_keyboard_interrupt_and_system_exit_pass_through(exc_type):
    async def cleanup():
        raise exc_type()

    with pytest.raises(exc_type):
        await cleanup_startup_cancellation(cleanup)


async def test_suspend_cancellation_restores_pending_cancels():
    seen = []

    async def body():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            seen.append(task.cancelling())
            with suspend_cancellation():
                seen.append(task.cancelling())
                await asyncio.sleep(0.01)  # no CancelledError while suspended
            seen.append(task.cancelling())
            await asyncio.sleep(0)  # the restored cancellation is delivered here
            seen.append("not reached")

    task = asyncio.create_task(body())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == [1, 0, 1]
