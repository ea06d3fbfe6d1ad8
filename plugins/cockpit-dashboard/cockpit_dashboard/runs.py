"""One run of a comparison: its data, label, colour and panels.

:mod:`cockpit_dashboard.compare` makes the runs; :mod:`cockpit_dashboard.overlay`
draws their panels on shared axes, in each run's colour.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cockpit_core.log import LogData
from cockpit_core.panel.planning import Panel

PanelKey = tuple[str, str]
"""``(instrument name, panel title)``: the same panel in different runs."""


@dataclass
class Run:
    """One run of a comparison: its data, label, colour and panels by :data:`PanelKey`."""

    data: LogData
    label: str
    color: str
    panels: dict[PanelKey, Panel] = field(default_factory=dict)
