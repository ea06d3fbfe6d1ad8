"""Which panel of the web view shows a scalar series.

Series of the first-party quantities are laid out like the dashboard's topics
(:data:`PANELS`: step size, gradient, curvature, performance); a fields list keeps a panel
to the series worth reading (``alpha`` shows ``alpha/alpha``, not the ``exact`` flag).
Every other quantity, a third-party one included, gets a generic panel of its own (its key
as title, topic :data:`OTHER`) with all its scalar fields (:func:`assign`). :func:`thin`
keeps a series to the points a chart shows. The plotly figures of the panels are made by
:mod:`cockpit_web.panels` and :mod:`cockpit_web.extra_panels`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TOPICS: tuple[str, ...] = ("step size", "gradient", "curvature", "performance", "other")
"""Sections of the page, in order (the dashboard's topics, then everything else)."""

OTHER = "other"
"""The topic of a quantity's generic panel (a quantity no panel of :data:`PANELS` shows)."""


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
        tag: A series name from :class:`~cockpit_web.follow.LogFollower`.
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
