"""The web view: the instruments of one or more runs in a browser, live or as one file.

``cockpit serve RUN...`` (:func:`serve`) shows the runs' logs as plotly charts and updates
them while the logs grow; ``cockpit plot RUN... -o dash.html`` (:func:`write_page`) writes
the same page as one self-contained file. Both only read the logs. Modules: ``follow``
(one log read incrementally, in bounded memory), ``reduce`` (a scalar series in at most N
points), ``arrays`` (its arrays drawn per entry, per-parameter values, histograms and
thresholds, bounded), ``panel`` (the panels, from the charts of the registered
instruments, and which series goes into which), ``panels`` (the panels' plotly figures),
``extra_panels`` (lines per module or parameter, error bars, histogram heat maps,
thresholds), ``feed`` (several runs and the page's data), ``findings`` (the diagnoses'
findings: a list above the panels, shaded steps on them), ``page`` (the HTML), ``server``
(HTTP), ``render`` (the ``.html`` renderer), ``command`` (``cockpit serve``) and ``plugin``
(the hooks that register both). See ``docs/dashboard.md`` (Web view) and
``docs/diagnoses.md``.
"""

from __future__ import annotations

from cockpit_web.feed import Feed, RunNotFoundError, find_logs
from cockpit_web.follow import LogFollower
from cockpit_web.page import render_page, write_page
from cockpit_web.panel import Layout, WebPanel, assign, default_layout
from cockpit_web.panels import figures
from cockpit_web.server import WebServer, make_server, serve

__all__ = [
    "Feed",
    "Layout",
    "LogFollower",
    "RunNotFoundError",
    "WebPanel",
    "WebServer",
    "assign",
    "default_layout",
    "figures",
    "find_logs",
    "make_server",
    "render_page",
    "serve",
    "write_page",
]
