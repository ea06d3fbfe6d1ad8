"""Dashboard panels of cockpit-attention: max attention logit and min entropy per layer.

Each ``draw(ax, output, header)`` gets ``{step: {"attention": value}}`` (see
:class:`cockpit_core.instrument.Instrument`); layers are matched by module name across steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from cockpit_core.panel import Chart, Each, Instrument, Output, short_names
from cockpit_core.panel.style import BAD, finish, line, log_if_wide, message

TOPIC = "forward pass"
"""The column group of these panels (shared with cockpit-activations' panels)."""

LEGEND_LAYERS = 6
"""Layers named in a panel's legend: all up to this many, else the first and the last."""


def layer_series(
    output: Output, field: str, over_heads: Callable[..., Any]
) -> tuple[np.ndarray, list[str], np.ndarray]:
    """``(steps, layers, values[step, layer])``: ``over_heads`` of each layer's ``field``.

    A layer without a value at a step is NaN there.
    """
    steps: list[int] = []
    layers: dict[str, int] = {}
    rows: list[dict[str, float]] = []
    for step in sorted(output):
        value = output[step].get("attention")
        if not isinstance(value, Mapping) or field not in value or "modules" not in value:
            continue
        names = [str(n) for n in value["modules"]]
        per_head = value[field]
        if len(names) != len(per_head):
            continue
        row = {}
        for name, heads in zip(names, per_head):
            data = np.asarray(heads, dtype=float)
            row[name] = float(over_heads(data)) if data.size else float("nan")
            layers.setdefault(name, len(layers))
        steps.append(step)
        rows.append(row)
    table = np.full((len(steps), len(layers)), np.nan)
    for i, row in enumerate(rows):
        for name, v in row.items():
            table[i, layers[name]] = v
    return np.asarray(steps, dtype=float), list(layers), table


def _draw_layers(
    ax: Any, output: Output, field: str, over_heads: Callable[..., Any]
) -> tuple[np.ndarray, np.ndarray]:
    """One line per layer (first layer dark, last light); returns the steps and table drawn."""
    from matplotlib import colormaps

    steps, layers, table = layer_series(output, field, over_heads)
    if table.size == 0:
        return steps, table
    colors = colormaps["viridis"](np.linspace(0.0, 0.9, max(len(layers), 1)))
    named = set(range(len(layers)))
    if len(layers) > LEGEND_LAYERS:
        named = {0, len(layers) - 1}
    for j, layer in enumerate(short_names(layers)):
        label = layer if j in named else None
        line(ax, steps, table[:, j], color=colors[j], label=label, lw=1.0)
    return steps, table


def draw_max_logit(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Largest attention logit of each layer (max over its heads) over the steps."""
    _, table = _draw_layers(ax, output, "max_logit", np.max)
    if table.size == 0:
        message(ax, "no attention layers recorded")
        return
    finish(ax, ylabel="max logit (over heads)")
    log_if_wide(ax, table, factor=50.0)
    ax.legend(fontsize=5.5, loc="best", ncol=2, framealpha=0.5)


def draw_entropy(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Lowest mean attention entropy of each layer's heads, and the min over layers."""
    steps, table = _draw_layers(ax, output, "entropy", np.min)
    if table.size == 0:
        message(ax, "no attention layers recorded")
        return
    if not np.isfinite(table).any():
        message(ax, "entropy not computed (attention option entropy: false)")
        return
    with np.errstate(all="ignore"):
        lowest = np.array([np.nanmin(r) if np.isfinite(r).any() else np.nan for r in table])
    line(ax, steps, lowest, color=BAD, label="min", lw=1.0, ls="--")
    finish(ax, ylabel="entropy (nats), min over heads")
    ax.legend(fontsize=5.5, loc="best", ncol=2, framealpha=0.5)


INSTRUMENTS = [
    Instrument(
        name="attention_max_logit",
        title="Max attention logit per layer",
        topic=TOPIC,
        quantities=("attention",),
        draw=draw_max_logit,
        order=40,
        description="Largest pre-softmax attention logit of each layer (max over heads): "
        "logit growth comes before divergence (Wortsman et al., 2023).",
        chart=Chart(
            {"attention": (Each("max_logit", names="modules", reduce="max"),)},
            log_y=None,
            y_title="max logit (over heads)",
        ),
    ),
    Instrument(
        name="attention_entropy",
        title="Attention entropy per layer",
        topic=TOPIC,
        quantities=("attention",),
        draw=draw_entropy,
        order=50,
        description="Mean attention entropy of each layer's lowest head, and the min over "
        "layers: entropy collapse goes with instability (Zhai et al., 2023).",
        chart=Chart(
            {"attention": (Each("entropy", names="modules", reduce="min"), "min_entropy")},
            y_title="entropy (nats), min over heads",
        ),
    ),
]
"""The panels this plugin registers."""
