"""The web view's panels beyond scalar series, from each follower's :class:`ArrayStore`.

* **Lines per entry**: an array a chart draws with :class:`~cockpit_core.panel.Each` (per
  module, per parameter, per layer) becomes one line per entry, matched by name from step
  to step, on the chart's panel; with several runs each run's lines take its colour.
* **Error bars**: a :class:`~cockpit_core.panel.Line` with an ``error`` field.
* **Per-parameter lines** (one run only): a panel ``<key>-per_param`` per quantity with a
  ``per_param`` list that no chart draws, one line per parameter named after the header's
  parameters, placed right after the panel of the quantity's ``total``. With several runs
  only the totals are overlaid and the totals' panel title says so (:data:`TOTALS_NOTE`).
* **Histograms over time**: a heat map per run and quantity a chart names as its
  ``heatmap`` (steps on x, the histogram's bins on y, colour ``log10(1 + count)``), at most
  :data:`~cockpit_web.arrays.HEATMAP_COLUMNS` steps; histograms whose edges differ are
  re-binned onto one grid spanning them all.
* **Thresholds**: each :class:`~cockpit_core.panel.Threshold` of a chart (the SGD stability
  threshold on the sharpness panel) as a dashed step line per run drawn in the panel.

:func:`cockpit_web.panels.figures` calls these; the panels it returns are plain dicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from cockpit_core.panel import Each, Line
from cockpit_web.arrays import ArrayStore, Decimated
from cockpit_web.panel import Layout, WebPanel, generic, thin

TOTALS_NOTE = " (totals; per-parameter lines with a single run)"
"""Appended with several runs to the title of a panel whose quantity has per-parameter values."""

THRESHOLD_COLOR = "#d62728"
_DASHES = ("solid", "dash", "dot", "dashdot")


class Panels:
    """The panels being built: their traces, how many values each shows, the runs drawn."""

    def __init__(self) -> None:
        self.panels: dict[str, WebPanel] = {}
        self.traces: dict[str, list[dict[str, Any]]] = {}
        self.counts: dict[str, int] = {}
        self.runs: dict[str, set[int]] = {}

    def add(
        self, panel: WebPanel, traces: list[dict[str, Any]], count: int, run: int | None = None
    ) -> None:
        """Add ``traces`` showing ``count`` values to ``panel`` (of run number ``run``)."""
        self.panels.setdefault(panel.id, panel)
        self.traces.setdefault(panel.id, []).extend(traces)
        self.counts[panel.id] = self.counts.get(panel.id, 0) + count
        if run is not None:
            self.runs.setdefault(panel.id, set()).add(run)


def store(run: Any) -> ArrayStore:
    """The run's :class:`ArrayStore` (an empty one for a run object without it)."""
    found = getattr(run, "arrays", None)
    return found if isinstance(found, ArrayStore) else ArrayStore()


def error_bars(trace: dict[str, Any], run: Any, tag: str, line: Line) -> None:
    """Add the error bars of ``line`` (its ``error`` field at the trace's steps) to ``trace``."""
    errors = run.series.get(f"{tag.partition('/')[0]}/{line.error}") or {}
    array = [errors.get(step) for step in trace["x"]]
    if any(e is not None for e in array):
        trace["error_y"] = {"type": "data", "array": array, "visible": True, "thickness": 1}


def entry_table(
    points: Sequence[tuple[int, Any]], param_names: Sequence[str]
) -> tuple[list[str], list[list[float | None]]]:
    """The entries' names (first appearance order) and their values at each of ``points``.

    ``points``: ``(step, (names or None, values))`` as :class:`ArrayStore` keeps them;
    ``None`` names are the parameters' (``param j`` when their number differs). An entry
    missing at a step, or not finite there, is ``None``.
    """
    order: dict[str, int] = {}
    rows = []
    for _, (names, row) in points:
        if names is None:
            count = len(row)
            names = (
                param_names if len(param_names) == count else [f"param {j}" for j in range(count)]
            )
        for name in names:
            order.setdefault(name, len(order))
        rows.append(dict(zip(names, row)))
    values = [
        [None if (v := r.get(name)) is None or not np.isfinite(v) else float(v) for r in rows]
        for name in order
    ]
    return list(order), values


