"""Dashboard panels of cockpit-curvature: Hessian max eigenvalue, Hessian trace, TIC.

``hess_trace``, ``tic_diag`` and ``tic_trace`` return ``{"total": float, "per_param":
array}`` (their estimators add ``std_error``, ``std_error_per_param`` and ``hvps``; the
errors are ``None`` for XTrace and XDiag below 24 products); ``hess_max_ev`` returns
``{"value": float, "eigenvalues": [k], "hvps": int, "converged": bool}`` (a plain number
or a ``total`` entry are read too).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from cockpit_core.panel import (
    Chart,
    Instrument,
    Output,
    Threshold,
    param_names,
    per_param_series,
    series,
    smooth,
    values,
)
from cockpit_core.panel.style import (
    BAD,
    MUTED,
    PRIMARY,
    SECONDARY,
    finish,
    line,
    log_if_wide,
)
from cockpit_curvature.stability import threshold


def _eigenvalue(value: Any) -> float:
    if isinstance(value, Mapping):
        for key in ("total", "value", "eigenvalue", "max_ev"):
            if key in value:
                return _eigenvalue(value[key])
        return float("nan")
    try:
        return float(np.asarray(value, dtype=float).reshape(()))
    except (TypeError, ValueError):
        return float("nan")


def draw_max_ev(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Largest Hessian eigenvalue over steps, further top-k eigenvalues thin, misses in red.

    Steps where the Lanczos iteration stopped at ``max_iter`` before converging are circled
    in red: their value is a lower bound (largest algebraic) rather than the eigenvalue.
    """
    entries = values(output, "hess_max_ev")
    steps = np.asarray([s for s, _ in entries], dtype=float)
    lam = np.asarray([_eigenvalue(v) for _, v in entries], dtype=float)
    extra: list[np.ndarray | list[float]] = [
        np.atleast_1d(v.get("eigenvalues", [])) if isinstance(v, Mapping) else []
        for _, v in entries
    ]
    k = max((len(e) for e in extra), default=0)
    for j in range(1, k):
        ys = [float(e[j]) if len(e) > j else np.nan for e in extra]
        ax.plot(
            steps,
            ys,
            color=SECONDARY,
            lw=0.7,
            alpha=0.6,
            label="next eigenvalues" if j == 1 else None,
        )
    ax.plot(steps, lam, color=MUTED, lw=0.7, marker=".", ms=2, label=r"$\lambda_{max}$")
    logy = log_if_wide(ax, lam)
    line(ax, steps, smooth(lam, log=logy), color=PRIMARY, label="moving average")
    missed = [
        i
        for i, (_, v) in enumerate(entries)
        if isinstance(v, Mapping) and v.get("converged") is False
    ]
    if missed:
        ax.plot(steps[missed], lam[missed], "o", mfc="none", color=BAD, ms=5, label="not converged")
    finish(ax, ylabel=r"$\lambda_{max}(H)$", legend=True)


def _error_band(
    ax: Any,
    output: Output,
    name: str,
    steps: np.ndarray,
    value: np.ndarray,
    color: str,
    label: str,
) -> None:
    """A band of +-2 standard errors (about 95% for an approximately normal estimate).

    Drawn only at steps with a finite ``std_error``: none where it is missing, ``None``
    (XTrace and XDiag below 24 products report no error bar) or NaN.
    """
    _, std_error = series(output, name, "std_error")  # None and missing read as NaN
    known = np.isfinite(std_error)
    if known.any():
        ax.fill_between(
            steps,
            value - 2 * std_error,
            value + 2 * std_error,
            where=known,
            color=color,
            alpha=0.2,
            lw=0,
            label=rf"{label} $\pm$ 2 SE",
        )


