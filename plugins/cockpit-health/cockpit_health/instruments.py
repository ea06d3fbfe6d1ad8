"""Dashboard panels of cockpit-health: update ratio, parameter norm, gradient noise scale.

Each ``draw(ax, output, header)`` gets ``{step: {quantity_name: value}}`` restricted to the
panel's quantities (see :class:`cockpit_core.instrument.Instrument`). matplotlib is only
used through the ``Axes`` handed in (and its colour maps, imported when a panel is drawn).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cockpit_core.panel import (
    Chart,
    Each,
    Instrument,
    Line,
    Output,
    param_names,
    per_param_series,
    series,
    smooth,
    values,
)
from cockpit_core.panel.style import (
    MUTED,
    PRIMARY,
    SECONDARY,
    TERTIARY,
    finish,
    line,
    log_if_wide,
    mark_nonfinite,
    message,
)

HEALTHY_UPDATE_RATIO = (1e-4, 1e-2)
"""The band the update-ratio panel shades: the usual range around ``1e-3``."""

LABELLED_LAYERS = 8
"""Per-layer panels label at most this many parameters (the others are drawn unlabelled)."""


def _colors(count: int) -> list[Any]:
    """``count`` colours of the viridis map (one per parameter)."""
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(x) for x in np.linspace(0.0, 0.9, max(count, 1))]


def _draw_layers(
    ax: Any, header: Mapping[str, Any], steps: np.ndarray, per: np.ndarray, **kwargs: Any
) -> None:
    """One thin line per parameter, the first :data:`LABELLED_LAYERS` named in the legend."""
    names = param_names(header, per.shape[1])
    for j, color in enumerate(_colors(per.shape[1])):
        label = names[j] if j < LABELLED_LAYERS else None
        ax.plot(steps, per[:, j], color=color, label=label, **kwargs)
        mark_nonfinite(ax, steps, per[:, j])


def draw_update_ratio(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """``||Δθ_i|| / ||θ_i||`` per parameter (thin) and in total (thick), log scale.

    The shaded band marks the usual healthy range ``1e-4 .. 1e-2`` around ``1e-3``.
    """
    steps, per = per_param_series(output, "update_ratio")
    s_total, total = series(output, "update_ratio")
    low, high = HEALTHY_UPDATE_RATIO
    ax.axhspan(low, high, color=TERTIARY, alpha=0.12, lw=0, label="usual range")
    for edge in (low, high):  # lines, so that a comparison of runs keeps the range once
        ax.axhline(edge, color=TERTIARY, lw=0.7, ls="--")
    if per.size:
        _draw_layers(ax, header, steps, per, lw=0.8, alpha=0.8)
    line(ax, s_total, total, color=PRIMARY, label="total", lw=2.0)
    ax.set_yscale("log")
    finish(ax, ylabel=r"$\|\Delta\theta\| / \|\theta\|$")
    if per.shape[1] <= 12:
        ax.legend(fontsize=6, loc="best", ncol=2, framealpha=0.6)


def draw_param_norm(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Total parameter norm ``||θ||`` over steps with a moving average."""
    steps, norm = series(output, "param_norm")
    ax.plot(steps, norm, color=MUTED, lw=0.7, alpha=0.8, label=r"$\|\theta\|$")
    mark_nonfinite(ax, steps, norm)
    logy = log_if_wide(ax, norm)
    line(ax, steps, smooth(norm, log=logy), color=PRIMARY, label="moving average")
    finish(ax, ylabel="parameter norm", legend=True)


