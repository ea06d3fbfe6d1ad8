"""Update ratio out of range: a layer's updates are too large or too small a share of it."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field, model_validator

from cockpit_core.diagnosis import Diagnosis, DiagnosisConfig, Finding, Window, persistent_spans
from cockpit_diagnoses._common import fmt
from cockpit_diagnoses.precedence import LOWER_LR, RAISE_LR, won_by


class UpdateRatioRangeConfig(DiagnosisConfig):
    """Options of :class:`UpdateRatioRange`."""

    low: float = Field(
        1e-5,
        gt=0.0,
        description="Report a layer whose update ratio stays below this (it barely learns).",
    )
    high: float = Field(
        1e-1,
        gt=0.0,
        description="Report a layer whose update ratio stays above this (each step rewrites "
        "a tenth of it).",
    )
    min_steps: int = Field(
        5, ge=1, description="Consecutive tracked steps out of range before reporting."
    )
    start: int = Field(
        10,
        ge=0,
        description="Steps before this one are not judged: the first updates of freshly "
        "initialised weights are a large share of them.",
    )
    min_ndim: int = Field(
        2,
        ge=0,
        description="Judge parameters with at least this many dimensions (2: weight "
        "matrices; 0: all). Biases and norm gains start at 0 or 1, where the ratio says "
        "little; without shapes in the log header every parameter is judged.",
    )

    @model_validator(mode="after")
    def _low_below_high(self) -> UpdateRatioRangeConfig:
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        return self


HEALTHY = 1e-3
"""The update ratio practitioners aim at (Karpathy 2016, CS231n; 2022, makemore part 3)."""


class UpdateRatioRange(Diagnosis):
    """A layer's update ratio ``||theta_{s+1} - theta_s|| / ||theta_s||`` stays out of range.

    The update ratio says how much of a weight one step rewrites. The practice is to keep it
    near ``1e-3`` (Karpathy, CS231n notes "Neural Networks Part 3", section "ratio of
    weights:updates", 2016, a rough heuristic; "Building makemore Part 3", 2022, plots it per
    layer): much lower and the layer learns too slowly, much higher and each step overwrites
    what it learnt. Reported when a layer's ratio (``update_ratio``'s
    ``per_param``, cockpit-health) is above ``high`` (0.1, 100x the heuristic) or below
    ``low`` (1e-5, 1/100 of it) at ``min_steps`` (5) consecutive tracked steps from step
    ``start`` (10) on; the defaults are two orders of magnitude from the heuristic, so
    that only a learning rate far off for that layer is reported. Only parameters with
    ``min_ndim`` (2) or more dimensions are judged. One ``warning`` per layer and stretch.
    Evidence: the parameter, its median, smallest and largest ratio over the stretch, the
    bound.
    """

    name = "update_ratio_range"
    reads = ("update_ratio",)
    source = (
        "practice: update/weight ratio near 1e-3 (Karpathy, CS231n 2016; makemore part 3, 2022)"
    )
    Config = UpdateRatioRangeConfig
    config: UpdateRatioRangeConfig
    precedence = won_by(name)

    def check(self, window: Window) -> list[Finding]:
        """Return one finding per layer and stretch out of range."""
        cfg = self.config
        steps, ratios = window.per_param("update_ratio")
        if not ratios.size:
            return []
        names = window.param_names
        if len(names) != ratios.shape[1]:
            names = [f"parameter {k}" for k in range(ratios.shape[1])]
        judged = steps >= cfg.start
        steps, ratios = steps[judged], ratios[judged]
        found = []
        for k in _judged_params(window, ratios.shape[1], cfg.min_ndim):
            values = ratios[:, k]
            finite = np.isfinite(values)
            cases = (("high", finite & (values > cfg.high)), ("low", finite & (values < cfg.low)))
            for side, flags in cases:
                for first, last, count in persistent_spans(steps, flags, cfg.min_steps, 1.0):
                    inside = (steps >= first) & (steps <= last) & flags
                    found.append(self._finding(names[k], side, first, last, count, values[inside]))
        return found

    def _finding(
        self, name: str, side: str, first: int, last: int, count: int, values: np.ndarray
    ) -> Finding:
        cfg = self.config
        median = float(np.median(values))
        bound = cfg.high if side == "high" else cfg.low
        evidence: dict[str, Any] = {
            "parameter": name,
            "median_ratio": median,
            "min_ratio": float(values.min()),
            "max_ratio": float(values.max()),
            "bound": bound,
            "side": side,
            "steps_flagged": count,
            "min_steps": cfg.min_steps,
        }
        if side == "high":
            message = (
                f"the update ratio of {name} is above {fmt(bound)} at {count} consecutive "
                f"tracked steps (median {fmt(median)}): each step rewrites a large share of it"
            )
            suggestion = (
                f"Lower the learning rate of the param group of {name}: a ratio near "
                f"{fmt(HEALTHY)} is healthy, {fmt(median / HEALTHY)}x below this median; or "
                "clip its gradients."
            )
            advice = LOWER_LR
        else:
            still = float(values.max()) == 0.0
            message = (
                f"the update ratio of {name} is below {fmt(bound)} at {count} consecutive "
                f"tracked steps (median {fmt(median)}): "
                + ("it is not updated at all" if still else "it barely learns")
            )
            suggestion = (
                f"Check that {name} is in the optimizer and not frozen or weight-decayed to "
                "a standstill."
                if still
                else f"Raise the learning rate of the param group of {name}: a ratio near "
                f"{fmt(HEALTHY)} is healthy"
                + (f", {fmt(HEALTHY / median)}x above this median." if median > 0 else ".")
            )
            advice = {} if still else RAISE_LR
        return self.finding(
            f"{side}/{name}", "warning", first, last, message, evidence, suggestion, advice
        )


def _judged_params(window: Window, count: int, min_ndim: int) -> list[int]:
    """Indices of the parameters with ``min_ndim`` or more dimensions (all without shapes)."""
    params = window.header.get("params")
    if not isinstance(params, list) or len(params) != count:
        return list(range(count))
    judged = []
    for k, param in enumerate(params):
        shape = param.get("shape") if isinstance(param, dict) else None
        if not isinstance(shape, list) or len(shape) >= min_ndim:
            judged.append(k)
    return judged
