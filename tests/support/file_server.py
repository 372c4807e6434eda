"""Files served over HTTP on 127.0.0.1, and a URL map that sends chosen URLs there.

Tests that hand models ``http(s)://`` image URLs stay offline: the files come from a
loopback server. :func:`route_urls` makes both ``httpx.get`` (used by langchain-tests
to fetch its fixtures) and ``urllib.request.urlopen`` (used by the engines' media
loader) answer chosen public URLs from that server, as a hosts file would.
"""

from __future__ import annotations

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


class _RoutedHandler(urllib.request.BaseHandler):
    handler_order = 100  # before the HTTP(S) handlers

    def __init__(self, routes: Mapping[str, str]) -> None:
        self.routes = dict(routes)

    def _routed(self, req: urllib.request.Request) -> Any:
        target = self.routes.get(req.full_url)
        if target is None:
            return None  # the next handler opens it as usual
        routed = urllib.request.Request(target, headers=dict(req.header_items()))
        return urllib.request.build_opener().open(routed, timeout=req.timeout)  # type: ignore[attr-defined]

    http_open = _routed
    https_open = _routed


@contextmanager
def route_urls(monkeypatch: Any, routes: Mapping[str, str]) -> Iterator[None]:
    """While active, fetching a URL in ``routes`` (by ``httpx.get`` or ``urllib``)
    fetches its loopback target instead; other URLs are fetched as usual."""
    import httpx

    real_get = httpx.get

    def get(url: Any, *args: Any, **kwargs: Any) -> Any:
        return real_get(routes.get(str(url), url), *args, **kwargs)

    monkeypatch.setattr(httpx, "get", get)
    urllib.request.install_opener(urllib.request.build_opener(_RoutedHandler(routes)))
    try:
        yield
    finally:
        urllib.request.install_opener(None)  # type: ignore[arg-type]
