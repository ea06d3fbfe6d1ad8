"""Dashboard panel of ``hess_spectrum``: the Hessian eigenvalue density over steps.

Reads ``{"grid": [G], "density": [G], "top": [k], "converged": bool}`` per step (see
``docs/quantities/curvature.md``). Each step's density is interpolated onto one eigenvalue
axis spanning all steps' grids; the colour is ``log10`` of the density (six decades below
the largest value, lower values at the floor colour), blank where a step's grid does not
reach. The ``k`` largest eigenvalues are drawn on top as lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cockpit_core.panel import Instrument, values
from cockpit_core.panel.style import BAD, SECONDARY, finish, message

CMAP = "Greens"
DECADES = 6.0
"""Colour range of the log density below its maximum."""


def _arrays(value: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(grid, density, top)`` of one step's value, or ``None`` if it has no usable density."""
    if not isinstance(value, Mapping) or "grid" not in value or "density" not in value:
        return None
    grid = np.asarray(value["grid"], dtype=float).reshape(-1)
    density = np.asarray(value["density"], dtype=float).reshape(-1)
    top = np.asarray(value.get("top", []), dtype=float).reshape(-1)
    ok = np.isfinite(grid)
    if len(grid) != len(density) or ok.sum() < 2:
        return None
    return grid[ok], density[ok], top


def _step_edges(steps: np.ndarray) -> np.ndarray:
    """Cell edges around the steps (half-way between neighbours, width 1 for a single step)."""
    if len(steps) == 1:
        return np.array([steps[0] - 0.5, steps[0] + 0.5])
    mids = (steps[1:] + steps[:-1]) / 2
    return np.concatenate([[2 * steps[0] - mids[0]], mids, [2 * steps[-1] - mids[-1]]])


def _common_axis(grids: list[np.ndarray]) -> np.ndarray:
    """One uniform eigenvalue axis over all steps' grids, as fine as the finest point count."""
    lo = min(float(g.min()) for g in grids)
    hi = max(float(g.max()) for g in grids)
    if not hi > lo:
        hi = lo + 1.0
    return np.linspace(lo, hi, max(len(g) for g in grids))


def draw_spectrum(ax: Any, output: Any, header: Any) -> None:
    """Eigenvalue density per step as a heat map (log colour), top-k eigenvalues as lines.

    Steps whose top-k Lanczos iteration did not converge within ``max_iter`` are circled in
    red on the largest eigenvalue.
    """
    entries = []
    for step, value in values(output, "hess_spectrum"):
        arrays = _arrays(value)
        if arrays is not None:
            converged = value.get("converged") is not False
            entries.append((float(step), *arrays, converged))
    if not entries:
        message(ax, "no eigenvalue density to show")
        return
    steps = np.asarray([e[0] for e in entries])
    axis = _common_axis([e[1] for e in entries])
    columns = [np.interp(axis, g, d, left=np.nan, right=np.nan) for _, g, d, _, _ in entries]
    density = np.stack(columns, axis=1)
    positive = density[np.isfinite(density) & (density > 0)]
    h = axis[1] - axis[0]
    y_edges = np.concatenate([axis - h / 2, [axis[-1] + h / 2]])
    if positive.size:
        vmax = float(np.log10(positive.max()))
        floor = 10 ** (vmax - DECADES)
        shade = np.ma.masked_invalid(np.log10(np.maximum(density, floor)))
        mesh = ax.pcolormesh(
            _step_edges(steps), y_edges, shade, cmap=CMAP, vmin=vmax - DECADES, vmax=vmax
        )
        cbar = ax.figure.colorbar(mesh, ax=ax, pad=0.01, fraction=0.05)
        cbar.ax.tick_params(labelsize=6)
        cbar.set_label("log10 density", fontsize=7)
    k = max(len(e[3]) for e in entries)
    for j in range(k):
        ys = np.asarray([e[3][j] if len(e[3]) > j else np.nan for e in entries])
        ax.plot(
            steps,
            ys,
            color=SECONDARY,
            lw=1.2 if j == 0 else 0.7,
            alpha=1.0 if j == 0 else 0.7,
            marker="." if len(steps) < 30 else None,
            ms=2,
            label=f"top-{k} eigenvalues" if j == 0 else None,
        )
    missed = [i for i, e in enumerate(entries) if not e[4] and len(e[3])]
    if missed:
        ax.plot(
            steps[missed],
            [entries[i][3][0] for i in missed],
            "o",
            mfc="none",
            color=BAD,
            ms=5,
            label="not converged",
        )
    ax.set_xlim(_step_edges(steps)[[0, -1]])
    ax.set_ylim(y_edges[0], y_edges[-1])
    finish(ax, ylabel="eigenvalue", legend=True)
    ax.grid(False)


INSTRUMENT = Instrument(
    name="hess_spectrum",
    title="Hessian spectrum",
    topic="curvature",
    quantities=("hess_spectrum",),
    draw=draw_spectrum,
    order=15,
    description="Hessian eigenvalue density over steps (log colour) with the top-k eigenvalues.",
)
"""The panel of ``hess_spectrum``."""
