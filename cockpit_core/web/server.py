"""``cockpit serve``: an HTTP server for the web view, from the standard library.

Routes: ``/`` the page (:func:`~cockpit_core.web.page.render_page` with polling),
``/data.json`` the current :meth:`Feed.payload` (the page polls it), ``/plotly.min.js``
plotly.js (cached by the browser). Each request reads only what the logs appended since
the previous one, so the server never blocks or slows the training that writes them. It
has no authentication: it listens on ``127.0.0.1`` unless told otherwise; reach a remote
machine through an SSH tunnel (``ssh -L 8050:localhost:8050 host``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from cockpit_core.web.feed import Feed
from cockpit_core.web.page import DATA_JSON, PLOTLY_JS, payload_json, plotly_js, render_page

DEFAULT_PORT = 8050


class WebServer(ThreadingHTTPServer):
    """A threading HTTP server holding the :class:`Feed` it shows.

    Args:
        feed: The runs.
        address: ``(host, port)``; port ``0`` picks a free one (see :attr:`url`).
        poll_seconds: How often the page asks for new data.

    """

    daemon_threads = True

    def __init__(self, feed: Feed, address: tuple[str, int], poll_seconds: float = 2.0):
        self.feed = feed
        self.poll_seconds = poll_seconds
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        """The page's address."""
        host, port = self.server_address[:2]
        shown = "localhost" if host in ("0.0.0.0", "::", "127.0.0.1") else host
        return f"http://{shown}:{port}/"


@functools.lru_cache(maxsize=1)
def _plotly_bytes() -> bytes:
    return plotly_js().encode("utf-8")


class _Handler(BaseHTTPRequestHandler):
    server: WebServer

    def do_GET(self) -> None:  # noqa: D102 - the http.server protocol
        route = urlsplit(self.path).path
        if route in ("/", "/index.html"):
            page = render_page(self.server.feed.payload(), self.server.poll_seconds, False)
            self._send(page.encode("utf-8"), "text/html; charset=utf-8")
        elif route == "/" + DATA_JSON:
            self._send(payload_json(self.server.feed.payload()), "application/json")
        elif route == "/" + PLOTLY_JS:
            self._send(_plotly_bytes(), "text/javascript; charset=utf-8", cache=True)
        else:
            self.send_error(404, "the cockpit web view has /, /data.json and /plotly.min.js")

    def _send(self, body: bytes, content_type: str, cache: bool = False) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "max-age=86400" if cache else "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: no line per request."""


def make_server(
    paths: Sequence[str | os.PathLike],
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    poll_seconds: float = 2.0,
    title: str | None = None,
    diagnose: bool = True,
) -> WebServer:
    """A :class:`WebServer` for the runs at ``paths``, bound but not yet serving.

    With ``diagnose`` the installed diagnoses run over each log, again when it grew (at
    most a tenth of the time, see :class:`~cockpit_core.web.feed.Feed`); with ``False``
    the page shows only the findings the logs recorded while training.
    """
    return WebServer(Feed(paths, title=title, diagnose=diagnose), (host, port), poll_seconds)


def serve(
    paths: Sequence[str | os.PathLike],
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    poll_seconds: float = 2.0,
    title: str | None = None,
    announce: Callable[[str], Any] = print,
    diagnose: bool = True,
) -> None:
    """Serve the web view of the runs at ``paths`` until interrupted (Ctrl-C).

    ``diagnose``: run the installed diagnoses over each log when it grew (see
    :func:`make_server`).
    """
    with make_server(paths, host, port, poll_seconds, title, diagnose) as server:
        announce(f"Serving the cockpit web view of {len(server.feed.runs)} run(s) at {server.url}")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            announce("Stopped.")
