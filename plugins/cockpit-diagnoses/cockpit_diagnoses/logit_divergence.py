"""Output-logit divergence: log Z of the output logits drifts far from 0."""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field

from cockpit_core.diagnosis import Diagnosis, Finding, Window
from cockpit_diagnoses._common import PersistenceConfig, fmt
from cockpit_diagnoses._units import reference_stretches
from cockpit_diagnoses.precedence import LEARNING_RATE, won_by

Z_LOSS = "z_loss"
"""The knob of an auxiliary z-loss (its coefficient), in :attr:`Finding.advice`."""

ADVICE = {Z_LOSS: "up", LEARNING_RATE: "down"}
"""Add a z-loss, or lower the learning rate."""


class LogitDivergenceConfig(PersistenceConfig):
    """Options of :class:`LogitDivergence`."""

    limit: float = Field(
        30.0,
        gt=0.0,
        description="Report a mean log Z farther than this from 0, in nats (logits near 30 "
        "are resolved to 0.125-0.25 in bfloat16) ...",
    )
    drift: float = Field(
        10.0,
        gt=0.0,
        description="... and this many nats farther from 0 than its early value (the median "
        "of the first `reference` tracked steps): a model whose log Z sat there from the "
        "start is not reported.",
    )
    reference: int = Field(
        5, ge=1, description="First tracked steps whose median is the early value."
    )
    start: int = Field(10, ge=0, description="Steps before this one are not judged.")


class LogitDivergence(Diagnosis):
    """The mean log Z of the output logits drifts ``drift`` nats away from 0, beyond ``limit``.

    Cross-entropy does not change when every logit of a position moves by the same amount,
    so nothing in the loss holds the log partition function ``log Z = log sum_c exp(z_c)``
    near 0. Wortsman et al. (2023, "Small-scale proxies for large-scale Transformer training
    instabilities", Sec. 3.1.2) reproduce in small models the output-logit divergence that
    PaLM (Chowdhery et al. 2022, Sec. 5) prevented with the auxiliary z-loss ``1e-4 log^2
    Z``: at high learning rates the logits drift far from the log probabilities (very
    negative) and the loss diverges. Reads ``logits`` (cockpit-activations); a tracked step
    is flagged when ``|log_z_mean| > limit`` (30) and ``|log_z_mean|`` exceeds the distance
    from 0 of its early value (the median of the first ``reference`` (5) tracked steps) by
    more than ``drift`` (10); reported when that holds at ``fraction`` (0.8) of ``window``
    (10) consecutive tracked steps from step ``start`` (10) on. One ``warning`` per
    stretch. Evidence: the early, median and farthest mean log Z of the stretch, the largest
    ``log_z_max`` and ``max_logit``, the median logged ``z_loss``.
    """

    name = "logit_divergence"
    reads = ("logits",)
    source = (
        "Wortsman et al. (2023), Small-scale proxies, Sec. 3.1.2; PaLM (Chowdhery et al. 2022): "
        "z-loss 1e-4 log^2 Z"
    )
    Config = LogitDivergenceConfig
    config: LogitDivergenceConfig
    precedence = won_by(name)

    def check(self, window: Window) -> list[Finding]:
        """Return one finding per stretch of a diverging log Z."""
        cfg = self.config

        def flag(values: np.ndarray, ref: float) -> np.ndarray:
            flagged: np.ndarray = (np.abs(values) > cfg.limit) & (
                np.abs(values) - abs(ref) > cfg.drift
            )
            return flagged

        stretches, judged = reference_stretches(
            {"log_z_mean": window.finite_series("logits", "log_z_mean")},
            cfg.reference,
            cfg.start,
            cfg.window,
            cfg.fraction,
            flag,
        )
        found = []
        for s in stretches:
            series = judged[s.unit]
            inside = series.values[s.inside]
            far = float(inside[np.argmax(np.abs(inside))])
            extra = {
                field: _largest(window, field, s.first_step, s.last_step, median=field == Z_LOSS)
                for field in ("log_z_max", "max_logit", Z_LOSS)
            }
            found.append(
                self.finding(
                    "",
                    "warning",
                    s.first_step,
                    s.last_step,
                    divergence_message(series.reference, far, extra["max_logit"]),
                    {
                        "early_log_z": series.reference,
                        "median_log_z": float(np.median(inside)),
                        "farthest_log_z": far,
                        **{k: v for k, v in extra.items() if math.isfinite(v)},
                        "limit": cfg.limit,
                        "drift": cfg.drift,
                        "steps_flagged": s.count,
                    },
                    "Add PaLM's z-loss, 1e-4 * (log Z)^2 averaged over the positions, to the "
                    "loss (the logits quantity's z_loss is its value); it pulls log Z back to "
                    "0 (Chowdhery et al. 2022; Wortsman et al. 2023). Or lower the learning "
                    "rate (of the output layer), or warm it up longer.",
                    ADVICE,
                )
            )
        return found


def divergence_message(early: float, far: float, max_logit: float) -> str:
    """``the mean log Z of the output logits is 45.2, 42.2 nats farther from 0 than ...``.

    States values rather than a change, so that a negative log Z follows no verb of change.
    """
    largest = f"; the largest logit is {fmt(max_logit)}" if math.isfinite(max_logit) else ""
    return (
        f"the mean log Z of the output logits is {fmt(far)}, {fmt(abs(far) - abs(early))} "
        f"nats farther from 0 than its early value {fmt(early)}{largest}: the logits "
        "diverge from the log probabilities"
    )


def _largest(window: Window, field: str, first: int, last: int, median: bool = False) -> float:
    """The largest (``median``: the median) finite ``logits`` ``field`` at ``first..last``."""
    steps, values = window.finite_series("logits", field)
    inside = values[(steps >= first) & (steps <= last)]
    if not len(inside):
        return math.nan
    return float(np.median(inside) if median else inside.max())