def entry_traces(runs: Sequence[Any], layout: Layout, built: Panels, max_points: int) -> None:
    """Add each run's lines per entry (:class:`~cockpit_core.panel.Each`) to their panels."""
    from plotly.colors import qualitative

    colors = qualitative.Plotly
    for index, run in enumerate(runs):
        arrays = store(run)
        for (key, each), track in sorted(arrays.entries.items(), key=_entry_order):
            name = run.names.get(key, key)
            points = thin(track.items(), max_points)
            if not points:
                continue
            entries, values = entry_table(points, arrays.param_names)
            for base in layout.charts_of(name):
                if each not in (base.members.get(name) or ()):
                    continue
                alone = len(base.members) == 1 and base.members[name] == (each,)
                traces = []
                for j, (entry, ys) in enumerate(zip(entries, values)):
                    label = entry if alone else f"{key}/{each.field}/{entry}"
                    one = len(runs) == 1
                    traces.append(
                        {
                            "type": "scatter",
                            "mode": "lines+markers" if len(points) < 50 else "lines",
                            "name": label if one else f"{run.label}: {label}",
                            "legendgroup": run.label,
                            "x": [s for s, _ in points],
                            "y": ys,
                            "line": {
                                "color": colors[(j if one else index) % len(colors)],
                                "dash": _DASHES[(j // len(colors) if one else j) % len(_DASHES)],
                                "width": 1.5 if one else 1,
                            },
                        }
                    )
                built.add(base.labelled(key, name), traces, len(entries) * track.seen, index)


def _entry_order(item: tuple[tuple[str, Each], Decimated]) -> tuple[str, ...]:
    (key, each), _ = item
    return key, each.field, each.names, each.reduce


def per_param_panels(runs: Sequence[Any], layout: Layout, built: Panels, max_points: int) -> None:
    """One panel per quantity with per-parameter values no chart draws; none with several runs."""
    if len(runs) != 1:
        return
    from plotly.colors import qualitative

    (run,) = runs
    arrays = store(run)
    colors = qualitative.Plotly
    for key in sorted(arrays.per_param):
        rows = arrays.per_param[key].items()
        name = run.names.get(key, key)
        if not rows or layout.draws_per_param(name):
            continue
        found = layout.assign(f"{key}/total", run.names)
        base = found[0][0] if found else generic(key, name)
        if base.chart is not None and len(base.members) == 1:
            title = f"{base.title.removesuffix(f' [{key}]')} per parameter"
            title += f" [{key}]" if key != name else ""
        else:
            title = f"{key} per parameter"
        panel = WebPanel(
            f"{key}-per_param", title, base.topic, {name: None}, place=(*base.place[:3], 1, 0)
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
        built.add(panel, traces, count * arrays.per_param[key].seen)


def totals_only(runs: Sequence[Any], layout: Layout, built: Panels) -> None:
    """With several runs, note on the totals' panels that per-parameter lines are left out."""
    if len(runs) < 2:
        return
    for run in runs:
        for key in store(run).per_param:
            for base, _ in layout.assign(f"{key}/total", run.names):
                shown = built.panels.get(base.id)
                if shown is not None and TOTALS_NOTE not in shown.title:
                    built.panels[base.id] = replace(shown, title=shown.title + TOTALS_NOTE)


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
    values: np.ndarray = np.round(np.log10(1.0 + np.clip(counts, 0.0, None)), 3)
    return values


def histogram_panels(runs: Sequence[Any], layout: Layout, built: Panels) -> None:
    """The histograms over time: one heat map per run and quantity a chart names as ``heatmap``."""
    for index, run in enumerate(runs):
        histograms = store(run).histograms
        for key in sorted(histograms):
            name = run.names.get(key, key)
            track = histograms[key]
            hists = track.histograms()
            bases = layout.heatmaps_of(name)
            if not hists or not bases:
                continue
            counts, grid = common_grid(hists)
            labelled = key != name  # tracked under a label
            several = len(runs) > 1
            suffix = (f"-{key}" if labelled else "") + (f"-{index}" if several else "")
            tags = [key] * labelled + [run.label] * several
            for base in bases:
                panel = replace(
                    base,
                    id=base.id + suffix,
                    title=base.title + (f" [{', '.join(tags)}]" if tags else ""),
                    members={name: None},
                    place=(*base.place[:2], key if labelled else "", 0, index),
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
                built.add(panel, [trace], track.seen, index)


def spans_decades(traces: Sequence[dict[str, Any]], ratio: float = 20.0) -> bool:
    """Whether the traces' values are all positive and the largest over ``ratio`` x the least.

    A threshold far above the sharpness then gets a log axis, as on the dashboard.
    """
    found = [y for t in traces for y in t.get("y", ()) if y is not None]
    return bool(found) and min(found) > 0 and max(found) / min(found) > ratio


def log_axis(panel: WebPanel, traces: Sequence[dict[str, Any]]) -> bool:
    """Whether the panel's y axis is logarithmic (``log_y``; ``None``: :func:`spans_decades`)."""
    return spans_decades(traces) if panel.log_y is None else bool(panel.log_y)


def threshold_traces(runs: Sequence[Any], built: Panels, max_points: int) -> None:
    """Add each run's thresholds to the panels of the charts that have them and show the run."""
    from plotly.colors import qualitative

    colors = qualitative.Plotly
    for index, run in enumerate(runs):
        arrays = store(run)
        for panel_id, panel in list(built.panels.items()):
            if panel.chart is None or index not in built.runs.get(panel_id, ()):
                continue
            for spec in panel.chart.thresholds:
                if spec not in arrays.threshold_specs:
                    continue
                i = arrays.threshold_specs.index(spec)
                found = sorted((s, row[i]) for s, row in arrays.thresholds.items())
                shown = [v for _, v in found if v is not None]
                if not shown:
                    continue
                points = thin(found, max_points)
                name = f"{arrays.threshold_names[i]} = {shown[-1]:.3g}"
                trace = {
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
                built.add(panel, [trace], len(found))
