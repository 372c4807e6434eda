"""Event-loop helpers of the tests: how often the loop ran other tasks while one
awaitable ran, and waiting until a condition holds."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def loop_ticks_while(work: Awaitable[T], interval: float = 0.001) -> tuple[T, int]:
    """Await ``work`` beside a task that counts a tick every ``interval`` seconds.

    Returns ``work``'s result and the ticks: a call that blocks the event loop gets
    next to none.
    """
    ticks = 0
    running = True

    async def ticker() -> None:
        nonlocal ticks
        while running:
            ticks += 1
            await asyncio.sleep(interval)

    task = asyncio.create_task(ticker())
    try:
        result = await work
    finally:
        running = False
        await task
    return result, ticks


async def wait_until(
    predicate: Callable[[], object], what: str = "the condition holds", timeout: float = 30.0
) -> None:
    """Poll ``predicate`` until it is true; fail naming ``what`` after ``timeout`` seconds
    (a bound on a hang, not on speed)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.005)
