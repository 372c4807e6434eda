"""Ctrl-C in ``mlxi``'s interactive reads: the session of ``mlxi run`` and the questions
of commands that delete.

Python runs a SIGINT handler in the main thread only, between two bytecodes, so a
Ctrl-C that lands just before a blocking read begins would wait for the read to end
(for the next line typed). :class:`SessionSignals` closes that gap.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from types import FrameType, TracebackType
from typing import Any

STOP = object()  # Ctrl-C while an answer streams


class SessionSignals:
    """One SIGINT handler for all of ``mlxi run``'s session, or a question before a deletion,
    so that no Ctrl-C is ever lost.

    While an answer streams (:meth:`answering`), Ctrl-C only queues a stop for the
    answer loop, which cancels the request at a well-defined point; at any other time it
    raises KeyboardInterrupt, as Python's own handler does. Python runs the handler in
    the main thread only, between two bytecodes; a Ctrl-C that lands just before a
    blocking read begins (while ``input()`` draws the prompt, or as the answer loop
    starts waiting), or that the kernel hands to another thread, would wait for that
    read to end. So a watcher thread, woken by every signal through
    ``signal.set_wakeup_fd``, interrupts the main thread's read with a SIGUSR1 (whose
    handler does nothing) until the SIGINT handler has run.
    """

    def __init__(self) -> None:
        self._events: queue.SimpleQueue[Any] | None = None
        self._received = 0
        self._handled = 0
        self._main: int | None = threading.main_thread().ident
        self._lock = threading.Lock()  # no nudge once SIGUSR1 is back to its default
        self._saved: list[Any] = []
        self._pipe: tuple[int, int] | None = None
        self._watcher: threading.Thread | None = None

    def __enter__(self) -> SessionSignals:
        if threading.current_thread() is not threading.main_thread():
            return self  # signals reach the main thread only: nothing to handle here
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        self._pipe = (read_fd, write_fd)
        self._saved = [
            signal.signal(signal.SIGINT, self._on_sigint),
            signal.signal(signal.SIGUSR1, _ignore),
            signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False),
        ]
        self._watcher = threading.Thread(
            target=self._watch, args=(read_fd,), name="mlxi-sigint", daemon=True
        )
        self._watcher.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._pipe is None:
            return
        sigint, sigusr1, wakeup = self._saved
        signal.set_wakeup_fd(wakeup)
        with self._lock:
            self._main = None
        os.close(self._pipe[1])  # ends the watcher's read
        try:  # a second Ctrl-C raises here (the watcher sends no nudge any more)
            if self._watcher is not None:
                self._watcher.join(timeout=5)
        finally:
            signal.signal(signal.SIGUSR1, sigusr1)
            signal.signal(signal.SIGINT, sigint)
            self._pipe = None

    def answering(self, events: queue.SimpleQueue[Any]) -> _Answering:
        """While in this context, Ctrl-C puts a stop into ``events`` instead of raising."""
        return _Answering(self, events)

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self._handled += 1
        events = self._events
        if events is not None:
            events.put(STOP)  # SimpleQueue.put may be called from a signal handler
            return
        raise KeyboardInterrupt

    def _watch(self, read_fd: int) -> None:
        try:
            while True:
                data = os.read(read_fd, 64)
                if not data:
                    return
                self._received += data.count(bytes([signal.SIGINT]))
                before = self._handled
                # Two signals close together may run the handler once: one run is enough.
                for _ in range(100):
                    with self._lock:
                        if self._main is None:
                            return
                        if self._handled >= self._received or self._handled != before:
                            break
                        signal.pthread_kill(self._main, signal.SIGUSR1)
                    time.sleep(0.1)
        except OSError:
            return
        finally:
            os.close(read_fd)


class _Answering:
    def __init__(self, signals: SessionSignals, events: queue.SimpleQueue[Any]) -> None:
        self.signals = signals
        self.events = events

    def __enter__(self) -> None:
        self.signals._events = self.events

    def __exit__(self, *exc: object) -> None:
        self.signals._events = None


def _ignore(signum: int, frame: FrameType | None) -> None:
    """SIGUSR1: only there to end a blocking read so that a pending SIGINT is handled."""
