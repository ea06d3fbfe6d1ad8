"""The web view's panels beyond scalar series, from each follower's :class:`ArrayStore`.

* **Per-parameter lines** (one run only): a panel ``<key>-per_param`` per quantity with a
  ``per_param`` list, one line per parameter named after the header's parameters, placed
  right after the quantity's own panel. With several runs only the totals are overlaid and
  the totals' panel title says so (:data:`TOTALS_NOTE`).
* **Gradient histogram over time**: a heat map per run and ``grad_hist_1d`` quantity (steps
  on x, gradient element value on y, colour ``log10(1 + count)``), at most
  :data:`~cockpit_web.arrays.HEATMAP_COLUMNS` steps; histograms whose edges differ
  are re-binned onto one grid spanning them all.
* **Stability threshold**: on the ``hess_max_ev`` panel, the SGD threshold of the logged
  ``optimizer_hparams`` as a dashed step line (none for Adam-like optimizers, none
  without cockpit-curvature).

:func:`cockpit_web.panels.figures` calls these; the panels it returns are plain dicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from cockpit_web.arrays import HISTOGRAM, SHARPNESS, ArrayStore
from cockpit_web.panel import OTHER, WebPanel, assign, thin

TITLES = {
    "grad_norm": "Gradient norm",
    "distance": "Distance from start",
    "update_size": "Update size",
    "hess_trace": "Hessian trace",
    "tic_diag": "TIC (diagonal)",
    "tic_trace": "TIC (trace)",
}
"""Titles of the first-party quantities' per-parameter panels (before ``per parameter``)."""

TOTALS_NOTE = " (totals; per-parameter lines with a single run)"
"""Appended with several runs to the title of a panel whose quantity has per-parameter values."""

THRESHOLD_COLOR = "#d62728"
_DASHES = ("solid", "dash", "dot", "dashdot")

Built = tuple[WebPanel, list[dict[str, Any]], int]
"""A panel, its traces and the number of values it shows."""


def store(run: Any) -> ArrayStore:
    """The run's :class:`ArrayStore` (an empty one for a run object without it)."""
    found = getattr(run, "arrays", None)
    return found if isinstance(found, ArrayStore) else ArrayStore()


