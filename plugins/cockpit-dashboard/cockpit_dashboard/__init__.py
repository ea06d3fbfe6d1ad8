"""The matplotlib dashboard of cockpit: the distribution cockpit-dashboard.

Plugins contribute panels through the ``register_instruments`` hook with
:class:`~cockpit_core.panel.Instrument` (the panel kit, :mod:`cockpit_core.panel`, needs no
matplotlib); :func:`render` lays them out by topic, skips what was not tracked and says so,
and writes PNG, SVG or PDF headless. Given a list of runs, it compares them in one
dashboard, a colour per run (:mod:`cockpit_dashboard.compare`). The plugin
(:mod:`cockpit_dashboard.plugin`) registers it as the renderer of those suffixes, so
``Cockpit.plot(path)`` and ``cockpit plot LOG -o dashboard.png`` draw it, and registers the
sink ``live_plot``: a :class:`LivePlot` refreshing a picture while training runs.
:func:`dashboard_image` gives the picture as an RGB array. See ``docs/dashboard.md``.

Importing this package does not import matplotlib (it is imported when rendering).
"""

from __future__ import annotations

from typing import Any

from cockpit_core.panel.planning import Plan, default_instruments, load
from cockpit_core.panel.planning import plan as _plan
from cockpit_dashboard.image import dashboard_image
from cockpit_dashboard.layout import plot, render
from cockpit_dashboard.live import LivePlot

__all__ = ["LivePlot", "dashboard_image", "plan", "plot", "render"]


def plan(source: Any, instruments: Any = None, registry: Any = None) -> Plan:
    """Which panels a dashboard of ``source`` shows and skips (no drawing).

    Args:
        source: What :func:`render` draws (one run).
        instruments: Plan these instruments instead of the registry's.
        registry: Where the instruments come from (default: the Cockpit's, else every
            installed plugin's).

    """
    insts = instruments if instruments is not None else default_instruments(source, registry)
    return _plan(load(source), insts)
