"""Run comparison: several runs in one dashboard, one colour per run.

``render([run_a, run_b, ...])`` plans each run on its own (:func:`plan`) and shows the
union of their panels (:func:`merge`). A panel is drawn in one of two ways, chosen by its
instrument's ``overlay`` field (see :class:`~cockpit_core.instrument.Instrument`):

* **Overlay** (:func:`~cockpit_dashboard.overlay.draw_overlay`): ``draw`` is called
  once per run on the same axes and what each call adds is re-coloured in the run's
  colour, with one legend naming the runs (details in that module).
* **Side by side** (:func:`draw_side_by_side`): one small panel per run in the panel's
  cell, titled with the run's label in its colour; for drawings that cannot share axes
  (heat maps, 2-D histograms, inset axes). With ``overlay=None`` the first run's drawing
  decides: a colour-mapped mesh, image or scatter, inset axes or new figure axes send the
  panel side by side.

Each run's label is :func:`run_labels`' choice: given labels, else the learning rate (the
``optimizer_hparams`` quantity, else a ``learning_rate`` metric of ``cp.log``), else the
shortest distinct tail of the log path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cockpit_core.engine.metrics import METRICS_KEY
from cockpit_core.instrument import TOPICS, Instrument
from cockpit_core.log import LogData
from cockpit_core.panel.planning import Panel, Plan, plan
from cockpit_dashboard.overlay import draw_overlay
from cockpit_dashboard.panel_draw import draw_safely
from cockpit_dashboard.runs import PanelKey, Run

RUN_COLORS: tuple[str, ...] = (
    "#3b6fb6",
    "#ee7d2b",
    "#3a9a5b",
    "#8e5fb8",
    "#8c6d31",
    "#d6609f",
    "#17a2b8",
    "#5b5b6b",
)
"""Colour of the k-th run (cycled); red is left out: it marks NaN/inf values."""


def key(panel: Panel) -> PanelKey:
    """The :data:`~cockpit_dashboard.runs.PanelKey` of ``panel``."""
    return panel.instrument.name, panel.title


def learning_rate(data: LogData) -> str | None:
    """The learning rate of a run as text (``"0.1"``; ``"0.1/0.01"`` for several groups).

    Read from the first ``optimizer_hparams`` value (its groups' ``lr``), else from the first
    ``learning_rate`` metric logged with ``cp.log``; ``None`` when neither was logged.
    """
    for step in sorted(data.output):
        value = data.output[step].get("optimizer_hparams")
        if isinstance(value, Mapping):
            lrs = [g.get("lr") for g in value.get("groups") or [] if isinstance(g, Mapping)]
            lrs = [lr for lr in lrs if isinstance(lr, (int, float))]
            if lrs:
                return "/".join(f"{lr:g}" for lr in dict.fromkeys(lrs))
    for step in sorted(data.output):
        metrics = data.output[step].get(METRICS_KEY)
        if isinstance(metrics, Mapping) and isinstance(metrics.get("learning_rate"), (int, float)):
            return f"{metrics['learning_rate']:g}"
    return None


def _path_names(sources: Sequence[Any]) -> list[str | None]:
    """The shortest distinct tail of each path source (``lr-0.1/log.jsonl``); None if no path."""
    parts = [
        Path(s).resolve().parts if isinstance(s, (str, os.PathLike)) else None for s in sources
    ]
    depth = 1
    while True:
        names = ["/".join(p[-depth:]) if p else None for p in parts]
        paths = [n for n in names if n is not None]
        longest = max((len(p) for p in parts if p), default=0)
        if len(set(paths)) == len(paths) or depth >= longest:
            return names
        depth += 1


def run_labels(
    datas: Sequence[LogData], sources: Sequence[Any], labels: Sequence[str] | None = None
) -> list[str]:
    """A legend label per run: ``labels``, else ``lr <rate>``, else the log path, else ``run k``.

    Repeated labels get the path (or ``#k``) appended so that every run stays identifiable.

    Raises:
        ValueError: ``labels`` has another length than the runs.

    """
    if labels is not None:
        labels = [str(label) for label in labels]
        if len(labels) != len(datas):
            raise ValueError(f"got {len(labels)} labels for {len(datas)} runs.")
        return labels
    names = _path_names(sources)
    found = []
    for k, (data, name) in enumerate(zip(datas, names)):
        lr = learning_rate(data)
        found.append(f"lr {lr}" if lr is not None else name or f"run {k + 1}")
    counts = {label: found.count(label) for label in found}
    return [
        label
        if counts[label] == 1
        else f"{label} ({names[k]})"
        if names[k] and names[k] != label
        else f"{label} #{k + 1}"
        for k, label in enumerate(found)
    ]


def merge(plans: Sequence[Plan]) -> tuple[Plan, list[dict[PanelKey, Panel]]]:
    """The union of the runs' plans, and each run's panels by their :func:`key`.

    A panel is shown when at least one run has it; an instrument is listed as skipped,
    unavailable or without panel only when no run draws it.
    """
    merged = Plan()
    per_run: list[dict[PanelKey, Panel]] = []
    for p in plans:
        own = {key(panel): panel for panel in p.panels}
        for k, panel in own.items():
            if not any(k in seen for seen in per_run):
                merged.topics.setdefault(panel.instrument.topic, []).append(panel)
        per_run.append(own)
    drawn = {name for own in per_run for name, _ in own}
    for p in plans:
        for inst, missing in p.skipped:
            names = {i.name for i, _ in merged.skipped} | {i.name for i in merged.unavailable}
            if inst.name not in drawn and inst.name not in names:
                merged.skipped.append((inst, missing))
        for inst in p.unavailable:
            names = {i.name for i, _ in merged.skipped} | {i.name for i in merged.unavailable}
            if inst.name not in drawn and inst.name not in names:
                merged.unavailable.append(inst)
    merged.without_panel = sorted({q for p in plans for q in p.without_panel})
    order = {t: i for i, t in enumerate(TOPICS)}
    merged.topics = {
        t: sorted(ps, key=lambda p: (p.instrument.order, p.instrument.name))
        for t, ps in sorted(
            merged.topics.items(), key=lambda kv: (order.get(kv[0], len(TOPICS)), kv[0])
        )
    }
    return merged, per_run


def prepare(
    datas: Sequence[LogData],
    sources: Sequence[Any],
    instruments: Sequence[Instrument],
    labels: Sequence[str] | None = None,
) -> tuple[list[Run], Plan, LogData]:
    """The runs (labels, colours, panels), the merged plan, and the runs' errors and skips.

    The returned :class:`~cockpit_core.log.LogData` has no values; it holds every run's
    error and skipped-step records for the note under the dashboard.
    """
    names = run_labels(datas, sources, labels)
    plans = [plan(data, instruments) for data in datas]
    merged, per_run = merge(plans)
    runs = [
        Run(data, name, RUN_COLORS[k % len(RUN_COLORS)], own)
        for k, (data, name, own) in enumerate(zip(datas, names, per_run))
    ]
    notes = LogData(
        {},
        {},
        [e for data in datas for e in data.errors],
        [r for data in datas for r in data.skipped],
    )
    return runs, merged, notes


def summary(runs: Sequence[Run]) -> str:
    """Default title of a comparison: how many runs, their labels and steps."""
    steps = [s for run in runs for s in run.data.output]
    span = f"steps {min(steps)}-{max(steps)}" if steps else "no steps"
    return f"Comparing {len(runs)} runs: " + ", ".join(r.label for r in runs) + f" ({span})"


def draw_panel(fig: Any, cell: Any, panel: Panel, runs: Sequence[Run]) -> Any:
    """Draw ``panel`` for every run that has it into ``cell``: overlaid or side by side."""
    present = [run for run in runs if key(panel) in run.panels]
    mode = panel.instrument.overlay
    if mode is not False:
        ax = fig.add_subplot(cell)
        ax.set_title(panel.title, fontsize=9.5, fontweight="bold", loc="left")
        entries = [(run, run.panels[key(panel)]) for run in present]
        if draw_overlay(fig, ax, entries, decide=mode is None):
            return ax
        fig.delaxes(ax)
    return draw_side_by_side(fig, cell, panel, present)


def draw_side_by_side(fig: Any, cell: Any, panel: Panel, runs: Sequence[Run]) -> Any:
    """One small panel per run in ``cell``, each titled with the run's label in its colour."""
    host = fig.add_subplot(cell)
    host.set_axis_off()
    host.set_title(panel.title, fontsize=9.5, fontweight="bold", loc="left")
    gap = 0.1 if len(runs) > 1 else 0.0
    width = (1 - gap * (len(runs) - 1)) / max(len(runs), 1)
    for k, run in enumerate(runs):
        sub = host.inset_axes((k * (width + gap), 0.0, width, 0.9))

        def title(ax: Any, run: Run = run) -> None:
            ax.set_title(run.label, fontsize=7.5, color=run.color, fontweight="bold")

        title(sub)
        draw_safely(fig, sub, run.panels[key(panel)], run.data, title)
    return host
