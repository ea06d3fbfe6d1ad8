"""Loss plateau: the training loss hardly decreases over a long window."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from cockpit_core.diagnosis import Diagnosis, DiagnosisConfig, Finding, Window
from cockpit_diagnoses._common import change_by, fmt
from cockpit_diagnoses.precedence import RAISE_LR


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
    config: LossPlateauConfig

    def check(self, window: Window) -> list[Finding]:
        """Return the merged stretches of flat windows."""
        cfg = self.config
        steps, loss = window.finite_series("loss")
        w = cfg.window
        # first, last, end index; the first window's trend start, end and relative decrease
        stretches: list[tuple[int, int, int, float, float, float]] = []
        if len(loss) < w:
            return []
        start, end = trend_ends(steps.astype(np.float64), loss, w)
        with np.errstate(divide="ignore", invalid="ignore"):
            drop = np.where(start != 0, (start - end) / np.abs(start), 0.0)
        for i in np.nonzero(drop < cfg.min_decrease)[0].tolist():
            if stretches and i <= stretches[-1][2] + 1:
                old = stretches[-1]
                stretches[-1] = (old[0], int(steps[i + w - 1]), i + w - 1, old[3], old[4], old[5])
            else:
                stretches.append(
                    (int(steps[i]), int(steps[i + w - 1]), i + w - 1, start[i], end[i], drop[i])
                )
        found = []
        for first, last, _, trend_start, trend_end, decrease in stretches:
            message, suggestion, advice = plateau_wording(float(trend_start), float(trend_end), w)
            evidence = {
                "trend_start": trend_start,
                "trend_end": trend_end,
                "relative_decrease": decrease,
                "min_decrease": cfg.min_decrease,
                "window": w,
            }
            found.append(
                self.finding("", "info", first, last, message, evidence, suggestion, advice)
            )
        return found


def plateau_wording(start: float, end: float, window: int) -> tuple[str, str, dict[str, str]]:
    """Message, suggestion and advice of a flat stretch whose trend goes from start to end.

    The verb follows the sign: ``the loss fell by only 3.7 %`` (advice: raise the learning
    rate, if the loss is still high), ``the loss rose by 0.56 %`` (no advice to raise it: a
    rising loss is a sign of too large a step, not of too small a one).
    """
    change = change_by(start, end)
    if end < start:
        change = change.replace("fell by", "fell by only")
    message = f"the loss {change} over {window} tracked steps (trend {fmt(start)} -> {fmt(end)})"
    if end < start:
        suggestion = (
            "If the loss is still high, raise the learning rate or change the schedule; "
            "if it is low, training may have converged (see early_stopping)."
        )
        return message, suggestion, RAISE_LR
    suggestion = (
        "The loss does not fall: do not raise the learning rate on this evidence; look for "
        "a too-large step (step_size, stability, exploding_gradients), a schedule that "
        "raised the learning rate, or layers that stopped learning (dead_layers)."
    )
    return message, suggestion, {}


def trend_ends(x: np.ndarray, y: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and end values of the least-squares line through each ``w`` consecutive points.

    Entry ``i`` belongs to the points ``i .. i + w - 1``. Each window is centred before the
    fit (slope ``sum(dx dy) / sum(dx^2)``), so large step numbers lose no precision.
    """
    xs = np.lib.stride_tricks.sliding_window_view(x, w)
    ys = np.lib.stride_tricks.sliding_window_view(y, w)
    x_mean, y_mean = xs.mean(axis=1), ys.mean(axis=1)
    dx = xs - x_mean[:, None]
    slope = (dx * (ys - y_mean[:, None])).sum(axis=1) / (dx * dx).sum(axis=1)
    return y_mean + slope * (xs[:, 0] - x_mean), y_mean + slope * (xs[:, -1] - x_mean)
