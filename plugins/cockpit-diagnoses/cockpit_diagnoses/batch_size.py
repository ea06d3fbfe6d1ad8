"""Batch size: the gradient tests fail persistently, so the mini-batch gradient is too noisy."""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field

from cockpit_core.diagnosis import Diagnosis, Finding, Window, persistent_spans
from cockpit_diagnoses._common import PersistenceConfig, fmt, relation
from cockpit_diagnoses.precedence import GROW_BATCH, won_by

TESTS = {
    "norm_test": ("theta", "Byrd, Chin, Nocedal & Wu (2012), norm test, Eq. (3.9)"),
    "inner_test": ("theta", "Bollapragada, Byrd & Nocedal (2018), inner product test"),
    "ortho_test": ("nu", "Bollapragada, Byrd & Nocedal (2018), orthogonality test"),
}


class BatchSizeConfig(PersistenceConfig):
    """Options of :class:`BatchSize`."""

    norm_theta: float = Field(
        0.8, gt=0.0, description="theta of the norm test (Byrd et al. 2012: in (0, 1))."
    )
    inner_theta: float = Field(
        0.9, gt=0.0, description="theta of the inner product test (Bollapragada et al. 2018)."
    )
    ortho_nu: float = Field(
        5.84,
        gt=0.0,
        description="nu of the orthogonality test (Bollapragada et al. 2018: tan 80 deg).",
    )


class BatchSize(Diagnosis):
    """The batch is too small for the gradient's noise: a gradient test fails persistently.

    Each test reports the largest parameter that passes (``theta_max``, ``nu_max``); it fails
    when that exceeds the chosen ``theta`` / ``nu``. Byrd et al. (2012, "Sample size selection
    in optimization methods for machine learning", Math. Prog.) and Bollapragada et al.
    (2018, "Adaptive sampling strategies for stochastic optimization", SIAM J. Optim.) raise
    the batch to ``B' = B (theta_max / theta)^2``, the size at which the test would pass
    (the variance term scales as 1/B). Reported per test when it fails at ``fraction``
    (0.8) of ``window`` (10) consecutive tracked steps. Evidence: the median ``theta_max``
    of the stretch, the threshold, the factor ``(theta_max / theta)^2`` by which to grow the
    batch, and CABS' suggested batch size when ``cabs`` was tracked (Balles, Romero &
    Hennig 2017).
    """

    name = "batch_size"
    reads = tuple(TESTS)
    source = "Byrd et al. (2012); Bollapragada et al. (2018): adaptive sampling tests"
    Config = BatchSizeConfig
    config: BatchSizeConfig
    precedence = won_by(name)

    def check(self, window: Window) -> list[Finding]:
        """Return, per gradient test, the stretches where it fails."""
        cfg = self.config
        limits = {"norm_test": cfg.norm_theta, "inner_test": cfg.inner_theta}
        limits["ortho_test"] = cfg.ortho_nu
        found = []
        for test, (symbol, paper) in TESTS.items():
            steps, value = window.finite_series(test, "total")
            limit = limits[test]
            flags = value > limit
            for first, last, count in persistent_spans(steps, flags, cfg.window, cfg.fraction):
                inside = (steps >= first) & (steps <= last)
                median = float(np.median(value[inside]))
                factor = max(1.0, (median / limit) ** 2)
                evidence = {
                    f"median_{symbol}_max": median,
                    symbol: limit,
                    "batch_factor": factor,
                    "steps_flagged": count,
                    "window": cfg.window,
                }
                cabs = _median_in(window, "cabs", first, last)
                if math.isfinite(cabs):
                    evidence["cabs_batch_size"] = cabs
                found.append(
                    self.finding(
                        test,
                        "warning",
                        first,
                        last,
                        failing_message(test, symbol, count, median, limit),
                        evidence,
                        f"Grow the batch about {fmt(math.ceil(factor * 10) / 10)}x (B "
                        f"({symbol}_max/{symbol})^2, {paper}), or lower the learning rate.",
                        GROW_BATCH,
                    )
                )
        return found


def failing_message(test: str, symbol: str, count: int, median: float, limit: float) -> str:
    """``the norm test fails at 9 tracked steps (median theta_max 1.2 > theta = 0.8): ...``.

    The comparison follows the numbers: a stretch's median may lie below the threshold when
    ``fraction`` is below one half.
    """
    return (
        f"the {test.replace('_', ' ')} fails at {count} tracked steps (median {symbol}_max "
        f"{fmt(median)} {relation(median, limit)} {symbol} = {fmt(limit)}): the mini-batch "
        "gradient is too noisy"
    )


def _median_in(window: Window, key: str, first: int, last: int) -> float:
    steps, value = window.series(key, "total")
    inside = (steps >= first) & (steps <= last) & np.isfinite(value)
    return float(np.median(value[inside])) if inside.any() else math.nan
