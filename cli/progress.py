"""Rich progress bars on stderr for the store's progress callbacks."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def progress_bars(enabled: bool = True) -> Iterator[Any]:
    """Yield a callback for ``progress=`` that draws one bar per task on stderr.

    Nothing is drawn when stderr is not a terminal or ``enabled`` is False, so logs
    and pipes stay clean.
    """
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )

    from mlx_integrations.models.progress import ProgressUpdate

    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield None
        return
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description:<16}"),
        BarColumn(),
        TextColumn("{task.fields[amount]}"),
        TextColumn("{task.fields[speed]}"),
        TimeElapsedColumn(),
        console=console,
    )
    tasks: dict[str, TaskID] = {}
    download = DownloadColumn()
    speed = TransferSpeedColumn()
    count = MofNCompleteColumn()

    def callback(update: ProgressUpdate) -> None:
        task_id = tasks.get(update.task)
        if task_id is None:
            # A resumed download starts part-way: those bytes are no part of the speed.
            task_id = progress.add_task(
                update.description,
                total=update.total,
                completed=int(update.completed),
                amount="",
                speed="",
            )
            tasks[update.task] = task_id
        progress.update(
            task_id, completed=update.completed, total=update.total, description=update.description
        )
        task = progress.tasks[task_id]
        amount: Any
        rate: Any
        if update.unit == "B":
            amount, rate = download.render(task), speed.render(task)
        elif update.total:
            amount, rate = count.render(task), ""
        else:
            amount, rate = "", ""
        progress.update(task_id, amount=amount, speed=rate)

    with progress:
        yield callback
