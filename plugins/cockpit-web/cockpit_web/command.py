"""``cockpit serve RUN...``: the web view of runs in a browser, updated while they train.

Registered by :mod:`cockpit_web.plugin` through ``register_commands``; :func:`configure`
adds the arguments, :func:`run` serves until interrupted (:func:`cockpit_web.server.serve`).
"""

from __future__ import annotations

import argparse
import math

from cockpit_web.server import serve

HELP = "serve a web view of runs that updates while they train"
"""The command's line in ``cockpit --help``."""

DESCRIPTION = (
    "Serve a page that shows the instruments of one or more runs as plotly charts (runs "
    "overlaid) and updates them while the logs grow. It only reads the logs, so training is "
    "not slowed down. RUN is a log (.jsonl, which may not exist yet, or .json) or a run folder "
    "holding one. Stop with Ctrl-C. See docs/dashboard.md."
)
"""What ``cockpit serve --help`` says the command does."""


def _port(text: str) -> int:
    """``type`` of ``--port``: 0 (pick a free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 (pick a free one) to 65535, got {value}")
    return value


def _poll_seconds(text: str) -> float:
    """``type`` of ``--poll``: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (math.isfinite(value) and 0 < value <= 86400):
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds above 0 (at most 86400), got {text!r}"
        )
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``cockpit serve`` to ``parser``."""
    parser.description = DESCRIPTION
    parser.add_argument("runs", nargs="+", metavar="RUN", help="logs or run folders")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface: the "
        "view has no login, prefer an SSH tunnel)",
    )
    parser.add_argument("--port", type=_port, default=8050, help="port (default 8050; 0 picks one)")
    parser.add_argument(
        "--poll",
        type=_poll_seconds,
        default=2.0,
        help="seconds between the page's updates (default 2)",
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        dest="allow_host",
        help="also answer requests whose Host header names NAME (repeatable); by default "
        "only localhost, 127.0.0.1, ::1 and --host are answered, others get 403",
    )
    parser.add_argument("--title", default=None, help="page title (default: the runs' names)")
    parser.add_argument(
        "--diagnose",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the installed diagnoses over each log whenever it grew (default); with "
        "--no-diagnose only the findings recorded while training are shown",
    )


def run(args: argparse.Namespace) -> int:
    """Serve the web view of ``args.runs`` until interrupted; the exit code (0).

    Raises:
        RunNotFoundError: A run is neither a log nor a run folder (the command line prints
            it, exit code 1).

    """
    serve(
        args.runs,
        host=args.host,
        port=args.port,
        poll_seconds=args.poll,
        title=args.title,
        diagnose=args.diagnose,
        allowed_hosts=args.allow_host,
    )
    return 0
