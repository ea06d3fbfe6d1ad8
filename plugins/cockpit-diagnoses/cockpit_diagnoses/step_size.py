"""Step size: the normalized step alpha persistently overshoots (> 0) or barely moves (near -1)."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from cockpit_core.diagnosis import Diagnosis, Finding, Window, persistent_spans
from cockpit_diagnoses._common import PersistenceConfig, fmt
from cockpit_diagnoses.precedence import LOWER_LR, RAISE_LR, won_by


class StepSizeConfig(PersistenceConfig):
    """Options of :class:`StepSize`."""

    overshoot: float = Field(
        0.0, description="alpha above this overshoots the minimum of the fitted parabola."
    )
    undershoot: float = Field(
        -0.5,
        description="alpha below this covers less than half the way to the fitted minimum.",
    )


class StepSize(Diagnosis):
    """The learning rate is too large (alpha > 0) or too small (alpha near -1) for the loss.

    alpha (Mahsereci & Hennig 2017; the Cockpit paper, Schneider, Dangel & Hennig 2021,
    "Cockpit: A Practical Debugging Tool for the Training of Deep Neural Networks",
    NeurIPS) places each update on a noise-aware quadratic fit of the loss along it:
    ``alpha = -1`` is no progress, ``0`` the fitted minimum, ``1`` the point where the loss
    is back at its starting value. Reported when ``alpha > overshoot`` (default 0) at
    ``fraction`` (0.8) of ``window`` (10) consecutive tracked steps, or ``alpha <
    undershoot`` (default -0.5) likewise. Evidence: the median alpha of the stretch, the
    share of steps beyond the threshold, the threshold.
    """

    name = "step_size"
    reads = ("alpha",)
    source = "Schneider, Dangel & Hennig (2021), Cockpit, NeurIPS: the alpha instrument"
    Config = StepSizeConfig
    config: StepSizeConfig
    precedence = won_by(name)

    def check(self, window: Window) -> list[Finding]:
        """Return the overshooting and undershooting stretches of alpha."""
        cfg = self.config
        steps, alpha = window.finite_series("alpha", "alpha")
        found = []
        cases = (
            ("overshoot", alpha > cfg.overshoot, cfg.overshoot, "above"),
            ("undershoot", alpha < cfg.undershoot, cfg.undershoot, "below"),
        )
        for what, flags, threshold, side in cases:
            for first, last, count in persistent_spans(steps, flags, cfg.window, cfg.fraction):
                inside = (steps >= first) & (steps <= last)
                median = float(np.median(alpha[inside]))
                share = float(flags[inside].mean())
                if what == "overshoot":
                    message = (
                        f"steps overshoot the minimum along the update: alpha {side} "
                        f"{fmt(threshold)} at {count} tracked steps (median {fmt(median)})"
                    )
                    suggestion = "Lower the learning rate (e.g. by 2-10x) or add a decay."
                    advice = LOWER_LR
                else:
                    message = (
                        f"steps are too small: alpha {side} {fmt(threshold)} at {count} "
                        f"tracked steps (median {fmt(median)}; -1 means no progress)"
                    )
                    suggestion = "Raise the learning rate (e.g. by 2-10x)."
                    advice = RAISE_LR
                found.append(
                    self.finding(
                        what,
                        "warning",
                        first,
                        last,
                        message,
                        {
                            "median_alpha": median,
                            "share_beyond": share,
                            "threshold": threshold,
                            "steps_flagged": count,
                            "window": cfg.window,
                            "fraction": cfg.fraction,
                        },
                        suggestion,
                        advice,
                    )
                )
        return found
