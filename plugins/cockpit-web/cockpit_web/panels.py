"""The plotly figure of each panel of the web view.

The web view shows every scalar series of every logged quantity, each in the panel
:func:`~cockpit_web.panel.assign` picks (:mod:`cockpit_web.panel`: the
dashboard's topics for the first-party quantities, a generic panel for every other one),
and beyond them (see :mod:`cockpit_web.extra_panels`) per-parameter lines, the
gradient histogram over time and the sharpness panel's stability threshold. Runs are
overlaid: one colour per run, one dash style per series.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from cockpit_web import extra_panels
from cockpit_web.panel import PANELS, TOPICS, WebPanel, assign, thin

TOP_MARGIN = 56
"""Pixels above a chart's plot area: plotly's mode bar (at most about 30 px high, shown at
the top while the pointer is over the chart), then the panel's title, left-aligned just
above the plot area, so that the two never overlap."""
_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def _place(panel: WebPanel) -> tuple[int, float, str]:
    """Sort key: the topic, then the order of :data:`~cockpit_web.panel.PANELS`.

    A panel not in it comes right after ``panel.after``.
    """
    position = {p.id: i for i, p in enumerate(PANELS)}
    at = position.get(panel.id, position.get(panel.after, len(PANELS)) + 0.5)
    order = TOPICS.index(panel.topic) if panel.topic in TOPICS else len(TOPICS)
    return order, at, panel.id


def figures(runs: Sequence[Any], max_points: int = 2000) -> list[dict[str, Any]]:
    """The panels of ``runs`` with their plotly figures, ordered by topic.

    Args:
        runs: Followers (``label``, ``names`` and ``series`` as in
            :class:`~cockpit_web.follow.LogFollower`), overlaid in this order.
        max_points: Points per series at most (evenly thinned beyond).

    Returns:
        ``[{"id", "title", "topic", "points", "quantities", "figure": {"data", "layout"}}]``
        (``quantities``: the names of the quantities the panel shows), the panels of
        :mod:`cockpit_web.extra_panels` included (from each run's ``arrays``).

    """
    import plotly.graph_objects as go
    from plotly.colors import qualitative

    panels: dict[str, WebPanel] = {}
    traces: dict[str, list[dict[str, Any]]] = {}
    counts: dict[str, int] = {}
    colors = qualitative.Plotly
    for index, run in enumerate(runs):
        dashes: dict[str, int] = {}
        for tag in sorted(run.series):
            panel = assign(tag, run.names)
            if panel is None or not run.series[tag]:
                continue
            panels.setdefault(panel.id, panel)
            dash = dashes.setdefault(panel.id, 0)
            dashes[panel.id] += 1
            points = thin(sorted(run.series[tag].items()), max_points)
            counts[panel.id] = counts.get(panel.id, 0) + len(run.series[tag])
            traces.setdefault(panel.id, []).append(
                {
                    "type": "scatter",
                    "mode": "lines+markers" if len(points) < 50 else "lines",
                    "name": tag if len(runs) == 1 else f"{run.label}: {tag}",
                    "legendgroup": run.label,
                    "x": [s for s, _ in points],
                    "y": [v for _, v in points],
                    "line": {
                        "color": colors[index % len(colors)],
                        "dash": _DASHES[dash % len(_DASHES)],
                    },
                }
            )
    for panel_id, added in extra_panels.threshold_traces(runs, traces, max_points).items():
        counts[panel_id] += added
        if extra_panels.spans_decades(traces[panel_id]):
            panels[panel_id] = replace(panels[panel_id], log_y=True)
    extra_panels.totals_only(runs, panels)
    more = extra_panels.per_param_panels(runs, max_points) + extra_panels.histogram_panels(runs)
    for panel, data, count in more:
        panels[panel.id], traces[panel.id], counts[panel.id] = panel, data, count
    result = []
    for panel in sorted(panels.values(), key=_place):
        layout = go.Layout(  # checked by plotly; the traces are plain scatter dicts
            {
                "title": {  # below the mode bar's band, see TOP_MARGIN
                    "text": panel.title,
                    "font": {"size": 14},
                    "x": 0,
                    "xref": "paper",
                    "xanchor": "left",
                    "y": 1,
                    "yref": "paper",
                    "yanchor": "bottom",
                    "pad": {"b": 8},
                },
                "xaxis": {"title": {"text": "step"}},
                "yaxis": {
                    "type": "log" if panel.log_y else "linear",
                    **({"title": {"text": panel.y_title}} if panel.y_title else {}),
                },
                "height": 320,
                "margin": {"l": 55, "r": 15, "t": TOP_MARGIN, "b": 40},
                "legend": {"orientation": "h", "y": -0.25},
                "uirevision": panel.id,  # keep the user's zoom across updates
            }
        )
        result.append(
            {
                "id": panel.id,
                "title": panel.title,
                "topic": panel.topic,
                "points": counts[panel.id],
                "quantities": sorted(panel.members),
                "figure": {"data": traces[panel.id], "layout": layout.to_plotly_json()},
            }
        )
    return result
