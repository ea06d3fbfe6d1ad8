"""``cockpit serve``: an HTTP server for the web view, from the standard library.

Routes: ``/`` the page (:func:`~cockpit_web.page.render_page` with polling),
``/data.json`` the current :meth:`Feed.payload` (the page polls it), ``/plotly.min.js``
plotly.js (cached by the browser). Each request reads only what the logs appended since
the previous one, so the server never blocks or slows the training that writes them. It
has no authentication: it listens on ``127.0.0.1`` unless told otherwise; reach a remote
machine through an SSH tunnel (``ssh -L 8050:localhost:8050 host``).

Every request's ``Host`` header must name the server (:data:`LOCAL_HOSTS` or the bound
host, and the bound port); any other is answered with 403, so a web page elsewhere
cannot read the runs through DNS rebinding. ``allowed_hosts`` (``cockpit serve
--allow-host NAME``) adds names, e.g. the machine's name when it listens on ``0.0.0.0``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from cockpit_web.feed import Feed
from cockpit_web.page import DATA_JSON, PLOTLY_JS, payload_json, plotly_js, render_page

DEFAULT_PORT = 8050

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
"""Names a ``Host`` header may always give (with the bound port)."""


def _split_host(value: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``)."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None
        if rest and port is None:
            return None
    else:
        name, colon, port_text = value.partition(":")
        port = port_text if colon else None
    if not name:
        return None
    if port is None:
        return name.rstrip("."), None
    if not port.isdigit() or len(port) > 5:
        return None
    return name.rstrip("."), int(port)


class WebServer(ThreadingHTTPServer):
    """A threading HTTP server holding the :class:`Feed` it shows.

    Args:
        feed: The runs.
        address: ``(host, port)``; port ``0`` picks a free one (see :attr:`url`).
        poll_seconds: How often the page asks for new data.

    """

    daemon_threads = True

    def __init__(
        self,
        feed: Feed,
        address: tuple[str, int],
        poll_seconds: float = 2.0,
        allowed_hosts: Sequence[str] = (),
    ):
        self.feed = feed
        self.poll_seconds = poll_seconds
        super().__init__(address, _Handler)
        bound = str(address[0]).strip("[]").lower()
        names = (*LOCAL_HOSTS, bound, *(str(h).strip().strip("[]").lower() for h in allowed_hosts))
        self.allowed_hosts = frozenset(n.rstrip(".") for n in names if n)

    def host_allowed(self, header: str | None) -> bool:
        """Whether a request's ``Host`` header names this server (see the module)."""
        if header is None:
            return False
        found = _split_host(header)
        if found is None:
            return False
        name, port = found
        bound_port = self.server_address[1]
        return name in self.allowed_hosts and (
            port == bound_port or (port is None and bound_port == 80)
        )

    @property
    def url(self) -> str:
        """The page's address."""
        host, port = self.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else str(host)
        shown = "localhost" if host in ("0.0.0.0", "::", "127.0.0.1") else host
        return f"http://{shown}:{port}/"


@functools.lru_cache(maxsize=1)
def _plotly_bytes() -> bytes:
    return plotly_js().encode("utf-8")


class _Handler(BaseHTTPRequestHandler):
    server: WebServer

    def do_GET(self) -> None:  # noqa: D102 - the http.server protocol
        if not self.server.host_allowed(self.headers.get("Host")):
            self.send_error(
                403,
                "Host not allowed",
                f"the cockpit web view answers only requests for {self._names()}; start it "
                "with --allow-host NAME to reach it under another name",
            )
            return
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

    def _names(self) -> str:
        port = self.server.server_address[1]
        return ", ".join(f"{n}:{port}" for n in sorted(self.server.allowed_hosts))

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
    paths: Sequence[str | os.PathLike[str]],
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    poll_seconds: float = 2.0,
    title: str | None = None,
    diagnose: bool = True,
    allowed_hosts: Sequence[str] = (),
) -> WebServer:
    """A :class:`WebServer` for the runs at ``paths``, bound but not yet serving.

    With ``diagnose`` the installed diagnoses run over each log, again when it grew (at
    most a tenth of the time, see :class:`~cockpit_web.feed.Feed`); with ``False``
    the page shows only the findings the logs recorded while training. ``allowed_hosts``:
    names a request's ``Host`` header may give besides :data:`LOCAL_HOSTS` and ``host``.
    """
    feed = Feed(paths, title=title, diagnose=diagnose)
    return WebServer(feed, (host, port), poll_seconds, allowed_hosts)


def serve(
    paths: Sequence[str | os.PathLike[str]],
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    poll_seconds: float = 2.0,
    title: str | None = None,
    announce: Callable[[str], Any] = print,
    diagnose: bool = True,
    allowed_hosts: Sequence[str] = (),
) -> None:
    """Serve the web view of the runs at ``paths`` until interrupted (Ctrl-C).

    ``diagnose``: run the installed diagnoses over each log when it grew; ``allowed_hosts``:
    more names for the ``Host`` header (see :func:`make_server`).
    """
    with make_server(paths, host, port, poll_seconds, title, diagnose, allowed_hosts) as server:
        announce(f"Serving the cockpit web view of {len(server.feed.runs)} run(s) at {server.url}")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            announce("Stopped.")
