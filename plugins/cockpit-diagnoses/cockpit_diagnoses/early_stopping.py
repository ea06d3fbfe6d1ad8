"""Early stopping: the gradient no longer carries signal beyond its noise."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from cockpit_core.diagnosis import Diagnosis, DiagnosisConfig, Finding, Window
from cockpit_diagnoses._common import fmt
from cockpit_diagnoses.precedence import LOWER_LR, won_by


class EarlyStoppingConfig(DiagnosisConfig):
    """Options of :class:`EarlyStopping`."""

    window: int = Field(10, ge=1, description="Tracked steps the criterion is averaged over.")
    level: float = Field(0.0, description="The mean criterion above this says stop (paper: 0).")


class EarlyStopping(Diagnosis):
    """The evidence-based early-stopping criterion is positive for a window of steps.

    Mahsereci, Balles, Lassner & Hennig (2017), "Early stopping without a validation set",
    Eq. (7): ``1 - (B/D) sum_d g_d^2 / var_d > 0`` means the mini-batch gradient is
    indistinguishable from zero given its noise, so further steps fit noise. At a minimum
    the single-step criterion is positive about half of the time, so the rule averages it:
    reported (as ``info``) when the mean of ``early_stopping`` over ``window`` (10)
    consecutive tracked steps is above ``level`` (0); overlapping windows merge. Evidence:
    the largest window mean, the level.
    """

    name = "early_stopping"
    reads = ("early_stopping",)
    source = "Mahsereci et al. (2017), Early stopping without a validation set, Eq. (7)"
    Config = EarlyStoppingConfig
    config: EarlyStoppingConfig
    precedence = won_by(name)

    def check(self, window: Window) -> list[Finding]:
        """Return the stretches whose windowed mean criterion is positive."""
        cfg = self.config
        steps, value = window.finite_series("early_stopping", "total")
        w = cfg.window
        if len(value) < w:
            return []
        means = np.convolve(value, np.ones(w) / w, "valid")
        stretches: list[tuple[int, int, int, float]] = []  # first, last, end index, largest mean
        for i in np.nonzero(means > cfg.level)[0].tolist():
            if stretches and i <= stretches[-1][2] + 1:
                first, _, _, peak = stretches[-1]
                stretches[-1] = (first, int(steps[i + w - 1]), i + w - 1, max(peak, means[i]))
            else:
                stretches.append((int(steps[i]), int(steps[i + w - 1]), i + w - 1, means[i]))
        return [
            self.finding(
                "",
                "info",
                first,
                last,
                f"the early-stopping criterion averages above {fmt(cfg.level)} over {w} "
                f"tracked steps (up to {fmt(peak)}): the gradient is mostly noise",
                {"largest_mean_criterion": float(peak), "level": cfg.level, "window": w},
                "Training could stop here; check a validation loss, or decay the learning "
                "rate to go on.",
                LOWER_LR,
            )
            for first, last, _, peak in stretches
        ]
