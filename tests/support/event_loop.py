"""How often the event loop ran other tasks while one awaitable ran."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
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
