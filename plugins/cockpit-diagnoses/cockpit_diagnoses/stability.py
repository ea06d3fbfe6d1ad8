"""Stability: the largest Hessian eigenvalue is above what the optimizer's step can follow."""

from __future__ import annotations

import math

import numpy as np
from cockpit_curvature.stability import aligned_thresholds, threshold
from pydantic import Field

from cockpit_core.diagnosis import Diagnosis, Finding, Window, persistent_spans
from cockpit_diagnoses._common import PersistenceConfig, fmt
from cockpit_diagnoses.precedence import LOWER_LR, won_by


class StabilityConfig(PersistenceConfig):
    """Options of :class:`Stability`."""

    window: int = Field(3, ge=1, description="Consecutive tracked steps looked at together.")
    fraction: float = Field(
        1.0, gt=0.0, le=1.0, description="Share of the window's steps above the threshold."
    )
    margin: float = Field(
        1.0,
        gt=0.0,
        description="Report lambda_max >= margin x threshold (1: above the stability limit; "
        "0.9: already at the edge of stability).",
    )


class Stability(Diagnosis):
    """The curvature is above the stability limit of SGD at this learning rate.

    Gradient descent with learning rate ``eta`` on a quadratic is stable iff ``lambda_max <
    2/eta``, with heavy-ball momentum ``beta`` iff ``lambda_max < (2 + 2 beta)/eta`` (Cohen,
    Kaur, Li, Kolter & Talwalkar 2021, "Gradient Descent on Neural Networks Typically Occurs
    at the Edge of Stability", ICLR; Nesterov, dampening and weight decay as in
    ``cockpit_curvature.stability.sgd_threshold``). Reported when ``hess_max_ev >= margin x
    threshold`` at ``fraction`` (1.0) of ``window`` (3) consecutive tracked steps. Needs
    ``optimizer_hparams`` (the learning rate) and ``torch.optim.SGD``; adaptive optimizers
    get no threshold. Evidence: the largest and the median lambda_max of the stretch, the
    threshold and its formula, the learning rate.
    """

    name = "stability"
    reads = ("hess_max_ev", "optimizer_hparams")
    source = "Cohen et al. (2021), Edge of Stability, ICLR: lambda_max < (2 + 2 beta) / lr"
    Config = StabilityConfig
    config: StabilityConfig
    precedence = won_by(name)

    def applies(self, window: Window) -> bool:
        """Both the eigenvalue and the optimizer's hyperparameters are needed."""
        return all(window.has(key) for key in self.reads)

    def check(self, window: Window) -> list[Finding]:
        """Return the stretches with lambda_max at or above the threshold."""
        cfg = self.config
        steps, lam = window.series("hess_max_ev", "value")
        hp = window.values("optimizer_hparams")
        limits = [threshold(value) for _, value in hp]
        thr = aligned_thresholds(steps, [s for s, _ in hp], [t for t, _ in limits])
        with np.errstate(invalid="ignore"):
            flags = np.isfinite(lam) & np.isfinite(thr) & (lam >= cfg.margin * thr)
        found = []
        for first, last, count in persistent_spans(steps, flags, cfg.window, cfg.fraction):
            inside = (steps >= first) & (steps <= last) & flags
            limit = float(thr[inside][-1])
            formula = _plain_formula(
                next((f for (s, _), (_t, f) in reversed(list(zip(hp, limits))) if s <= last), "")
            )
            lr = _lr(hp, last)
            peak = float(np.max(lam[inside]))
            found.append(
                self.finding(
                    "",
                    "warning",
                    first,
                    last,
                    stability_message(peak, limit, formula, count),
                    {
                        "lambda_max": peak,
                        "median_lambda_max": float(np.median(lam[inside])),
                        "threshold": limit,
                        "formula": formula,
                        "lr": lr,
                        "margin": cfg.margin,
                        "steps_flagged": count,
                    },
                    f"Lower the learning rate below {fmt(cfg.margin * limit / peak * lr)} "
                    "(threshold x lr / lambda_max), or warm it up."
                    if math.isfinite(lr)
                    else "Lower the learning rate.",
                    LOWER_LR,
                )
            )
        return found


def stability_message(peak: float, limit: float, formula: str, count: int) -> str:
    """``lambda_max 5 is above the stability threshold 0.2 (2/lr) at 30 tracked steps: ...``.

    With ``margin`` below 1 the rule also reports a peak below the threshold: the message
    then says so ("below ..., at 95 % of it": at the edge of stability), never "above".
    """
    if peak > limit:
        where, verdict = "above", "the learning rate is too high for this curvature"
    elif peak == limit:
        where, verdict = "at", "the learning rate is at the edge of stability for this curvature"
    else:
        where = f"below, at {100 * peak / limit:.0f} % of,"
        verdict = "the learning rate is close to the edge of stability for this curvature"
    return (
        f"lambda_max {fmt(peak)} is {where} the stability threshold {fmt(limit)} ({formula}) "
        f"at {count} tracked steps: {verdict}"
    )


def _plain_formula(tex: str) -> str:
    r"""``$2(1+\beta)/\eta$`` as ``2(1+beta)/lr``."""
    return tex.strip("$").replace("\\beta", "beta").replace("\\eta", "lr")


def _lr(hparams: list[tuple[int, object]], step: int) -> float:
    """The first param group's learning rate in force at ``step`` (NaN if unknown)."""
    value = next((v for s, v in reversed(hparams) if s <= step), None)
    try:
        return float(value["groups"][0]["lr"])  # type: ignore[index]
    except (TypeError, KeyError, IndexError, ValueError):
        return math.nan
