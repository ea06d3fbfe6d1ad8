"""The panel kit: what a plugin needs to contribute a dashboard panel, without matplotlib.

A panel is an :class:`~cockpit_core.instrument.Instrument` registered through the
``register_instruments`` hook; its :class:`~cockpit_core.instrument.Chart` (with
:class:`~cockpit_core.instrument.Line`, :class:`~cockpit_core.instrument.Each` and
:class:`~cockpit_core.instrument.Threshold`) says what a view that does not draw with
matplotlib (the web view) shows. :mod:`~cockpit_core.panel.data` turns a run's values into
series (``values``, ``series``, ``last``, ``smooth``, ...); :mod:`~cockpit_core.panel.style`
holds the colours and small drawing helpers every panel shares; and
:mod:`~cockpit_core.panel.planning` says which panels a run's dashboard shows and skips. A
dashboard plugin (cockpit-dashboard) lays the panels out and draws them; nothing here imports
a plotting library. See ``docs/dashboard.md``.
"""

from __future__ import annotations

from cockpit_core.instrument import TOPICS, Chart, Draw, Each, Instrument, Line, Output, Threshold
from cockpit_core.panel import data, style
from cockpit_core.panel.data import (
    ema,
    last,
    metric_series,
    param_names,
    per_param_series,
    scalar,
    series,
    short_names,
    smooth,
    values,
)

__all__ = [
    "TOPICS",
    "Chart",
    "Draw",
    "Each",
    "Instrument",
    "Line",
    "Output",
    "Threshold",
    "data",
    "ema",
    "last",
    "metric_series",
    "param_names",
    "per_param_series",
    "scalar",
    "series",
    "short_names",
    "smooth",
    "style",
    "values",
]
