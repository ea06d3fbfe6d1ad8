"""The dashboard: lays out the instruments (panels) that installed plugins register.

Plugins contribute panels through the ``register_instruments`` hook with
:class:`Instrument`; :func:`render` groups them by topic, skips what was not tracked and
says so, and writes PNG, SVG or PDF headless. ``Cockpit.plot(path)`` and
``cockpit plot LOG -o dashboard.png`` call it; :class:`LivePlot` refreshes a picture while
training runs. Given a list of runs, :func:`render` compares them in one dashboard, a
colour per run (:mod:`cockpit_core.dashboard.compare`). See ``docs/dashboard.md``.

Importing this package does not import matplotlib (it is imported when rendering), so
plugins can import :class:`Instrument` and the helpers at discovery time.
"""

from __future__ import annotations

from typing import Any

from cockpit_core.dashboard import data, style
from cockpit_core.dashboard.data import (
    ema,
    last,
    metric_series,
    param_names,
    per_param_series,
    scalar,
    series,
    smooth,
    values,
)
from cockpit_core.dashboard.live import LivePlot
from cockpit_core.instrument import TOPICS, Draw, Instrument, Output

__all__ = [
    "TOPICS",
    "Draw",
    "Instrument",
    "LivePlot",
    "Output",
    "data",
    "ema",
    "last",
    "metric_series",
    "param_names",
    "per_param_series",
    "plan",
    "plot",
    "render",
    "scalar",
    "series",
    "smooth",
    "style",
    "values",
]


def render(source: Any, path: Any = None, **options: Any) -> Any:
    """Render a dashboard (a list of runs: compared); see :func:`.layout.render`."""
    from cockpit_core.dashboard.layout import render as _render

    return _render(source, path, **options)


def plot(source: Any, path: Any = None, **options: Any) -> Any:
    """Render and save; see :func:`cockpit_core.dashboard.layout.plot`."""
    from cockpit_core.dashboard.layout import plot as _plot

    return _plot(source, path, **options)


def plan(source: Any, instruments: Any = None, registry: Any = None) -> Any:
    """Which panels a dashboard of ``source`` shows and skips (no drawing)."""
    from cockpit_core.dashboard.planning import _default_instruments, load
    from cockpit_core.dashboard.planning import plan as _plan

    insts = instruments if instruments is not None else _default_instruments(source, registry)
    return _plan(load(source), insts)