def draw_param_norm_layers(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """``||θ_i||`` of each parameter over steps (the first eight labelled)."""
    steps, per = per_param_series(output, "param_norm")
    if per.size == 0:
        message(ax, "no per-parameter values")
        return
    _draw_layers(ax, header, steps, per, lw=1.0)
    log_if_wide(ax, per)
    finish(ax, ylabel=r"$\|\theta_i\|$")
    if per.shape[1] <= 12:
        ax.legend(fontsize=6, loc="best", ncol=2, framealpha=0.6)


def _noise_scale_arrays(output: Output) -> dict[str, np.ndarray]:
    """Steps and each field of ``noise_scale`` as float arrays (NaN where one is missing)."""
    rows = values(output, "noise_scale")
    fields = ("b_simple", "se", "trace_cov", "grad_sq", "batch_size")
    arrays = {"steps": np.asarray([s for s, _ in rows], dtype=float)}
    for name in fields:
        arrays[name] = np.asarray(
            [float(v.get(name, np.nan)) if isinstance(v, dict) else np.nan for _, v in rows],
            dtype=float,
        )
    return arrays


def draw_noise_scale(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """``B_simple`` with a ± standard-error band, its step-averaged form and the batch size.

    The dashed line divides moving averages of ``tr(Σ)`` and ``|G|²``, McCandlish et al.'s
    way to a stable estimate; the dotted line is the batch size ``B`` for comparison.
    """
    d = _noise_scale_arrays(output)
    steps, b, se = d["steps"], d["b_simple"], d["se"]
    with np.errstate(invalid="ignore", divide="ignore"):
        signal = smooth(d["grad_sq"])
        averaged = np.where(signal > 0, smooth(d["trace_cov"]) / signal, np.nan)
    logy = log_if_wide(ax, np.concatenate([b, averaged]))
    band = np.isfinite(b) & np.isfinite(se)
    if band.any():
        lower = np.where(band, b, np.nan) - np.where(band, se, np.nan)
        upper = np.where(band, b, np.nan) + np.where(band, se, np.nan)
        if logy:  # a log axis cannot show <= 0: stop the band at half the smallest value
            floor = 0.5 * np.nanmin(np.where(b > 0, b, np.nan))
            lower = np.where(band, np.maximum(np.where(band, lower, floor), floor), np.nan)
        ax.fill_between(
            steps,
            lower,
            upper,
            color=PRIMARY,
            alpha=0.18,
            lw=0,
            label="± standard error",
        )
    line(ax, steps, b, color=PRIMARY, label=r"$B_\mathrm{simple}$")
    if np.isfinite(averaged).any():
        ax.plot(steps, averaged, color=SECONDARY, ls="--", lw=1.2, label="ratio of averages")
    if np.isfinite(d["batch_size"]).any():
        ax.step(
            steps, d["batch_size"], where="post", color=MUTED, ls=":", lw=1.2, label="batch size"
        )
    finish(ax, ylabel=r"noise scale $B_\mathrm{simple}$", legend=True)


INSTRUMENTS = [
    Instrument(
        name="update_ratio",
        title="Update / parameter ratio",
        topic="step size",
        quantities=("update_ratio",),
        draw=draw_update_ratio,
        order=35,
        size=1.5,
        description="Relative size of each update per parameter and in total, with the usual "
        "healthy range 1e-4..1e-2 shaded (about 1e-3 for Adam-type training).",
        chart=Chart(
            {"update_ratio": ("total", Each("per_param"))},
            log_y=True,
            y_title="||Δθ|| / ||θ||",
        ),
    ),
    Instrument(
        name="param_norm",
        title="Parameter norm",
        topic="step size",
        quantities=("param_norm",),
        draw=draw_param_norm,
        order=45,
        description="Norm of all parameters over steps (Megatron's params-norm).",
        chart=Chart({"param_norm": ("total",)}, y_title="||θ||"),
    ),
    Instrument(
        name="param_norm_layers",
        title="Parameter norm per layer",
        topic="step size",
        quantities=("param_norm",),
        draw=draw_param_norm_layers,
        order=46,
        description="Norm of each parameter tensor over steps.",
        chart=Chart({"param_norm": (Each("per_param"),)}, log_y=None, y_title="||θ_i||"),
    ),
    Instrument(
        name="noise_scale",
        title="Gradient noise scale",
        topic="gradient",
        quantities=("noise_scale",),
        draw=draw_noise_scale,
        order=60,
        description="Simple noise scale B_simple = tr(Σ)/|G|² (McCandlish et al., 2018) with "
        "its jackknife standard error, the ratio of moving averages, and the batch size.",
        chart=Chart(
            {"noise_scale": (Line("b_simple", error="se"), "batch_size")},
            log_y=None,
            y_title="B_simple (± standard error)",
        ),
    ),
]
"""The panels this plugin registers."""
