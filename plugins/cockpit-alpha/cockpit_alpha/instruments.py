"""Dashboard panel of cockpit-alpha: the alpha gauge (distribution on the unit parabola).

``alpha`` values are dicts ``{"alpha": float, "exact", "predictor", "step_length", "f",
"var_f", "df", "var_df", "fit"}`` (see ``docs/quantities``); the panel reads ``alpha``.

In the standardised picture the loss along the step is the unit parabola ``y = x^2``: the
step starts at ``x = -1``, ``x = 0`` is the minimum of the fitted parabola and ``x = 1`` its
far side at the starting height. A step's ``alpha`` is where it lands.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cockpit_core.panel import Chart, Instrument, Output, scalar, values
from cockpit_core.panel.style import BAD, MUTED, PRIMARY, SECONDARY

LIMIT = 1.5
"""The gauge shows alpha in [-LIMIT, LIMIT]; steps outside are put in the edge bins and
counted in red captions (``"13 steps < -1.5"``)."""


def alphas(output: Output) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, alpha)`` of every tracked step (NaN where a fit failed)."""
    entries = values(output, "alpha")
    steps = np.asarray([s for s, _ in entries], dtype=float)
    vals = np.asarray([scalar(v, "alpha") for _, v in entries], dtype=float)
    return steps, vals


def draw_alpha(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Unit parabola, the alpha distribution (all steps grey, last 10% orange) and gauges."""
    _, a = alphas(output)
    a = a[np.isfinite(a)]
    x = np.linspace(-LIMIT, LIMIT, 200)
    ax.plot(x, x**2, color=PRIMARY, lw=2, zorder=3)
    for v in (-1, 0, 1):
        ax.axvline(v, color="#c8c8d2", lw=1.2, zorder=0)
    ax.axhline(1, color="#c8c8d2", lw=0.6, zorder=0)
    ax.set_xlim(-LIMIT, LIMIT)
    ax.set_ylim(0, LIMIT**2 * 0.8)
    ax.set_xlabel(r"local step length $\alpha$", fontsize=8)
    ax.set_ylabel("standardised loss", fontsize=8)
    ax.tick_params(labelsize=7)
    if a.size == 0:
        ax.text(0, 1.5, "no finite alpha yet", ha="center", fontsize=8, color=MUTED)
        return
    recent = a[-max(1, len(a) // 10) :]
    twin = ax.twinx()
    bins = np.linspace(-LIMIT, LIMIT, 31)
    clipped = np.clip(a, -LIMIT + 1e-9, LIMIT - 1e-9)
    clipped_recent = np.clip(recent, -LIMIT + 1e-9, LIMIT - 1e-9)
    twin.hist(
        clipped, bins=bins, density=True, color=MUTED, alpha=0.5, label=f"all (mean {a.mean():.2f})"
    )
    twin.hist(
        clipped_recent,
        bins=bins,
        density=True,
        color=SECONDARY,
        alpha=0.75,
        label=f"last 10% (mean {recent.mean():.2f})",
    )
    twin.set_ylabel(r"$\alpha$ density", fontsize=8)
    twin.tick_params(labelsize=7)
    twin.legend(fontsize=7, loc="upper center", framealpha=0.7)
    ax.set_zorder(twin.get_zorder() + 1)  # the parabola stays on top of the bars
    ax.patch.set_visible(False)
    ax.plot(
        np.clip(recent, -LIMIT, LIMIT),
        np.clip(recent, -LIMIT, LIMIT) ** 2,
        "o",
        color=SECONDARY,
        ms=3,
        zorder=4,
        mec="white",
        mew=0.4,
    )
    low, high = int((a < -LIMIT).sum()), int((a > LIMIT).sum())
    box = {"facecolor": "white", "alpha": 0.75, "lw": 0, "pad": 1}
    if low:
        ax.text(-LIMIT + 0.03, 0.15, outside(low, "<", -LIMIT), color=BAD, fontsize=6.5, bbox=box)
    if high:
        label = outside(high, ">", LIMIT)
        ax.text(LIMIT - 0.03, 0.15, label, color=BAD, fontsize=6.5, ha="right", bbox=box)


def outside(count: int, relation: str, limit: float) -> str:
    """Caption of the steps beyond the gauge's range, e.g. ``"13 steps < -1.5"``.

    These steps are drawn in the edge bins of the histogram.
    """
    return f"{count} step{'s' if count != 1 else ''} {relation} {limit:g}"


INSTRUMENTS = [
    Instrument(
        name="alpha",
        title="Alpha gauge",
        topic="step size",
        quantities=("alpha",),
        draw=draw_alpha,
        order=10,
        description="Where each step lands on the fitted parabola of the loss along the "
        "update: < 0 too short, 0 the minimum, > 0 overshooting.",
        chart=Chart({"alpha": ("alpha",)}, title="Alpha (step position on the local parabola)"),
    ),
]
"""The panels this plugin registers."""
