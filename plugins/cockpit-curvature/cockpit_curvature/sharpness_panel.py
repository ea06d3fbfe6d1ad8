"""The *Sharpness* panel: ``lambda_max`` of the Hessian against the optimizer's threshold.

Reads ``hess_max_ev`` (``{"value": float, ...}`` or a number) and ``optimizer_hparams``
(cockpit-basic: ``{"optimizer": class name, "groups": [{"lr": ..., ...}]}``) from the log;
the threshold and the edge-of-stability rule are in :mod:`cockpit_curvature.stability`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

import numpy as np

from cockpit_core.panel import Instrument, values
from cockpit_core.panel.style import BAD, MUTED, PRIMARY, finish, mark_nonfinite, positive
from cockpit_curvature.stability import (
    EOS_FRACTION,
    EOS_MIN_STEPS,
    aligned_thresholds,
    edge_of_stability_spans,
    threshold,
)


def lambda_max(value: Any) -> float:
    """The largest eigenvalue from a ``hess_max_ev`` value (``value``/``total`` or a number)."""
    if isinstance(value, Mapping):
        value = value.get("value", value.get("total"))
    try:
        return float(np.asarray(value, dtype=float).reshape(()))
    except (TypeError, ValueError):
        return float("nan")


def threshold_series(output: Any) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``(steps, thresholds, formula or reason per step)`` from ``optimizer_hparams``."""
    entries = values(output, "optimizer_hparams")
    found = [threshold(v) for _, v in entries]
    steps = np.asarray([s for s, _ in entries], dtype=float)
    return steps, np.asarray([t for t, _ in found], dtype=float), [w for _, w in found]


def summary(
    lam: np.ndarray, thr: np.ndarray, spans: list[tuple[float, float, int]], why_not: list[str]
) -> tuple[str, str, bool]:
    """``(status, note, at_edge)``: a one-line status, why there is no threshold, the verdict.

    ``status`` names the steps from the first to the last edge-of-stability span (spans:
    ``lambda_max >= EOS_FRACTION * threshold`` for at least ``EOS_MIN_STEPS`` consecutive
    tracked steps, shaded in the panel), or how close to the threshold ``lambda_max`` came;
    ``note`` is empty when a threshold is drawn, else the last of ``why_not`` (why steps
    have no threshold).
    """
    if spans:
        first, last = spans[0][0], spans[-1][1]
        return f"EDGE OF STABILITY: steps {first:g}-{last:g}", "", True
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = lam / thr
    ratio = ratio[np.isfinite(ratio)]
    if ratio.size:
        return f"below the edge: max {100 * ratio.max():.0f}% of threshold", "", False
    why = why_not[-1] if why_not else "no optimizer_hparams at or before these steps"
    return "raw Hessian, no threshold", why, False


def draw_sharpness(ax: Any, output: Any, header: Any) -> None:
    """``lambda_max`` (blue) with the stability threshold (red dashed) and its 90% (dotted).

    Spans where ``lambda_max >= 0.9 * threshold`` for at least ``EOS_MIN_STEPS`` consecutive
    tracked steps are shaded red and named in the status line above the panel. For
    optimizers without a threshold (Adam and other adaptive methods) a note in the panel
    says why none is drawn.
    """
    entries = values(output, "hess_max_ev")
    steps = np.asarray([s for s, _ in entries], dtype=float)
    lam = np.asarray([lambda_max(v) for _, v in entries], dtype=float)
    h_steps, thr, reasons = threshold_series(output)
    thr_at = aligned_thresholds(steps, h_steps, thr)
    spans = edge_of_stability_spans(steps, lam, thr_at)
    for first, last, _ in spans:
        ax.axvspan(first - 0.5, last + 0.5, color=BAD, alpha=0.12, lw=0)
    ax.plot(steps, lam, color=PRIMARY, lw=1.1, marker=".", ms=3, label=r"$\lambda_{max}(H)$")
    mark_nonfinite(ax, steps, lam)
    shown = np.isfinite(thr)
    if shown.any():
        formula = next(r for r, ok in zip(reversed(reasons), reversed(shown)) if ok)
        t_steps, t = h_steps[shown], thr[shown]
        ax.step(
            t_steps,
            t,
            where="post",
            color=BAD,
            ls="--",
            lw=1.2,
            label=f"threshold {formula} = {t[-1]:.3g}",
        )
        ax.step(
            t_steps,
            EOS_FRACTION * t,
            where="post",
            color=BAD,
            ls=":",
            lw=0.9,
            alpha=0.7,
            label=f"{EOS_FRACTION:g} x threshold (edge: {EOS_MIN_STEPS}+ steps)",
        )
    both = np.concatenate([lam, thr[shown]])
    both = both[np.isfinite(both)]
    if positive(both) and both.max() / both.min() > 20:
        ax.set_yscale("log")
    why_not = [r for r, t in zip(reasons, thr) if np.isnan(t)]
    status, note, at_edge = summary(lam, thr_at, spans, why_not)
    ax.text(
        1.0,
        1.01,
        status,
        transform=ax.transAxes,
        ha="right",
        va="bottom",
        fontsize=7,
        color=BAD if at_edge else "#444444",
        fontweight="bold" if at_edge else "normal",
    )
    if note:  # headroom above the data for the note
        low, high = ax.get_ylim()
        if ax.get_yscale() == "log":
            ax.set_ylim(low, high * (high / low) ** 0.6)
        else:
            ax.set_ylim(low, high + 0.6 * (high - low))
        ax.text(
            0.02,
            0.97,
            textwrap.fill(note, 50),
            transform=ax.transAxes,
            va="top",
            fontsize=6.5,
            bbox={"facecolor": "white", "edgecolor": MUTED, "alpha": 0.85},
        )
    finish(ax, ylabel=r"$\lambda_{max}(H)$")
    ax.legend(fontsize=6, loc="best", framealpha=0.7)


SHARPNESS = Instrument(
    name="sharpness",
    title="Sharpness",
    topic="curvature",
    quantities=("hess_max_ev", "optimizer_hparams"),
    draw=draw_sharpness,
    order=12,  # right below the Hessian max eigenvalue (10)
    description="Largest Hessian eigenvalue against the optimizer's stability threshold "
    "(2/lr for SGD, (2+2 momentum)/lr with momentum); says when training runs at the edge of "
    "stability.",
)
"""The panel; cockpit-curvature's plugin registers it."""
