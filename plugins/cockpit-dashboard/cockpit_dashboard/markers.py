"""Diagnosis findings as shaded step spans on the panels of the matplotlib dashboard.

:func:`mark_panel` shades each finding's steps, ``first_step`` to ``last_step`` (a thin
vertical line when they are equal), on a panel that shows a quantity the finding's
diagnosis reads (:func:`cockpit_core.diagnosing.findings.marks`), in the colour of its
severity (:data:`cockpit_dashboard.banner.COLORS`). A finding of a diagnosis not
installed, or of one that reads no quantity (``nonfinite``), marks no panel: it is only in
the banner.

Only axes whose x axis is the step are marked: the panel's axes and its inset axes whose
x axis is labelled ``step`` (what :func:`cockpit_core.panel.style.finish` writes by
default). Of the first-party panels these are the curves over steps (loss, performance,
effective learning rate, time, distance, norms, curvature, gradient tests' left part, GSNR,
early stopping, CABS) and the heat maps over steps (gradient histogram over time, Hessian
spectrum); the alpha gauge, the last step's histograms and the tests' acceptance regions
have other x axes and stay unmarked. On a heat map the span is an outline above the
colours (a fill behind them would be hidden); elsewhere it is filled behind the data. The
axes' limits stay as they were.

The spans have the gid :data:`SPAN_GID` and the artist label ``_<finding id>`` (the
underscore keeps them out of legends). The diagnosis name is written at the bottom of a
span (gid :data:`LABEL_GID`) only where it stays readable: when it fits in the axes and
overlaps no name written there before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cockpit_core.diagnosing.findings import marks
from cockpit_core.diagnosis import Finding
from cockpit_dashboard.banner import COLORS

SPAN_GID = "cockpit-finding-span"
"""``gid`` of a finding's span (a ``Rectangle``) or line (a ``Line2D``)."""
LABEL_GID = "cockpit-finding-label"
"""``gid`` of the diagnosis name written at a span."""
OPACITY = 0.15
"""Opacity of a filled span: the curves stay readable."""
STEP_LABELS = ("step", "steps")
"""X-axis labels (lower case) of the axes that get spans."""
LABEL_SIZE = 6.0
"""Font size of a span's label in points."""


def step_axes(ax: Any) -> list[Any]:
    """``ax`` and its inset axes (at any depth) whose x axis is labelled as the step."""
    found = []
    todo = [ax]
    while todo:
        current = todo.pop(0)
        if current.axison and current.get_xlabel().strip().lower() in STEP_LABELS:
            found.append(current)
        todo.extend(getattr(current, "child_axes", []))
    return found


def mark_panel(
    ax: Any,
    shown: Iterable[str],
    findings: Sequence[Finding],
    reads: Mapping[str, Iterable[str]],
) -> list[Any]:
    """Shade the steps of each finding that marks this panel; return the artists added.

    Args:
        ax: The panel's matplotlib ``Axes`` (after its instrument drew on it).
        shown: Names of the quantities the panel shows.
        findings: The run's findings.
        reads: ``{diagnosis name: quantity names}``
            (:func:`cockpit_core.diagnosing.findings.diagnosis_reads`).

    Returns:
        The spans, lines and labels added (empty when no finding marks the panel or no
        axes of it has the step on its x axis).

    """
    shown = set(shown)
    chosen = [f for f in findings if marks(f.diagnosis, shown, reads)]
    added: list[Any] = []
    if not chosen:
        return added
    for target in step_axes(ax):
        xlim, ylim = target.get_xlim(), target.get_ylim()
        taken: list[tuple[float, float]] = []  # label extents, in x data units
        for finding in chosen:
            added.append(_span(target, finding))
            label = _label(target, finding, xlim, taken)
            if label is not None:
                added.append(label)
        if target.get_xlim() != xlim:  # the artists are not part of the data limits, but
            target.set_xlim(xlim, auto=None)  # keep the limits whatever happens
        if target.get_ylim() != ylim:
            target.set_ylim(ylim, auto=None)
    return added


def _is_heat_map(ax: Any) -> bool:
    from matplotlib.collections import QuadMesh

    return bool(ax.images) or any(isinstance(c, QuadMesh) for c in ax.collections)


def _span(ax: Any, finding: Finding) -> Any:
    """The finding's span (a line for one step) on ``ax``, full height, not in the limits."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    color = COLORS.get(finding.severity, COLORS["info"])
    above = _is_heat_map(ax)
    first, last = float(finding.first_step), float(finding.last_step)
    common = {"transform": ax.get_xaxis_transform(), "gid": SPAN_GID, "label": f"_{finding.id}"}
    artist: Any
    if first == last:
        artist = Line2D(
            [first, first],
            [0.0, 1.0],
            color=color,
            lw=1.2,
            ls="--" if above else "-",
            alpha=1.0 if above else 0.6,
            zorder=2.6 if above else 0.6,
            **common,
        )
    else:
        artist = Rectangle(
            (first, 0.0),
            last - first,
            1.0,
            facecolor="none" if above else color,
            edgecolor=color if above else "none",
            fill=not above,
            lw=1.2 if above else 0.0,
            ls="--",
            alpha=1.0 if above else OPACITY,
            zorder=2.6 if above else 0.6,
            **common,
        )
    return ax.add_artist(artist)


def _label(
    ax: Any, finding: Finding, xlim: tuple[float, float], taken: list[tuple[float, float]]
) -> Any:
    """The diagnosis name at the bottom of the span, or ``None`` where it would not be read.

    It is left out when the span starts outside the axes, when the text would run past the
    right edge, or when it would overlap a label already written on these axes.
    """
    low, high = min(xlim), max(xlim)
    x = float(finding.first_step)
    width_in = _width_inches(ax)
    if width_in <= 0 or not low <= x <= high:
        return None
    text_in = 0.6 * LABEL_SIZE * len(finding.diagnosis) / 72 + 0.04  # Helvetica-ish estimate
    extent = (x, x + text_in / width_in * (high - low))
    if extent[1] > high or any(extent[0] < b and a < extent[1] for a, b in taken):
        return None
    taken.append(extent)
    color = COLORS.get(finding.severity, COLORS["info"])
    return ax.text(
        x,
        0.02,
        finding.diagnosis,
        transform=ax.get_xaxis_transform(),
        ha="left",
        va="bottom",
        fontsize=LABEL_SIZE,
        color=color,
        bbox={"facecolor": "white", "alpha": 0.7, "edgecolor": "none", "pad": 0.5},
        clip_on=True,
        zorder=4.5,
        gid=LABEL_GID,
    )


def _width_inches(ax: Any) -> float:
    """Width of ``ax`` on its figure in inches (inset axes through their locator)."""
    locator = ax.get_axes_locator()
    try:
        box = locator(ax, None) if locator is not None else ax.get_position()
    except (TypeError, ValueError, AttributeError):
        box = ax.get_position()
    return float(box.width * ax.figure.get_figwidth())
