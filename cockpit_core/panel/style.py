"""Colours and small drawing helpers shared by instruments (no matplotlib import here)."""

from __future__ import annotations

from typing import Any

import numpy as np

PRIMARY = "#3b6fb6"
"""Main line colour (blue)."""
SECONDARY = "#ee7d2b"
"""Second series (orange)."""
TERTIARY = "#3a9a5b"
"""Third series (green)."""
MUTED = "#9a9aa8"
"""Raw/background data (grey)."""
BAD = "#c62828"
"""Warnings: non-finite values, out-of-range markers (red)."""

TOPIC_COLORS: dict[str, str] = {
    "step size": "#dbe6f5",
    "gradient": "#fbe3d1",
    "curvature": "#d9efe0",
    "performance": "#ececf1",
}
"""Background of each standard topic group; other topics cycle through EXTRA_COLORS."""
EXTRA_COLORS: tuple[str, ...] = ("#e9def5", "#f5ecd6", "#d8eef2", "#f3d9e4")


def finish(
    ax: Any,
    xlabel: str | None = "step",
    ylabel: str | None = None,
    logy: bool = False,
    legend: bool = False,
) -> None:
    """Label ``ax``, add a light grid and (optionally) a log y-axis and a legend."""
    if xlabel:
        ax.set_xlabel(xlabel, fontsize=8)
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=8)
    if logy:
        ax.set_yscale("log")
    if ax.get_yscale() == "linear":
        try:
            ax.ticklabel_format(axis="y", useOffset=False)
        except AttributeError:  # not a ScalarFormatter
            pass
    ax.grid(True, ls=":", lw=0.6, alpha=0.7)
    ax.tick_params(labelsize=7)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="best", framealpha=0.7)


def line(
    ax: Any,
    steps: np.ndarray,
    values: np.ndarray,
    color: str = PRIMARY,
    label: str | None = None,
    **kwargs: Any,
) -> None:
    """Plot a series and mark its non-finite values (NaN/inf) with red ticks at the top.

    Args:
        ax: The matplotlib ``Axes``.
        steps: Steps (x values).
        values: Values (y values); NaN and inf are marked.
        color: Line colour.
        label: Legend label.
        **kwargs: Further ``ax.plot`` keywords; they win over the defaults here (the line
            width is 1.3 unless ``linewidth`` or ``lw`` is given).

    """
    steps = np.asarray(steps, dtype=float)
    values = np.asarray(values, dtype=float)
    if "linewidth" not in kwargs and "lw" not in kwargs:
        kwargs["linewidth"] = 1.3
    ax.plot(steps, values, color=color, label=label, **kwargs)
    mark_nonfinite(ax, steps, values)


def mark_nonfinite(ax: Any, steps: np.ndarray, values: np.ndarray) -> None:
    """Red ``x`` markers at the top edge where ``values`` is NaN or infinite."""
    bad = ~np.isfinite(np.asarray(values, dtype=float))
    if bad.any():
        ax.plot(
            np.asarray(steps)[bad],
            np.ones(int(bad.sum())),
            "x",
            color=BAD,
            transform=ax.get_xaxis_transform(),
            clip_on=False,
            label="NaN/inf",
        )


def positive(values: np.ndarray) -> bool:
    """Whether every finite value is > 0 (a log scale is then safe)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return v.size > 0 and bool((v > 0).all())


def log_if_wide(ax: Any, values: np.ndarray, factor: float = 20.0) -> bool:
    """Log y-scale when the finite values are positive and span more than ``factor``.

    Returns:
        Whether the scale is now logarithmic (a panel's moving average is then taken in log
        scale too).

    """
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if positive(v) and v.max() / v.min() > factor:
        ax.set_yscale("log")
        return True
    return False


def message(ax: Any, text: str) -> None:
    """Write ``text`` in the middle of an otherwise empty panel."""
    ax.text(
        0.5,
        0.5,
        text,
        ha="center",
        va="center",
        fontsize=8,
        color=MUTED,
        wrap=True,
        transform=ax.transAxes,
    )
    ax.set_xticks([])
    ax.set_yticks([])