def draw_trace(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """Hessian trace in total (bold) and per parameter (thin lines).

    Randomized estimates (``method`` ``hutchinson``, ``hutchpp`` or ``xtrace``) carry
    ``std_error``; the total then gets a band of +-2 standard errors (about 95% for an
    approximately normal estimate). No band where ``std_error`` is ``None`` (``xtrace``
    below 24 products).
    """
    steps, total = series(output, "hess_trace")
    s_per, per = per_param_series(output, "hess_trace")
    if per.size:
        from matplotlib import colormaps

        cm = colormaps["viridis"]
        names = param_names(header, per.shape[1])
        for j in range(per.shape[1]):
            label = names[j] if per.shape[1] <= 8 else None
            ax.plot(
                s_per,
                per[:, j],
                color=cm(0.9 * j / max(per.shape[1] - 1, 1)),
                lw=0.8,
                alpha=0.8,
                label=label,
            )
    _error_band(ax, output, "hess_trace", steps, total, PRIMARY, "total")
    line(ax, steps, total, color=PRIMARY, lw=1.8, label="total")
    all_vals = np.concatenate([total, per.ravel()]) if per.size else total
    log_if_wide(ax, all_vals)
    finish(ax, ylabel="tr(H)")
    ax.legend(fontsize=6, ncol=2, loc="best", framealpha=0.6)


def draw_tic(ax: Any, output: Output, header: Mapping[str, Any]) -> None:
    """TIC approximations over steps (diagonal and trace variant, whichever were tracked).

    With an estimated Hessian diagonal (``curvature`` ``hutchinson`` or ``xdiag``) each
    carries ``std_error`` (delta method): a band of +-2 standard errors, none where it is
    ``None`` (``xdiag`` below 24 products).
    """
    drawn = []
    for name, label, color in (
        ("tic_diag", "TIC (diagonal)", PRIMARY),
        ("tic_trace", "TIC (trace)", SECONDARY),
    ):
        if any(name in v for v in output.values()):
            steps, tic = series(output, name)
            _error_band(ax, output, name, steps, tic, color, label)
            line(ax, steps, tic, color=color, label=label)
            drawn.append(tic)
    if drawn:
        log_if_wide(ax, np.concatenate(drawn))
    finish(ax, ylabel="TIC", legend=True)


def plain_formula(formula: str) -> str:
    r"""A threshold formula in plain text: ``$2(1+\beta)/\eta$`` -> ``2(1 + momentum)/lr``."""
    text = formula.strip("$").replace(r"\eta", "lr").replace(r"\beta", "momentum")
    return text.replace("(1+momentum)", "(1 + momentum)").replace("-wd", " - weight_decay")


def stability_line(hparams: Any) -> tuple[float | None, str]:
    """The SGD stability threshold of an ``optimizer_hparams`` value and its line's name.

    ``(None, why not)`` where none applies (adaptive optimizers, differing param groups);
    see :func:`cockpit_curvature.stability.threshold`.
    """
    found, formula = threshold(hparams)
    if not math.isfinite(found):
        return None, formula
    return float(found), f"stability threshold {plain_formula(formula)}"


INSTRUMENTS = [
    Instrument(
        name="hess_max_ev",
        title="Hessian max eigenvalue",
        topic="curvature",
        quantities=("hess_max_ev",),
        draw=draw_max_ev,
        order=10,
        description="Sharpness: the largest eigenvalue of the mini-batch Hessian.",
        chart=Chart(
            {"hess_max_ev": ("value",)},
            title="Hessian max eigenvalue (sharpness)",
            log_y=None,  # the threshold may lie far above
            thresholds=(Threshold("optimizer_hparams", stability_line),),
        ),
    ),
    Instrument(
        name="hess_trace",
        title="Hessian trace",
        topic="curvature",
        quantities=("hess_trace",),
        draw=draw_trace,
        order=20,
        description="Trace of the Hessian, in total and per parameter.",
        chart=Chart({"hess_trace": ("total",)}),
    ),
    Instrument(
        name="tic",
        title="TIC",
        topic="curvature",
        quantities=(),
        optional=("tic_diag", "tic_trace"),
        draw=draw_tic,
        order=30,
        description="Takeuchi information criterion (generalization-gap proxy).",
        chart=Chart({"tic_diag": ("total",), "tic_trace": ("total",)}),
    ),
]
"""The panels this plugin registers."""
