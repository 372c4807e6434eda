"""Files served over HTTP on 127.0.0.1, and a URL map that sends chosen URLs there.

Tests that hand models ``http(s)://`` image URLs stay offline: the files come from a
loopback server. :func:`route_urls` makes both ``httpx.get`` (used by langchain-tests
to fetch its fixtures) and every ``urllib`` opener (the engines' media loader uses one)
answer chosen public URLs from that server, as a hosts file would.
"""

from __future__ import annotations

import socket
import threading
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FileServer:
    """Serve ``files`` (URL path -> bytes) at ``http://127.0.0.1:<port>/<path>``.

    Every request is counted in ``hits`` by path, so a test can tell that a file was
    really fetched.
    """

    def __init__(self, files: Mapping[str, bytes], content_type: str = "image/png") -> None:
        self.files = {path.lstrip("/"): data for path, data in files.items()}
        self.content_type = content_type
        self.hits: dict[str, int] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?")[0].lstrip("/")
                server.hits[path] = server.hits.get(path, 0) + 1
                data = server.files.get(path)
                if data is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", server.content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._httpd.server_port}/{path.lstrip('/')}"

    def __enter__(self) -> FileServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


class SlowHeadersServer:
    """An HTTP server on 127.0.0.1 that sends its status line and headers one byte every
    ``delay`` seconds (``headers`` padding headers in all), then ``body``.

    Each read a client makes gets a byte well within any per-read timeout, so only a
    limit on the whole download ends it early. It stops sending once the client hangs up.
    """

    def __init__(self, body: bytes = b"abcd", headers: int = 40, delay: float = 0.05) -> None:
        pad = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 8) for i in range(headers))
        self.head = b"HTTP/1.0 200 OK\r\n" + pad + b"Content-Length: %d\r\n\r\n" % len(body)
        self.body = body
        self.delay = delay
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}/{path.lstrip('/')}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                for byte in self.head:
                    if self._stop.wait(self.delay):
                        return
                    conn.sendall(bytes([byte]))
                conn.sendall(self.body)
            except OSError:  # the client hung up
                pass

    def __enter__(self) -> SlowHeadersServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()


@contextmanager
def route_urls(monkeypatch: Any, routes: Mapping[str, str]) -> Iterator[None]:
    """While active, fetching a URL in ``routes`` (by ``httpx.get`` or any ``urllib``
    opener) fetches its loopback target instead; other URLs are fetched as usual."""
    import httpx

    real_get = httpx.get
    real_open = urllib.request.OpenerDirector.open

    def get(url: Any, *args: Any, **kwargs: Any) -> Any:
        return real_get(routes.get(str(url), url), *args, **kwargs)

    def open_routed(self: Any, fullurl: Any, *args: Any, **kwargs: Any) -> Any:
        url = fullurl.full_url if isinstance(fullurl, urllib.request.Request) else fullurl
        target = routes.get(str(url))
        if target is not None:
            headers = dict(fullurl.header_items()) if not isinstance(fullurl, str) else {}
            fullurl = urllib.request.Request(target, headers=headers)
        return real_open(self, fullurl, *args, **kwargs)

    monkeypatch.setattr(httpx, "get", get)
    monkeypatch.setattr(urllib.request.OpenerDirector, "open", open_routed)
    yield
