"""The web view: the instruments of one or more runs in a browser, live or as one file.

``cockpit serve RUN...`` (:func:`serve`) shows the runs' logs as plotly charts and updates
them while the logs grow; ``cockpit plot RUN... -o dash.html`` (:func:`write_page`) writes
the same page as one self-contained file. Both only read the logs. Modules: ``follow``
(one log read incrementally, in bounded memory), ``reduce`` (a scalar series in at most N
points), ``arrays`` (its per-parameter values, histograms and stability thresholds,
bounded), ``panel`` (which series goes into which panel), ``panels`` (the panels' plotly
figures), ``extra_panels`` (per-parameter lines, the gradient histogram heat map, the
threshold), ``feed`` (several runs and the page's data), ``findings`` (the diagnoses'
findings: a list above the panels, shaded steps on them), ``page`` (the HTML), ``server``
(HTTP), ``render`` (the ``.html`` renderer), ``command`` (``cockpit serve``) and ``plugin``
(the hooks that register both). See ``docs/dashboard.md`` (Web view) and
``docs/diagnoses.md``.
"""

from __future__ import annotations

from cockpit_web.feed import Feed, RunNotFoundError, find_logs
from cockpit_web.follow import LogFollower
from cockpit_web.page import render_page, write_page
from cockpit_web.panel import PANELS, TOPICS, WebPanel, assign
from cockpit_web.panels import figures
from cockpit_web.server import WebServer, make_server, serve

__all__ = [
    "PANELS",
    "TOPICS",
    "Feed",
    "LogFollower",
    "RunNotFoundError",
    "WebPanel",
    "WebServer",
    "assign",
    "figures",
    "find_logs",
    "make_server",
    "render_page",
    "serve",
    "write_page",
]
