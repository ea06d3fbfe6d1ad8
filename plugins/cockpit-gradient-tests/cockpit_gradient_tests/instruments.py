"""Dashboard panels of cockpit-gradient-tests: the three gradient tests, GSNR, early stopping, CABS.

Every quantity here returns ``{"total": float, "per_param": array}``; the panels plot the
totals over steps (see ``docs/dashboard.md`` for how to read them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cockpit_core.panel import Chart, Instrument, Output, last, scalar, series, smooth
from cockpit_core.panel.style import (
    BAD,
    MUTED,
    PRIMARY,
    SECONDARY,
    TERTIARY,
    finish,
    line,
    log_if_wide,
)

TESTS = (
    ("norm_test", "norm", PRIMARY),
    ("inner_test", "inner", SECONDARY),
    ("ortho_test", "ortho", TERTIARY),
)


def draw_gradient_tests(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Test values over steps (left) and the last step's acceptance regions (right).

    Right: the norm test is a disc of radius ``theta``, the inner-product test a horizontal
    band of half-width ``theta`` and the orthogonality test a vertical band of half-width
    ``nu`` around the mini-batch gradient (the cross), on symmetric log axes as in Cockpit.
    """
    ax.set_axis_off()
    ts = ax.inset_axes((0.0, 0.0, 0.6, 1.0))
    geo = ax.inset_axes((0.72, 0.0, 0.28, 1.0))
    tracked = [(n, label, c) for n, label, c in TESTS if any(n in v for v in output.values())]
    everything = []
    for name, label, color in tracked:
        steps, vals = series(output, name)
        line(ts, steps, vals, color=color, label=label)
        everything.append(vals)
    if everything:
        log_if_wide(ts, np.concatenate(everything))
    ts.axhline(1.0, color=MUTED, ls="--", lw=0.8)
    finish(ts, ylabel=r"largest passing $\theta$ / $\nu$", legend=True)

    from matplotlib.patches import Circle

    w = 2.0
    geo.set_xlim(-w, w)
    geo.set_ylim(-w, w)
    geo.set_xscale("symlog", linthresh=0.1)
    geo.set_yscale("symlog", linthresh=0.1)
    values = {n: scalar(last(output, n)[1]) for n, _, _ in tracked}
    if np.isfinite(values.get("inner_test", np.nan)):
        geo.axhspan(-values["inner_test"], values["inner_test"], color=SECONDARY, alpha=0.35)
    if np.isfinite(values.get("ortho_test", np.nan)):
        geo.axvspan(-values["ortho_test"], values["ortho_test"], color=TERTIARY, alpha=0.35)
    if np.isfinite(values.get("norm_test", np.nan)):
        r = values["norm_test"]
        geo.add_patch(Circle((0, 0), r, color=PRIMARY, alpha=0.35, lw=0))
        geo.add_patch(Circle((0, 0), r, color=PRIMARY, fill=False, lw=1.2))
    geo.plot(0, 0, "+", color="black", ms=10, mew=2)
    geo.set_title("last step", fontsize=7)
    _sparse_symlog_ticks(geo)
    geo.set_aspect("equal", adjustable="box")


def _sparse_symlog_ticks(geo: Any) -> None:
    """Label only -1, 0 and 1 (the default symlog labels overlap on a small inset).

    Unlabelled minor ticks and grid lines mark +-0.1, where the axes turn logarithmic.
    """
    for axis in (geo.xaxis, geo.yaxis):
        axis.set_ticks([-1.0, 0.0, 1.0], labels=["-1", "0", "1"])
        axis.set_ticks([-0.1, 0.1], minor=True)
    geo.tick_params(labelsize=6, pad=1.5, length=2)
    geo.tick_params(which="minor", length=1.5)
    geo.grid(True, which="both", ls=":", lw=0.5)


def draw_mean_gsnr(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Mean gradient signal-to-noise ratio with a moving average (geometric on a log axis)."""
    steps, gsnr = series(output, "mean_gsnr")
    ax.plot(steps, gsnr, color=MUTED, lw=0.7, label="GSNR")
    logy = log_if_wide(ax, gsnr)
    line(ax, steps, smooth(gsnr, log=logy), color=PRIMARY, label="moving average")
    finish(ax, ylabel="mean GSNR", legend=True)


def draw_early_stopping(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """The evidence-based criterion; above 0 (red) the gradient is indistinguishable from noise."""
    steps, crit = series(output, "early_stopping")
    ax.plot(steps, crit, color=MUTED, lw=0.7, label="criterion")
    line(ax, steps, smooth(crit), color=PRIMARY, label="moving average")
    ax.axhline(0.0, color=BAD, lw=0.9, ls="--")
    finite = crit[np.isfinite(crit)]
    if finite.size and finite.max() > 0:
        ax.axhspan(0.0, max(finite.max(), 0.0) * 1.05 + 1e-12, color=BAD, alpha=0.08, lw=0)
    finish(ax, ylabel="criterion (> 0: stop)", legend=True)


def draw_cabs(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Batch size suggested by CABS over steps."""
    steps, size = series(output, "cabs")
    ax.plot(steps, size, color=MUTED, lw=0.7, label="suggested")
    logy = log_if_wide(ax, size)
    line(ax, steps, smooth(size, log=logy), color=PRIMARY, label="moving average")
    finish(ax, ylabel="batch size", legend=True)


INSTRUMENTS = [
    Instrument(
        name="gradient_tests",
        title="Gradient tests",
        topic="gradient",
        quantities=(),
        optional=("norm_test", "inner_test", "ortho_test"),
        draw=draw_gradient_tests,
        order=10,
        description="Largest theta/nu passing the norm, inner-product and orthogonality "
        "tests over steps, and the last step's acceptance regions.",
        chart=Chart(
            {name: ("total",) for name, _, _ in TESTS},
            title="Gradient tests (norm, inner product, orthogonality)",
        ),
    ),
    Instrument(
        name="mean_gsnr",
        title="Mean GSNR",
        topic="gradient",
        quantities=("mean_gsnr",),
        draw=draw_mean_gsnr,
        order=60,
        description="Mean gradient signal-to-noise ratio.",
        chart=Chart({"mean_gsnr": None}),
    ),
    Instrument(
        name="early_stopping",
        title="Early stopping criterion",
        topic="gradient",
        quantities=("early_stopping",),
        draw=draw_early_stopping,
        order=70,
        description="Evidence-based criterion of Mahsereci et al.; > 0 suggests stopping.",
        chart=Chart({"early_stopping": None}),
    ),
    Instrument(
        name="cabs",
        title="CABS batch size",
        topic="gradient",
        quantities=("cabs",),
        draw=draw_cabs,
        order=80,
        description="Batch size suggested by the CABS rule.",
        chart=Chart({"cabs": None}),
    ),
]
"""The panels this plugin registers."""
