"""Dashboard panels of cockpit-activations: activation RMS and max per module, output logits.

Each ``draw(ax, output, header)`` gets ``{step: {quantity_name: value}}`` restricted to the
panel's quantities (see :class:`cockpit_core.instrument.Instrument`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cockpit_core.panel import Chart, Each, Instrument, Output, last, series, short_names
from cockpit_core.panel.style import PRIMARY, SECONDARY, TERTIARY, finish, line, message, positive

TOPIC = "forward pass"
"""The column group of these panels."""

LEGEND_MODULES = 6
"""Modules named in a per-module panel's legend: all up to this many, else the largest."""


def module_series(
    output: Output, name: str, field: str
) -> tuple[np.ndarray, list[str], np.ndarray]:
    """``(steps, modules, values[step, module])`` of a per-module array of ``activations``.

    Modules are matched by name across steps (in the order they first appear); a module
    without a value at a step is NaN there.
    """
    steps: list[int] = []
    modules: dict[str, int] = {}
    rows: list[dict[str, float]] = []
    for step in sorted(output):
        value = output[step].get(name)
        if not isinstance(value, Mapping) or field not in value or "modules" not in value:
            continue
        names = [str(n) for n in value["modules"]]
        data = np.atleast_1d(np.asarray(value[field], dtype=float))
        if len(names) != len(data):
            continue
        for n in names:
            modules.setdefault(n, len(modules))
        steps.append(step)
        rows.append(dict(zip(names, data)))
    table = np.full((len(steps), len(modules)), np.nan)
    for i, row in enumerate(rows):
        for n, v in row.items():
            table[i, modules[n]] = v
    return np.asarray(steps, dtype=float), list(modules), table


def _colors(n: int) -> list[Any]:
    from matplotlib import colormaps

    cm = colormaps["viridis"]
    return [cm(x) for x in np.linspace(0.0, 0.9, max(n, 1))]


def _labelled(table: np.ndarray) -> set[int]:
    """Modules to name: all of few, else the :data:`LEGEND_MODULES` largest at the end."""
    count = table.shape[1]
    if count <= LEGEND_MODULES:
        return set(range(count))
    latest = np.full(count, -np.inf)
    for row in table:
        latest = np.where(np.isfinite(row), row, latest)
    return {int(j) for j in np.argsort(-latest, kind="stable")[:LEGEND_MODULES]}


def draw_per_module(
    ax: Any, output: Output, header: Mapping[str, Any], field: str, ylabel: str, wide: float = 1.0
) -> None:
    """One line per module of ``activations[field]``.

    The y-axis is logarithmic when every value is > 0 and the largest is more than ``wide``
    times the smallest.
    """
    steps, modules, table = module_series(output, "activations", field)
    if table.size == 0:
        message(ax, "no module outputs recorded")
        return
    named = _labelled(table)
    colors = _colors(len(modules))
    for j, module in enumerate(short_names(modules)):
        label = module if j in named else None
        line(ax, steps, table[:, j], color=colors[j], label=label, lw=1.0)
    finite = table[np.isfinite(table)]
    logy = positive(table) and finite.max() > wide * finite.min()
    finish(ax, ylabel=ylabel, logy=logy)
    ax.legend(fontsize=5.5, loc="best", ncol=2, framealpha=0.5)


def draw_rms(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """RMS of each selected module's output over the steps (log y-axis; colour: module order)."""
    draw_per_module(ax, output, header, "rms", "RMS of the output")


def draw_amax(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Largest magnitude of each selected module's output (log y-axis beyond a factor 20)."""
    draw_per_module(ax, output, header, "amax", "max |output|", wide=20.0)


def draw_logits(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Mean and max of log Z over the positions and the largest logit, over the steps."""
    for field, color, label in (
        ("log_z_mean", PRIMARY, "mean log Z"),
        ("log_z_max", SECONDARY, "max log Z"),
        ("max_logit", TERTIARY, "max logit"),
    ):
        steps, values = series(output, "logits", field)
        line(ax, steps, values, color=color, label=label)
    _, latest = last(output, "logits")
    title = None
    if isinstance(latest, Mapping) and "z_loss" in latest:
        title = f"z-loss {float(latest['z_loss']):.3g}"
    finish(ax, ylabel="logits")
    ax.legend(fontsize=6.5, loc="best", framealpha=0.7, title=title, title_fontsize=6.5)


INSTRUMENTS = [
    Instrument(
        name="activations_rms",
        title="Activation RMS per module",
        topic=TOPIC,
        quantities=("activations",),
        draw=draw_rms,
        order=10,
        size=1.5,
        description="RMS of each selected module's output (blocks, linear and norm layers by "
        "default): growth over training, and against width in a muP coordinate check.",
        chart=Chart(
            {"activations": (Each("rms", names="modules"),)},
            log_y=True,
            y_title="RMS of the output",
        ),
    ),
    Instrument(
        name="activations_amax",
        title="Max activation per module",
        topic=TOPIC,
        quantities=("activations",),
        draw=draw_amax,
        order=20,
        description="Largest magnitude of each selected module's output: massive "
        "activations, and the range a low-precision format must hold.",
        chart=Chart(
            {"activations": (Each("amax", names="modules"),)},
            log_y=True,
            y_title="max |output|",
        ),
    ),
    Instrument(
        name="logits_log_z",
        title="Output logits",
        topic=TOPIC,
        quantities=("logits",),
        draw=draw_logits,
        order=30,
        description="Mean and max of log Z (logsumexp of the logits) and the largest logit; "
        "the legend gives the latest z-loss value.",
        chart=Chart({"logits": ("log_z_mean", "log_z_max", "max_logit")}, y_title="logits"),
    ),
]
"""The panels this plugin registers."""
