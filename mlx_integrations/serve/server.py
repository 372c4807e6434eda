"""Running the app: uvicorn in the foreground (``mlxi serve``) or in a background thread.

On SIGTERM the server stops taking connections and new requests (503 with
Retry-After) and lets the replies in flight finish for up to ``shutdown_timeout_s``;
on Ctrl-C it does not wait. The replies still running then end: a stream with its
API's closing event (``[DONE]`` after an error event, Anthropic's ``error`` event,
``response.failed``), an answer not begun with 503, and each one's engine request is
aborted. Then the engines stop (their owner threads end) and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from mlx_integrations.engine.base import BaseEngine
from mlx_integrations.serve.config import (
    ServeConfig,
    apply_memory_budget,
    restore_memory_budget,
)
from mlx_integrations.serve.state import ServerState

logger = logging.getLogger(__name__)

__all__ = ["BackgroundServer", "security_warnings", "serve"]


def security_warnings(config: ServeConfig) -> list[str]:
    """What a person starting this server should know before others can reach it."""
    exposed = config.host not in ("127.0.0.1", "localhost", "::1")
    warnings = []
    if exposed and not config.api_key:
        warnings.append(
            f"mlxi serve listens on {config.host}:{config.port} WITHOUT an API key: anyone "
            "who can reach this machine can use its models. Set --api-key (or MLXI_API_KEY), "
            "or bind 127.0.0.1."
        )
    if exposed and config.allow_private_media_urls:
        warnings.append(
            "--allow-private-media-urls lets requests make this server fetch from its own "
            "network (loopback, private addresses)."
        )
    return warnings


# uvicorn's own limit, after ours: what it cancels then has had its chance to end.
_BACKSTOP_S = 10


def _uvicorn_server(app: Any, config: ServeConfig, log_level: str, **extra: Any) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server that marks the app draining as soon as shutdown begins,
        and ends the replies still running once the grace is over (at once on Ctrl-C)."""

        ready = threading.Event()
        interrupted = False
        """Stopped by Ctrl-C (SIGINT): replies in flight end without waiting."""
        ended = 0
        """Replies that were still running when they were ended."""

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            self.ready.set()

        def handle_exit(self, sig: int, frame: Any) -> None:
            if sig == signal.SIGINT:
                self.interrupted = True
            super().handle_exit(sig, frame)

        def stop_line(self) -> str:
            """What stopped the server and what became of the replies in flight."""
            how = "Ctrl-C" if self.interrupted else "SIGTERM"
            if not self.ended:
                return f"stopped ({how})"
            replies = "reply" if self.ended == 1 else "replies"
            after = "" if self.interrupted else f" after {config.shutdown_timeout_s:g} s"
            return f"stopped ({how}); {self.ended} {replies} still running{after} ended"

        def end_replies(self) -> None:
            state: ServerState = app.state.server
            self.ended = state.metrics.in_flight
            state.stopping.set()

        async def shutdown(self, sockets: Any = None) -> None:
            app.state.server.draining = True
            grace = 0.0 if self.interrupted else config.shutdown_timeout_s
            timer = asyncio.get_running_loop().call_later(grace, self.end_replies)
            try:
                await super().shutdown(sockets=sockets)
            finally:
                timer.cancel()

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # serve() hands SIGTERM and Ctrl-C to handle_exit itself (_Signals), from
            # before the models load to the end, so none is lost between the two; and
            # none is raised again once stopped (uvicorn's way), which would end the
            # process before the models are let go: a graceful stop exits 0.
            yield

    settings = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=log_level,
        lifespan="off",  # the models are loaded before, and let go after
        timeout_graceful_shutdown=math.ceil(config.shutdown_timeout_s) + _BACKSTOP_S,
        timeout_keep_alive=5,
        **extra,
    )
    server = Server(settings)
    server.ready = threading.Event()
    return server


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``.

    Raises:
        OSError: The address is taken or cannot be bound, with what to do.
    """
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise OSError(
            f"cannot bind {host!r}: {exc.strerror}; give an IP address or a name of this machine"
        ) from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise OSError(
            f"cannot listen on {host}:{port} ({exc.strerror}); is another server running "
            "there? Pick another port with --port"
        ) from None
    sock.set_inheritable(True)
    return sock


async def serve(
    config: ServeConfig,
    *,
    log_level: str = "info",
    announce: Callable[[str], None] | None = None,
    stopped: Callable[[str], None] | None = None,
    loading: Callable[[list[str]], None] | None = None,
) -> None:
    """Bind the address, load the preloaded models, then serve until SIGTERM or Ctrl-C.

    SIGTERM or Ctrl-C while the models load stops there: what was loaded is let go and
    the server returns, as after serving.

    Args:
        config: The settings.
        log_level: uvicorn's log level.
        loading: Called with the names of the models to preload before they load (once
            SIGTERM and Ctrl-C stop the loading).
        announce: Called with the base URL once the models are loaded and the socket
            listens (``--port 0`` picks a free port: this says which).
        stopped: Called with one line once the server has stopped and let go of its
            models: the signal, and the replies it ended (``stopped (Ctrl-C); 1 reply
            still running ended``).

    Raises:
        OSError: The address is taken (before any model loads).
        APIError: A model named to preload is missing (404) or of the wrong kind.
    """
    from mlx_integrations.engine import pool
    from mlx_integrations.engine.distributed.ranks import launched_ranks
    from mlx_integrations.serve.app import create_app

    ranks = launched_ranks()
    if ranks > 1:  # rank 0 of `mlxi launch`: the model is sharded over the ranks
        config = config.for_ranks(ranks)
    sock = bind(config.host, config.port)
    budget = apply_memory_budget(config)
    state = ServerState(config)
    server = None
    signals = _Signals()
    try:
        with signals:  # to the end: the load, then the server's handle_exit
            names = [m.name for m in config.models if m.preload]
            if loading is not None and names:
                loading(names)
            await signals.run(state.registry.preload())
            if signals.stopped_by is None:
                if announce is not None:
                    host, port = sock.getsockname()[:2]
                    host = f"[{host}]" if ":" in host else host
                    announce(f"http://{host}:{port}")
                app = create_app(state=state, preload=False)
                server = signals.server = _uvicorn_server(app, config, log_level)
                await server.serve(sockets=[sock])
    finally:
        sock.close()
        state.registry.close()
        await pool.ashutdown()  # each engine's owner thread ends before the interpreter
        restore_memory_budget(budget)
    if stopped is not None:
        stopped(server.stop_line() if server is not None else signals.line())


class _Signals:
    """SIGTERM and Ctrl-C for ``serve``: while it starts (its models load) they cancel
    the step under way (a model on its way in ends its load on its own thread, and the
    shutdown lets it go) and are remembered; once the uvicorn ``server`` exists they go
    to its ``handle_exit``. The process's own handlers are back after."""

    def __init__(self) -> None:
        self.stopped_by: str | None = None
        self.loaded = False
        self.server: Any = None
        self._task: asyncio.Future[Any] | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(sig)
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self._stop, sig)  # the main thread's loop
                self._previous[sig] = previous
        return self

    def __exit__(self, *exc: object) -> None:
        loop = asyncio.get_running_loop()
        for sig, previous in self._previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, previous)  # asyncio.run's own Ctrl-C handler, say

    def _stop(self, sig: int) -> None:
        if self.server is not None:
            self.server.handle_exit(sig, None)
            return
        self.stopped_by = self.stopped_by or ("Ctrl-C" if sig == signal.SIGINT else "SIGTERM")
        if self._task is not None:
            self._task.cancel()

    async def run(self, work: Any) -> None:
        """Await ``work`` unless a signal stops it (then return)."""
        self._task = asyncio.ensure_future(work)
        try:
            await self._task
            self.loaded = True
        except asyncio.CancelledError:
            if self.stopped_by is None:
                raise
        finally:
            self._task = None

    def line(self) -> str:
        """What stopped the start, and when."""
        return f"stopped ({self.stopped_by}) " + (
            "before serving" if self.loaded else "while loading"
        )


