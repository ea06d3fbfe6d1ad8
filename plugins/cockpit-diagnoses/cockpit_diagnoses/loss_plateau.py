"""Loss plateau: the training loss hardly decreases over a long window."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from cockpit_core.diagnosis import Diagnosis, DiagnosisConfig, Finding, Window
from cockpit_diagnoses._common import fmt


class LossPlateauConfig(DiagnosisConfig):
    """Options of :class:`LossPlateau`."""

    window: int = Field(50, ge=3, description="Tracked steps of the least-squares line.")
    min_decrease: float = Field(
        0.05,
        gt=0.0,
        description="Report when the line falls by less than this share of its start value.",
    )


class LossPlateau(Diagnosis):
    """The mini-batch loss, smoothed by a line over ``window`` (50) tracked steps, stalls.

    A least-squares line through the loss of ``window`` consecutive tracked steps averages
    out mini-batch noise (its end-to-end change has a standard deviation of about
    ``sigma sqrt(12 / window)`` for loss noise ``sigma``). Reported (as ``info``: a plateau
    is also what convergence looks like; read it with ``step_size`` and
    ``early_stopping``) when the line falls by less than ``min_decrease`` (5 %) of its value
    at the window's start. Evidence: the line's start and end values, the relative decrease.
    """

    name = "loss_plateau"
    reads = ("loss",)
    source = "rule: least-squares trend of the loss over a window"
    Config = LossPlateauConfig

    def check(self, window: Window) -> list[Finding]:
        """Return the merged stretches of flat windows."""
        cfg = self.config
        steps, loss = window.finite_series("loss")
        w = cfg.window
        stretches: list[list] = []
        for i in range(len(loss) - w + 1):
            x, y = steps[i : i + w].astype(np.float64), loss[i : i + w]
            slope, intercept = np.polyfit(x, y, 1)
            start, end = slope * x[0] + intercept, slope * x[-1] + intercept
            drop = (start - end) / abs(start) if start else 0.0
            if drop >= cfg.min_decrease:
                continue
            if stretches and i <= stretches[-1][2] + 1:
                stretches[-1][1:3] = [int(steps[i + w - 1]), i + w - 1]
            else:
                stretches.append(
                    [int(steps[i]), int(steps[i + w - 1]), i + w - 1, start, end, drop]
                )
        return [
            self.finding(
                "",
                "info",
                first,
                last,
                f"the loss fell by only {fmt(100 * drop)} % over {w} tracked steps "
                f"(trend {fmt(start)} -> {fmt(end)})",
                {
                    "trend_start": start,
                    "trend_end": end,
                    "relative_decrease": drop,
                    "min_decrease": cfg.min_decrease,
                    "window": w,
                },
                "If the loss is still high, raise the learning rate or change the schedule; "
                "if it is low, training may have converged (see early_stopping).",
            )
            for first, last, _, start, end, drop in stretches
        ]
