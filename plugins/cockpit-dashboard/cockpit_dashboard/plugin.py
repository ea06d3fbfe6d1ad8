"""Entry point of cockpit-dashboard: renderers of ``.png``, ``.svg``, ``.pdf``; ``live_plot``."""

from __future__ import annotations

import inspect
import os
from typing import Any

from cockpit_core import hookimpl
from cockpit_core.hookspecs import LIVE_PLOT_SINK, RegisterRenderer, RegisterSink
from cockpit_dashboard import layout
from cockpit_dashboard.live import LivePlotConfig, live_plot_sink

COCKPIT_PROTOCOL_VERSION = 1

OPTIONS = frozenset(inspect.signature(layout.render).parameters) - {"source", "path"}
"""Options of :func:`~cockpit_dashboard.layout.render`; a renderer ignores any others."""


def render(source: Any, path: str | os.PathLike[str] | None = None, **options: Any) -> Any:
    """The renderer: draw the dashboard of ``source`` (a list of runs: compared) into ``path``.

    Args:
        source: A :class:`~cockpit_core.Cockpit`, a log path, or a list of them.
        path: Output file; its suffix picks the format (``.png``, ``.svg``, ``.pdf``).
        **options: Options of :func:`~cockpit_dashboard.layout.render` (``title``, ``rows``,
            ``dpi``, ``labels``, ``diagnose``, ...); others are ignored, as the renderer
            protocol asks (``cockpit plot`` passes every renderer the same options).

    Returns:
        ``path`` as a :class:`~pathlib.Path` when given, else the matplotlib ``Figure``.

    """
    return layout.plot(source, path, **{k: v for k, v in options.items() if k in OPTIONS})


@hookimpl
def register_renderers(register: RegisterRenderer) -> None:
    """Register the dashboard for ``.png``, ``.svg`` and ``.pdf`` (``cockpit plot -o``)."""
    for suffix in layout.FORMATS:
        register(
            f".{suffix}",
            render,
            description=f"The dashboard of the run's panels as a {suffix.upper()} (matplotlib).",
        )


@hookimpl
def register_sinks(register: RegisterSink) -> None:
    """Register the ``live_plot`` sink (``Cockpit(live_plot=PATH, live_every=N)``)."""
    register(
        LIVE_PLOT_SINK,
        live_plot_sink,
        config=LivePlotConfig,
        description="A dashboard picture refreshed every N steps while training runs.",
    )
