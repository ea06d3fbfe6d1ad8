"""Which panel of the web view shows a scalar series, and the plotly figure of each panel.

The web view shows every scalar series of every logged quantity, and beyond them (see
:mod:`cockpit_core.web.extra_panels`) per-parameter lines, the gradient histogram over
time and the sharpness panel's stability threshold. Series of the first-party
quantities are laid out like the dashboard's topics (:data:`PANELS`: step size, gradient,
curvature, performance); a fields list keeps a panel to the series worth reading (``alpha``
shows ``alpha/alpha``, not the ``exact`` flag). Every other quantity, a third-party one
included, gets a generic panel of its own (its key as title, topic ``other``) with all its
scalar fields. Runs are overlaid: one colour per run, one dash style per series.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

TOPICS: tuple[str, ...] = ("step size", "gradient", "curvature", "performance", "other")
"""Sections of the page, in order (the dashboard's topics, then everything else)."""

OTHER = "other"
TOP_MARGIN = 56
"""Pixels above a chart's plot area: plotly's mode bar (at most about 30 px high, shown at
the top while the pointer is over the chart), then the panel's title, left-aligned just
above the plot area, so that the two never overlap."""
_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


@dataclass(frozen=True)
class WebPanel:
    """A panel of the web view.

    Args:
        id: Stable identifier (the page's element id).
        title: Shown above the chart.
        topic: Section of the page, one of :data:`TOPICS`.
        members: ``{quantity name: fields shown}``; ``None`` shows every scalar field.
        log_y: Logarithmic y axis.
        after: The id of the panel this one follows (for a panel not in :data:`PANELS`).
        y_title: The y axis' title.

    """

    id: str
    title: str
    topic: str
    members: Mapping[str, tuple[str, ...] | None] = field(default_factory=dict)
    log_y: bool = False
    after: str = ""
    y_title: str = ""


PANELS: tuple[WebPanel, ...] = (
    WebPanel(
        "alpha", "Alpha (step position on the local parabola)", "step size", {"alpha": ("alpha",)}
    ),
    WebPanel(
        "distance",
        "Distance from start & update size",
        "step size",
        {"distance": ("total",), "update_size": ("total",)},
    ),
    WebPanel("grad_norm", "Gradient norm", "step size", {"grad_norm": ("total",)}),
    WebPanel(
        "gradient_tests",
        "Gradient tests (norm, inner product, orthogonality)",
        "gradient",
        {"norm_test": ("total",), "inner_test": ("total",), "ortho_test": ("total",)},
    ),
    WebPanel("mean_gsnr", "Mean GSNR", "gradient", {"mean_gsnr": None}),
    WebPanel("early_stopping", "Early stopping criterion", "gradient", {"early_stopping": None}),
    WebPanel("cabs", "CABS batch size", "gradient", {"cabs": None}),
    WebPanel(
        "grad_abs_max",
        "Largest gradient element |g|",
        "gradient",
        {"grad_hist_1d": ("grad_abs_max",), "grad_hist_2d": ("grad_abs_max",)},
    ),
    WebPanel(
        "hess_max_ev",
        "Hessian max eigenvalue (sharpness)",
        "curvature",
        {"hess_max_ev": ("value",)},
    ),
    WebPanel("hess_trace", "Hessian trace", "curvature", {"hess_trace": ("total",)}),
    WebPanel("tic", "TIC", "curvature", {"tic_diag": ("total",), "tic_trace": ("total",)}),
    WebPanel("loss", "Mini-batch loss", "performance", {"loss": None}),
    WebPanel("metrics", "Performance (metrics of cp.log)", "performance", {"metrics": None}),
    WebPanel("time", "Time since the first tracked step (s)", "performance", {"time": None}),
)
"""The first-party panels, in page order within each topic."""

_BY_NAME = {name: panel for panel in PANELS for name in panel.members}


def assign(tag: str, names: Mapping[str, str]) -> WebPanel | None:
    """The panel that shows series ``tag`` (``key/field...``), ``None`` if it is hidden.

    Args:
        tag: A series name from :class:`~cockpit_core.web.follow.LogFollower`.
        names: ``{output key: quantity name}`` of the run (a ``label`` makes them differ).

    """
    key, _, rest = tag.partition("/")
    name = names.get(key, key)
    panel = _BY_NAME.get(name)
    if panel is None:
        return WebPanel(f"q-{key}", key, OTHER, {name: None})
    fields = panel.members[name]
    if fields is not None and rest not in fields:
        return None
    if key != name:  # a quantity tracked under a label: a panel of its own
        return WebPanel(f"{panel.id}-{key}", f"{panel.title} [{key}]", panel.topic, {name: fields})
    return panel


def thin(points: Sequence[tuple[int, float | None]], limit: int) -> list[tuple[int, Any]]:
    """At most ``limit`` evenly spaced points, the last one always kept."""
    if len(points) <= limit:
        return list(points)
    stride = -(-len(points) // limit)
    kept = list(points[::stride])
    if kept[-1] != points[-1]:
        kept.append(points[-1])
    return kept


def _place(panel: WebPanel) -> tuple[int, float, str]:
    """Sort key: the topic, then the order of :data:`PANELS` (after ``panel.after``)."""
    position = {p.id: i for i, p in enumerate(PANELS)}
    at = position.get(panel.id, position.get(panel.after, len(PANELS)) + 0.5)
    order = TOPICS.index(panel.topic) if panel.topic in TOPICS else len(TOPICS)
    return order, at, panel.id


def figures(runs: Sequence[Any], max_points: int = 2000) -> list[dict[str, Any]]:
    """The panels of ``runs`` with their plotly figures, ordered by topic.

    Args:
        runs: Followers (``label``, ``names`` and ``series`` as in
            :class:`~cockpit_core.web.follow.LogFollower`), overlaid in this order.
        max_points: Points per series at most (evenly thinned beyond).

    Returns:
        ``[{"id", "title", "topic", "points", "quantities", "figure": {"data", "layout"}}]``
        (``quantities``: the names of the quantities the panel shows), the panels of
        :mod:`cockpit_core.web.extra_panels` included (from each run's ``arrays``).

    """
    import plotly.graph_objects as go
    from plotly.colors import qualitative

    from cockpit_core.web import extra_panels

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