def per_param_panels(runs: Sequence[Any], max_points: int) -> list[Built]:
    """One panel per quantity with per-parameter values; none with several runs."""
    if len(runs) != 1:
        return []
    from plotly.colors import qualitative

    (run,) = runs
    arrays = store(run)
    colors = qualitative.Plotly
    built = []
    for key in sorted(arrays.per_param):
        rows = arrays.per_param[key].items()
        if not rows:
            continue
        name = run.names.get(key, key)
        base = assign(f"{key}/total", run.names)
        title = f"{TITLES.get(name, key)} per parameter"
        if name in TITLES and key != name:
            title += f" [{key}]"
        panel = WebPanel(
            f"{key}-per_param",
            title,
            base.topic if base else OTHER,
            {name: None},
            after=base.id if base else "",
        )
        points = thin(rows, max_points)
        count = len(points[0][1])
        names = arrays.param_names if len(arrays.param_names) == count else []
        traces = [
            {
                "type": "scatter",
                "mode": "lines+markers" if len(points) < 50 else "lines",
                "name": names[j] if names else f"param {j}",
                "x": [s for s, _ in points],
                "y": [row[j] if j < len(row) else None for _, row in points],
                "line": {
                    "color": colors[j % len(colors)],
                    "dash": _DASHES[(j // len(colors)) % len(_DASHES)],
                },
            }
            for j in range(count)
        ]
        built.append((panel, traces, count * arrays.per_param[key].seen))
    return built


def totals_only(runs: Sequence[Any], panels: dict[str, WebPanel]) -> None:
    """With several runs, note on the totals' panels that per-parameter lines are left out."""
    if len(runs) < 2:
        return
    for run in runs:
        for key in store(run).per_param:
            base = assign(f"{key}/total", run.names)
            if base is not None and base.id in panels and TOTALS_NOTE not in base.title:
                panels[base.id] = replace(panels[base.id], title=base.title + TOTALS_NOTE)


def common_grid(
    hists: Sequence[tuple[int, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray]:
    """Counts ``[bins, steps]`` on one grid, and the grid's edges.

    With the same edges at every step the counts are kept as logged. Otherwise the grid
    spans the lowest to the highest edge with the last step's number of bins, and each
    step's counts are moved onto it by interpolating their cumulative sum linearly (exact
    where edges coincide, the total count preserved).
    """
    last = hists[-1][2]
    if all(e.shape == last.shape and np.array_equal(e, last) for _, _, e in hists):
        return np.stack([c for _, c, _ in hists], axis=1), last
    grid = np.linspace(min(e[0] for _, _, e in hists), max(e[-1] for _, _, e in hists), last.size)
    columns = []
    for _, counts, edges in hists:
        cumulative = np.concatenate([[0.0], np.cumsum(counts)])
        columns.append(np.diff(np.interp(grid, edges, cumulative)))
    return np.stack(columns, axis=1), grid


def heat(counts: np.ndarray) -> np.ndarray:
    """The heat map's colour values: ``log10(1 + count)`` to three decimals."""
    return np.round(np.log10(1.0 + np.clip(counts, 0.0, None)), 3)


def histogram_panels(runs: Sequence[Any]) -> list[Built]:
    """The gradient histogram over time: one heat map per run and ``grad_hist_1d`` quantity."""
    built = []
    for index, run in enumerate(runs):
        histograms = store(run).histograms
        for key in sorted(histograms):
            track = histograms[key]
            hists = track.histograms()
            if not hists:
                continue
            counts, grid = common_grid(hists)
            labelled = key != HISTOGRAM  # tracked under a label
            several = len(runs) > 1
            suffix = (f"-{key}" if labelled else "") + (f"-{index}" if several else "")
            tags = [key] * labelled + [run.label] * several
            title = "Gradient histogram over time" + (f" [{', '.join(tags)}]" if tags else "")
            panel = WebPanel(
                f"grad_hist_time{suffix}",
                title,
                "gradient",
                {run.names.get(key, key): None},
                after="grad_abs_max",
                y_title="gradient element value",
            )
            trace = {
                "type": "heatmap",
                "name": run.label,
                "x": [s for s, _, _ in hists],
                "y": grid.tolist(),
                "z": heat(counts).tolist(),
                "colorscale": "Blues",
                "reversescale": True,  # plotly's Blues runs dark to light: empty bins white
                "colorbar": {"title": {"text": "log10(1 + count)"}, "thickness": 12},
                "hovertemplate": "step %{x}<br>value %{y:.3g}<br>log10(1 + count) %{z}"
                "<extra></extra>",
            }
            built.append((panel, [trace], track.seen))
    return built


def spans_decades(traces: Sequence[dict[str, Any]], ratio: float = 20.0) -> bool:
    """Whether the traces' values are all positive and the largest over ``ratio`` x the least.

    A threshold far above the sharpness then gets a log axis, as on the dashboard.
    """
    found = [y for t in traces for y in t.get("y", ()) if y is not None]
    return bool(found) and min(found) > 0 and max(found) / min(found) > ratio


def threshold_traces(
    runs: Sequence[Any], traces: dict[str, list[dict[str, Any]]], max_points: int
) -> dict[str, int]:
    """Add each run's stability threshold to its ``hess_max_ev`` panels (in place).

    Returns:
        ``{panel id: values added}``.

    """
    from plotly.colors import qualitative

    colors = qualitative.Plotly
    added: dict[str, int] = {}
    for index, run in enumerate(runs):
        arrays = store(run)
        thresholds = arrays.thresholds
        if not any(v is not None for v in thresholds.values()):
            continue
        points = thin(sorted(thresholds.items()), max_points)
        keys = {tag.partition("/")[0] for tag in run.series}
        for key in sorted(k for k in keys if run.names.get(k, k) == SHARPNESS):
            panel = assign(f"{key}/value", run.names)
            if panel is None or panel.id not in traces or not run.series.get(f"{key}/value"):
                continue
            last = next(
                thresholds[s] for s in sorted(thresholds, reverse=True) if thresholds[s] is not None
            )
            name = f"stability threshold {arrays.formula} = {last:.3g}"
            traces[panel.id].append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": name if len(runs) == 1 else f"{run.label}: {name}",
                    "legendgroup": run.label,
                    "x": [s for s, _ in points],
                    "y": [v for _, v in points],
                    "line": {
                        "color": THRESHOLD_COLOR if len(runs) == 1 else colors[index % len(colors)],
                        "dash": "dash",
                        "shape": "hv",
                    },
                }
            )
            added[panel.id] = added.get(panel.id, 0) + len(thresholds)
    return added