class BackgroundServer:
    """A server on a free port of 127.0.0.1, in a thread of this process.

    For notebooks, tests and programs that hold their own engines: ``url`` is ready
    when ``start()`` returns (the models are loaded and the socket accepts).

    Args:
        config: The settings (``host``/``port`` are replaced by 127.0.0.1 and a free port).
        engines: Engines to serve under the given names.

    Examples:
        >>> from mlx_integrations.serve import BackgroundServer, ServeConfig
        >>> with BackgroundServer(ServeConfig()) as url:  # doctest: +SKIP
        ...     print(url)  # http://127.0.0.1:54321
    """

    def __init__(
        self,
        config: ServeConfig | None = None,
        *,
        engines: dict[str, BaseEngine] | None = None,
        log_level: str = "warning",
    ):
        from mlx_integrations.serve.app import create_app

        config = config or ServeConfig()
        self._socket = bind("127.0.0.1", 0)
        port = self._socket.getsockname()[1]
        self.config = ServeConfig(**{**config.__dict__, "host": "127.0.0.1", "port": port})
        self.state = ServerState(self.config, engines=engines)
        self.app = create_app(state=self.state, preload=False)
        self.url = f"http://127.0.0.1:{port}"
        self._server = _uvicorn_server(self.app, self.config, log_level)
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._budget: tuple[bool, int | None] = (False, None)

    def start(self, timeout: float = 120.0) -> str:
        """Load the preloaded models, start serving; return the base URL.

        Raises:
            RuntimeError: The server did not start (its error is chained).
        """
        self._budget = apply_memory_budget(self.config)
        self._thread = threading.Thread(target=self._run, name="mlxi-serve", daemon=True)
        self._thread.start()
        ready = self._server.ready
        while not ready.wait(0.05):
            if not self._thread.is_alive() or self._failure is not None:
                restore_memory_budget(self._budget)  # nothing runs under it
                self._budget = (False, None)
                raise RuntimeError("the server did not start") from self._failure
            timeout -= 0.05
            if timeout <= 0:
                raise RuntimeError("the server did not start in time")
        return self.url

    def _run(self) -> None:
        async def main() -> None:
            await self.state.registry.preload()
            await self._server.serve(sockets=[self._socket])

        try:
            asyncio.run(main())
        except BaseException as exc:
            self._failure = exc
            logger.error("The background server failed", exc_info=True)

    def begin_shutdown(self) -> None:
        """What SIGTERM does: stop accepting, let replies in flight finish."""
        self._server.should_exit = True

    def stop(self, timeout: float = 60.0) -> None:
        """Shut down (replies in flight finish first) and let go of the models; the
        process's memory budget is put back as it was before :meth:`start`."""
        self.begin_shutdown()
        if self._thread is not None:
            self._thread.join(timeout)
        self.state.registry.close()
        self._socket.close()
        restore_memory_budget(self._budget)
        self._budget = (False, None)

    @property
    def stopped(self) -> bool:
        """The server's thread has ended."""
        return self._thread is not None and not self._thread.is_alive()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def background_server(
    config: ServeConfig | None = None, *, engines: dict[str, BaseEngine] | None = None
) -> Iterator[BackgroundServer]:
    """A started :class:`BackgroundServer`, stopped at the end of the block."""
    server = BackgroundServer(config, engines=engines)
    server.start()
    try:
        yield server
    finally:
        server.stop()
