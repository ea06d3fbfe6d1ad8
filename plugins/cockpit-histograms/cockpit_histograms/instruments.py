"""Dashboard panels of cockpit-histograms: 1-D histogram (last step, over time, per layer), 2-D.

Output layouts read here (see ``docs/quantities/histograms.md``):

* ``grad_hist_1d``: ``{"hist": [bins], "edges": [bins + 1], "nonfinite": {...},
  "grad_abs_max": float, "per_param": [P, bins] (with keep_individual)}``; the edges may
  change from step to step (range adaptation).
* ``grad_hist_2d``: ``{"hist": [xbins, ybins], "x_edges", "y_edges", "nonfinite",
  "grad_abs_max", "param_abs_max", "per_param": [P, xbins, ybins] (with keep_individual)}``
  with the gradient on the x and the parameter on the y axis.

Counts are shown as ``log10(1 + count)``: gradient histograms span many orders of magnitude.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cockpit_core.panel import Chart, Instrument, Output, last, param_names, values
from cockpit_core.panel.style import BAD, MUTED, PRIMARY, finish, message

CMAP = "Blues"


def _nonfinite_note(ax: Any, value: Any) -> None:
    bad = value.get("nonfinite") or {}
    total = sum(int(v) for v in bad.values() if isinstance(v, (int, float, np.integer)))
    if total:
        ax.text(
            0.02,
            0.95,
            f"{total} non-finite elements!",
            color=BAD,
            fontsize=7,
            transform=ax.transAxes,
            va="top",
        )


def draw_hist_1d(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Histogram of the last step's per-sample gradient elements (log counts)."""
    step, value = last(output, "grad_hist_1d")
    assert value is not None, "drawn only when grad_hist_1d was logged (the panel's quantity)"
    counts = np.asarray(value["hist"], dtype=np.float64)
    edges = np.asarray(value["edges"], dtype=np.float64)
    ax.stairs(counts, edges, fill=True, color=PRIMARY, alpha=0.85)
    if (counts > 0).any():
        ax.set_yscale("log")
    ax.axvline(0.0, color=MUTED, lw=0.8)
    m = value.get("grad_abs_max")
    if m is not None and np.isfinite(m) and m > edges[-1]:
        ax.text(
            0.98,
            0.95,
            f"max |g| = {m:.3g}\n(beyond the range:\nclamped to edge bins)",
            color=BAD,
            fontsize=6.5,
            ha="right",
            va="top",
            transform=ax.transAxes,
        )
    _nonfinite_note(ax, value)
    finish(ax, xlabel=f"gradient element value (step {step})", ylabel="count")


