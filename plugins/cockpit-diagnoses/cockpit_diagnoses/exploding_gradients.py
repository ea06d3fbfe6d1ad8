"""Exploding gradients: the gradient norm grows by orders of magnitude within a few steps."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from cockpit_core.diagnosis import Diagnosis, DiagnosisConfig, Finding, Window, persistent_spans
from cockpit_diagnoses._common import change_factor, fmt
from cockpit_diagnoses.precedence import LOWER_LR, won_by


class ExplodingGradientsConfig(DiagnosisConfig):
    """Options of :class:`ExplodingGradients`."""

    window: int = Field(10, ge=2, description="Tracked steps over which the growth is measured.")
    growth: float = Field(
        100.0, gt=1.0, description="Report a norm this many times its window's minimum."
    )


class ExplodingGradients(Diagnosis):
    """The total or a layer's gradient norm grows ``growth`` x (100) within ``window`` (10).

    Divergence shows first in the gradient norm: on a quadratic with a step beyond the
    stability limit it grows geometrically (``|1 - lr lambda|`` per step). A tracked step is
    flagged when the norm (total or a parameter's) is at least ``growth`` times the
    smallest non-zero norm of the ``window - 1`` tracked steps before it. Reads
    ``grad_norm`` (cockpit-basic). Evidence: the norms before and at the step, the growth,
    the parameters that grew most.
    """

    name = "exploding_gradients"
    reads = ("grad_norm",)
    source = "rule: ||grad|| >= growth x its minimum over the last window of tracked steps"
    Config = ExplodingGradientsConfig
    config: ExplodingGradientsConfig
    precedence = won_by(name)

    def check(self, window: Window) -> list[Finding]:
        """Return the stretches of exploding gradient norms."""
        cfg = self.config
        steps, total = window.series("grad_norm", "total")
        ratio = _growth(total, cfg.window)
        with np.errstate(invalid="ignore"):
            flags = ratio >= cfg.growth
        pstep, per = window.per_param("grad_norm")
        names = window.param_names
        found = []
        for first, last, count in persistent_spans(steps, flags, 1, 1.0):
            i = int(np.nonzero(steps == first)[0][0])
            grew = _grown(pstep, per, names, first, cfg.window, cfg.growth)
            before = float(total[i] / ratio[i])
            found.append(
                self.finding(
                    "",
                    "warning",
                    first,
                    last,
                    growth_message(before, float(total[i]), cfg.window),
                    {
                        "grad_norm": float(total[i]),
                        "min_before": before,
                        "growth": float(ratio[i]),
                        "threshold": cfg.growth,
                        "steps_flagged": count,
                        "parameters": grew,
                    },
                    "Lower the learning rate, clip gradients, or check the initialization and "
                    "normalization of the layers listed.",
                    LOWER_LR,
                )
            )
        return found


def growth_message(before: float, after: float, window: int) -> str:
    """``the gradient norm grew 120x within 10 tracked steps (from 0.1 to 12)``.

    The verb follows the direction (``fell to 0.01x`` if the norm shrank).
    """
    change = change_factor(before, after, up="grew")
    return (
        f"the gradient norm {change} within {window} tracked steps (from {fmt(before)} to "
        f"{fmt(after)})"
    )


def _growth(norms: np.ndarray, window: int) -> np.ndarray:
    """Each entry over the smallest positive finite entry of the ``window - 1`` before it."""
    out = np.full(len(norms), np.nan)
    for i in range(1, len(norms)):
        past = norms[max(0, i - window + 1) : i]
        past = past[np.isfinite(past) & (past > 0)]
        if len(past) and np.isfinite(norms[i]):
            out[i] = norms[i] / past.min()
    return out


def _grown(
    steps: np.ndarray, per: np.ndarray, names: list[str], step: int, window: int, growth: float
) -> list[str]:
    """Up to 5 parameters whose own norm grew ``growth`` x at ``step``, the most first."""
    if not per.size or step not in steps:
        return []
    j = int(np.nonzero(steps == step)[0][0])
    ratio = np.array([_growth(per[: j + 1, k], window)[-1] for k in range(per.shape[1])])
    order = [int(k) for k in np.argsort(-np.nan_to_num(ratio)) if ratio[k] >= growth]
    named = len(names) == per.shape[1]
    return [names[k] if named else f"parameter {k}" for k in order[:5]]
