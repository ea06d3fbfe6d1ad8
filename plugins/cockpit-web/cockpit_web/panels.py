"""The plotly figure of each panel of the web view.

The web view shows the panels of the registered instruments' charts and a generic panel
per quantity no chart names (:mod:`cockpit_web.panel`), and beyond them (see
:mod:`cockpit_web.extra_panels`) the lines per entry of arrays, per-parameter lines, the
histograms over time and the charts' thresholds. Runs are overlaid: one colour per run,
one dash style per series.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cockpit_web import extra_panels
from cockpit_web.panel import Layout, WebPanel, default_layout, thin

TOP_MARGIN = 56
"""Pixels above a chart's plot area: plotly's mode bar (at most about 30 px high, shown at
the top while the pointer is over the chart), then the panel's title, left-aligned just
above the plot area, so that the two never overlap."""
_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def figures(
    runs: Sequence[Any], max_points: int = 2000, layout: Layout | None = None
) -> list[dict[str, Any]]:
    """The panels of ``runs`` with their plotly figures, ordered by topic.

    Args:
        runs: Followers (``label``, ``names`` and ``series`` as in
            :class:`~cockpit_web.follow.LogFollower`), overlaid in this order.
        max_points: Points per series at most (evenly thinned beyond).
        layout: The panels (default: :func:`~cockpit_web.panel.default_layout`).

    Returns:
        ``[{"id", "title", "topic", "points", "quantities", "figure": {"data", "layout"}}]``
        (``quantities``: the names of the quantities the panel shows), the panels of
        :mod:`cockpit_web.extra_panels` included (from each run's ``arrays``).

    """
    import plotly.graph_objects as go
    from plotly.colors import qualitative

    layout = layout if layout is not None else default_layout()
    built = extra_panels.Panels()
    colors = qualitative.Plotly
    for index, run in enumerate(runs):
        dashes: dict[str, int] = {}
        for tag in sorted(run.series):
            if not run.series[tag]:
                continue
            for panel, line in layout.assign(tag, run.names):
                dash = dashes.setdefault(panel.id, 0)
                dashes[panel.id] += 1
                points = thin(sorted(run.series[tag].items()), max_points)
                trace = {
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
                if line is not None and line.error:
                    extra_panels.error_bars(trace, run, tag, line)
                built.add(panel, [trace], len(run.series[tag]), index)
    extra_panels.entry_traces(runs, layout, built, max_points)
    extra_panels.threshold_traces(runs, built, max_points)
    extra_panels.totals_only(runs, layout, built)
    extra_panels.per_param_panels(runs, layout, built, max_points)
    extra_panels.histogram_panels(runs, layout, built)
    panels: dict[str, WebPanel] = built.panels
    traces, counts = built.traces, built.counts
    log_y = {i: extra_panels.log_axis(panels[i], traces[i]) for i in panels}
    result = []
    for panel in sorted(panels.values(), key=layout.sort_key):
        axes = go.Layout(  # checked by plotly; the traces are plain scatter dicts
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
                    "type": "log" if log_y[panel.id] else "linear",
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
                "figure": {"data": traces[panel.id], "layout": axes.to_plotly_json()},
            }
        )
    return result