def _common_grid(entries: list[tuple[int, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """Counts of every step re-binned onto one grid (``[bins, steps]``) and its edges.

    With a fixed range this is the identity; with an adapted range the counts are moved by
    linear interpolation of the cumulative counts (exact at coinciding edges).
    """
    all_edges = [np.asarray(v["edges"], dtype=np.float64) for _, v in entries]
    bins = len(all_edges[-1]) - 1
    lo = min(e[0] for e in all_edges)
    hi = max(e[-1] for e in all_edges)
    grid = np.linspace(lo, hi, bins + 1)
    columns = []
    for (_, v), e in zip(entries, all_edges):
        counts = np.asarray(v["hist"], dtype=np.float64)
        if len(e) == len(grid) and np.allclose(e, grid):
            columns.append(counts)
        else:
            cum = np.concatenate([[0.0], np.cumsum(counts)])
            columns.append(np.diff(np.interp(grid, e, cum)))
    return np.stack(columns, axis=1), grid


def _step_edges(steps: np.ndarray) -> np.ndarray:
    if len(steps) == 1:
        return np.array([steps[0] - 0.5, steps[0] + 0.5])
    mids = (steps[1:] + steps[:-1]) / 2
    return np.concatenate([[2 * steps[0] - mids[0]], mids, [2 * steps[-1] - mids[-1]]])


def draw_hist_1d_time(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Gradient element histogram of every tracked step: steps on x, value on y."""
    entries = values(output, "grad_hist_1d")
    counts, grid = _common_grid(entries)
    steps = np.asarray([s for s, _ in entries], dtype=np.float64)
    mesh = ax.pcolormesh(_step_edges(steps), grid, np.log10(1 + counts), cmap=CMAP, shading="flat")
    ax.axhline(0.0, color=MUTED, lw=0.6)
    cbar = ax.figure.colorbar(mesh, ax=ax, pad=0.01, fraction=0.05)
    cbar.ax.tick_params(labelsize=6)
    cbar.set_label("log10(1 + count)", fontsize=7)
    finish(ax, ylabel="gradient element value")
    ax.grid(False)


def _has_per_param_1d(output: Output) -> bool:
    _, value = last(output, "grad_hist_1d")
    return value is not None and np.ndim(value.get("per_param")) == 2


def draw_hist_1d_layers(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Last step's histogram of each parameter: one row per parameter."""
    step, value = last(output, "grad_hist_1d")
    assert value is not None, "drawn only when grad_hist_1d was logged (the panel's quantity)"
    per = np.asarray(value["per_param"], dtype=np.float64)
    edges = np.asarray(value["edges"], dtype=np.float64)
    rows = np.arange(per.shape[0] + 1) - 0.5
    ax.pcolormesh(edges, rows, np.log10(1 + per), cmap=CMAP, shading="flat")
    names = param_names(header, per.shape[0])
    if per.shape[0] <= 16:
        ax.set_yticks(range(per.shape[0]))
        ax.set_yticklabels(names, fontsize=6)
    ax.invert_yaxis()
    ax.axvline(0.0, color=MUTED, lw=0.6)
    finish(ax, xlabel=f"gradient element value (step {step})")
    ax.grid(False)


def draw_hist_2d(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Joint histogram of (gradient element, parameter element) with both marginals."""
    step, value = last(output, "grad_hist_2d")
    assert value is not None, "drawn only when grad_hist_2d was logged (the panel's quantity)"
    hist = np.asarray(value["hist"], dtype=np.float64)
    xe = np.asarray(value["x_edges"], dtype=np.float64)
    ye = np.asarray(value["y_edges"], dtype=np.float64)
    ax.set_axis_off()
    joint = ax.inset_axes((0.0, 0.0, 0.74, 0.72))
    top = ax.inset_axes((0.0, 0.74, 0.74, 0.26), sharex=joint)
    right = ax.inset_axes((0.76, 0.0, 0.24, 0.72), sharey=joint)
    joint.pcolormesh(xe, ye, np.log10(1 + hist.T), cmap=CMAP, shading="flat")
    joint.axvline(0.0, color=MUTED, lw=0.6)
    joint.axhline(0.0, color=MUTED, lw=0.6)
    finish(joint, xlabel=f"gradient element (step {step})", ylabel="parameter element")
    joint.grid(False)
    gx = hist.sum(axis=1)
    top.stairs(gx, xe, fill=True, color=PRIMARY, alpha=0.85)
    if (gx > 0).any():
        top.set_yscale("log")
    top.tick_params(labelbottom=False, labelleft=False)
    py = hist.sum(axis=0)
    right.stairs(py, ye, fill=True, color=PRIMARY, alpha=0.85, orientation="horizontal")
    if (py > 0).any():
        right.set_xscale("log")
    right.tick_params(labelleft=False, labelbottom=False)
    _nonfinite_note(top, value)


def _has_per_param_2d(output: Output) -> bool:
    _, value = last(output, "grad_hist_2d")
    return value is not None and np.ndim(value.get("per_param")) == 3


def draw_hist_2d_layers(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Joint histogram of each parameter (up to 8), last step."""
    step, value = last(output, "grad_hist_2d")
    assert value is not None, "drawn only when grad_hist_2d was logged (the panel's quantity)"
    per = np.asarray(value["per_param"], dtype=np.float64)
    xe = np.asarray(value["x_edges"], dtype=np.float64)
    ye = np.asarray(value["y_edges"], dtype=np.float64)
    names = param_names(header, per.shape[0])
    shown = min(per.shape[0], 8)
    ax.set_axis_off()
    cols = min(shown, 4)
    nrows = (shown + cols - 1) // cols
    w, h = 1.0 / cols, 1.0 / nrows
    for i in range(shown):
        r, c = divmod(i, cols)
        sub = ax.inset_axes((c * w + 0.02, 1 - (r + 1) * h + 0.1 * h, w - 0.04, 0.72 * h))
        sub.pcolormesh(xe, ye, np.log10(1 + per[i].T), cmap=CMAP, shading="flat")
        sub.set_title(names[i], fontsize=6)
        sub.tick_params(labelsize=5)
    if per.shape[0] > shown:
        message(ax, "")
        ax.text(
            1, 0, f"+{per.shape[0] - shown} more", ha="right", fontsize=6, transform=ax.transAxes
        )


INSTRUMENTS = [
    Instrument(
        name="grad_hist_1d",
        title="Gradient element histogram",
        topic="gradient",
        quantities=("grad_hist_1d",),
        draw=draw_hist_1d,
        order=20,
        description="Per-sample gradient elements of the last tracked step.",
        chart=Chart(  # the web view shows the largest element over steps instead
            {"grad_hist_1d": ("grad_abs_max",), "grad_hist_2d": ("grad_abs_max",)},
            title="Largest gradient element |g|",
            name="grad_abs_max",
        ),
    ),
    Instrument(
        name="grad_hist_1d_time",
        title="Gradient histogram over time",
        topic="gradient",
        quantities=("grad_hist_1d",),
        draw=draw_hist_1d_time,
        order=25,
        description="The 1-D gradient histogram of every tracked step as a heat map.",
        chart=Chart(
            heatmap="grad_hist_1d", name="grad_hist_time", y_title="gradient element value"
        ),
    ),
    Instrument(
        name="grad_hist_2d",
        title="Gradient/parameter histogram",
        topic="gradient",
        quantities=("grad_hist_2d",),
        draw=draw_hist_2d,
        order=30,
        description="Joint histogram of gradient and parameter elements, last step.",
    ),
    Instrument(
        name="grad_hist_1d_layers",
        title="Gradient histogram per layer",
        topic="gradient",
        quantities=("grad_hist_1d",),
        draw=draw_hist_1d_layers,
        order=35,
        available=_has_per_param_1d,
        description="track grad_hist_1d with keep_individual=true",
    ),
    Instrument(
        name="grad_hist_2d_layers",
        title="Gradient/parameter histogram per layer",
        topic="gradient",
        quantities=("grad_hist_2d",),
        draw=draw_hist_2d_layers,
        order=36,
        available=_has_per_param_2d,
        description="track grad_hist_2d with keep_individual=true",
    ),
]
"""The panels this plugin registers."""
