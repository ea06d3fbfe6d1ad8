"""GSNR collapse: the gradient's signal-to-noise ratio falls far below its early value."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from cockpit_core.diagnosis import Diagnosis, Finding, Window, persistent_spans
from cockpit_diagnoses._common import change_factor, fmt
from cockpit_diagnoses._relative import RelativeDropConfig, reference_value
from cockpit_diagnoses.precedence import GROW_BATCH, won_by


class GSNRCollapseConfig(RelativeDropConfig):
    """Options of :class:`GSNRCollapse`."""

    ratio: float = Field(
        0.1, gt=0.0, lt=1.0, description="Report a mean GSNR below this share of the reference."
    )


class GSNRCollapse(Diagnosis):
    """The mean gradient signal-to-noise ratio falls ``1/ratio`` x below its early value.

    ``mean_gsnr`` (cockpit-gradient-tests) averages ``GSNR_d = g_d^2 / var_d`` over the
    parameter entries (Liu et al. 2020, "Understanding why neural networks generalize well
    through GSNR of parameters", ICLR, Eq. 1). A tracked step is flagged when
    ``mean_gsnr < ratio * reference`` (``ratio`` 0.1), the reference being the median of
    the first ``reference`` (5) tracked steps; reported when that holds at ``fraction``
    (0.8) of ``window`` (10) consecutive tracked steps. The mini-batch gradient is then
    mostly noise: expected near a minimum (severity ``info``), a problem when the loss is
    still high. Evidence: the reference, the median of the stretch and their ratio.
    """

    name = "gsnr_collapse"
    reads = ("mean_gsnr",)
    source = "Liu et al. (2020), GSNR, ICLR; rule: mean GSNR < ratio x its early median"
    Config = GSNRCollapseConfig
    config: GSNRCollapseConfig
    precedence = won_by(name)

    def check(self, window: Window) -> list[Finding]:
        """Return the stretches of collapsed mean GSNR."""
        cfg = self.config
        steps, gsnr = window.finite_series("mean_gsnr", "total")
        ref = reference_value(gsnr, cfg.reference)
        if len(gsnr) <= cfg.reference or not ref > 0:
            return []
        flags = gsnr < cfg.ratio * ref
        flags[: cfg.reference] = False
        found = []
        for first, last, count in persistent_spans(steps, flags, cfg.window, cfg.fraction):
            inside = (steps >= first) & (steps <= last)
            median = float(np.median(gsnr[inside]))
            found.append(
                self.finding(
                    "",
                    "info",
                    first,
                    last,
                    gsnr_message(ref, median),
                    {
                        "reference": ref,
                        "median_gsnr": median,
                        "relative": median / ref,
                        "ratio": cfg.ratio,
                        "steps_flagged": count,
                    },
                    "If the loss is still high, grow the batch or lower the learning rate; "
                    "near a minimum this is expected (see early_stopping).",
                    GROW_BATCH,
                )
            )
        return found


def gsnr_message(reference: float, median: float) -> str:
    """``the mean GSNR fell to 0.05x its early value (0.01 from 0.2): ...``.

    The verb follows the direction of the change (``rose to 2x`` if it grew).
    """
    return (
        f"the mean GSNR {change_factor(reference, median)} its early value "
        f"({fmt(median)} from {fmt(reference)}): the mini-batch gradient is mostly noise"
    )
